# Vendored transformers test helpers (see README.md): nothing here is a test module of its own. The ModelTesterMixin
# tests run through tests/models/test_transformers_common.py, which skips itself on other transformers releases.
collect_ignore_glob = ["*.py"]
