# STUB written for talk_hf -- NOT the upstream file (see ../README.md).
#
# Upstream `tests/test_modeling_common.py` does `from .generation.test_utils import GenerationTesterMixin` (for
# `test_generation_tester_mixin_inheritance`). transformers' PyPI sdist ships only the top-level `tests/*.py` files,
# not `tests/generation/`, so the upstream generation tests cannot be vendored from it: this empty mixin keeps
# `test_modeling_common.py` importable unmodified, and NO upstream `generate()` tests run. talk_hf's own generation
# checks (tests/models/test_modeling_common.py, test_compiled_generation.py) cover cached vs uncached decoding,
# beam reordering, padding and static-cache compilation.


class GenerationTesterMixin:
    """Empty stand-in for transformers' `tests/generation/test_utils.py::GenerationTesterMixin` (not in the sdist)."""
