import pytest

from tests.ops.emulator import CXX, build


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    """The CUDA kernels' programs compiled for the CPU (tests/ops/cuda_tile_emulator.cpp), built once."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    return build(tmp_path_factory.mktemp("emulator"))
