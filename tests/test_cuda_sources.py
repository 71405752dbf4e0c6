"""The CUDA sources build without a GPU: kernels with nvcc for sm_80 and sm_90, the torch bindings with the host
compiler against torch's headers. (Running them needs a GPU; see docs/development.md, "GPU status".)"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

ROOT = Path(__file__).resolve().parents[1]


def find_toolkit():
    """$CUDA_HOME, else /usr/local/cuda (torch's own lookup is disabled in CPU builds of torch)."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "bin" / "nvcc").exists():
            return Path(candidate)
    return None


TOOLKIT = find_toolkit()
NVCC = TOOLKIT / "bin" / "nvcc" if TOOLKIT else None
needs_nvcc = pytest.mark.skipif(NVCC is None or not NVCC.exists(), reason="nvcc (CUDA toolkit) not installed")


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout}\n{result.stderr}"
    return result


@needs_nvcc
@pytest.mark.parametrize("source", sorted(p.name for p in (ROOT / "csrc" / "cuda").glob("*.cu")))
def test_kernels_compile_for_sm80_and_sm90(source, tmp_path):
    run([
        str(NVCC), "-std=c++20", "-O3", "-Werror", "all-warnings", "-Xcompiler", "-Wall",
        "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
        "-c", str(ROOT / "csrc" / "cuda" / source), "-o", str(tmp_path / "kernel.o"),
    ])
    assert (tmp_path / "kernel.o").stat().st_size > 0


@needs_nvcc
def test_cuda_bindings_compile_against_torch_headers(tmp_path):
    # The CPU torch wheel ships the c10/cuda headers but not this generated one.
    stub = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stub.parent.mkdir(parents=True)
    stub.write_text("#define C10_CUDA_BUILD_SHARED_LIBS\n")
    cuda_include = TOOLKIT / "include"
    includes = [f"-I{p}" for p in (*include_paths(), tmp_path, sysconfig.get_paths()["include"], cuda_include)]
    cxx = shutil.which("c++") or shutil.which("g++")
    run([cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Werror", *includes,
         str(ROOT / "csrc" / "cuda" / "bindings.cpp")])


def test_compiled_backend_is_active_on_cpu():
    """`make test` builds the extension: the CPU kernels must be what the ops use, not the fallback."""
    from talk_hf import ops

    assert "cpu" in ops.compiled_devices()
    assert ops.backend("cpu") == "compiled"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
