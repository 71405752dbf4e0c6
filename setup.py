"""Builds the talk_hf._C extension; everything else is declared in pyproject.toml.

    pip install --no-build-isolation -e .     # CPU kernels; CUDA kernels too when torch has CUDA and nvcc exists
    TALK_HF_SKIP_CUDA_BUILD=1  ...            # CPU kernels only
    TALK_HF_SKIP_BUILD=1       ...            # no extension: the pure-PyTorch reference ops are used
    TALK_HF_CUDA_ARCHS="80;90" ...            # CUDA architectures (default: 80 and 90)
"""

import glob
import os

from setuptools import setup


def _flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def extension_build():
    if _flag("TALK_HF_SKIP_BUILD"):
        return {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
    except ImportError as err:
        raise RuntimeError(
            "building talk_hf._C needs torch at build time, and pip's build isolation hides the installed one: "
            "install torch first, then install talk_hf with `pip install --no-build-isolation` (or set "
            "TALK_HF_SKIP_BUILD=1 for the pure-PyTorch ops)"
        ) from err
    sources = ["csrc/talk_hf.cpp", *sorted(glob.glob("csrc/cpu/*.cpp"))]
    cxx = ["-O3", "-fopenmp"]  # torch adds its own -std (C++20 for torch 2.13)
    with_cuda = torch.version.cuda is not None and CUDA_HOME is not None and not _flag("TALK_HF_SKIP_CUDA_BUILD")
    if not with_cuda:
        ext = CppExtension("talk_hf._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])
        return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}
    archs = os.environ.get("TALK_HF_CUDA_ARCHS", "80;90").split(";")
    nvcc = ["-O3", "-lineinfo"]
    nvcc += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    sources += ["csrc/cuda/bindings.cpp", *sorted(glob.glob("csrc/cuda/*.cu"))]
    ext = CUDAExtension(
        "talk_hf._C", sources, extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=["-fopenmp"]
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildExtension}}


setup(**extension_build())
