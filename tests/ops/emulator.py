"""Building and calling tests/ops/cuda_tile_emulator.cpp (the CUDA kernels' programs, run on the CPU) through ctypes;
the `emulator` fixture (tests/ops/conftest.py) builds it once per test session."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("c++") or shutil.which("g++")

SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}
CTYPE = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double, torch.bfloat16: ctypes.c_uint16}


def build(directory):
    """Compile the emulator into `directory` with the host compiler alone (no torch, no CUDA) -> the loaded library."""
    lib = Path(directory) / "cuda_tile_emulator.so"
    source = ROOT / "tests" / "ops" / "cuda_tile_emulator.cpp"
    cmd = [CXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", f"-I{ROOT / 'csrc'}", str(source),
           "-o", str(lib)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return ctypes.CDLL(str(lib))


def ptr(t):
    """A tensor's data as the emulator's pointer type, or None."""
    return None if t is None else ctypes.cast(t.data_ptr(), ctypes.POINTER(CTYPE[t.dtype]))
