# Two entry points for a fresh clone: `make demo` and `make test`. Both create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.talk_hf-installed
SOURCES := setup.py setup.cfg $(wildcard csrc/*.h csrc/*.cpp csrc/cpu/* csrc/cuda/*)

.PHONY: install test demo cuda-check

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[train,dev]"
	touch $@

install: $(STAMP)

test: install
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/python scripts/demo.py

# Compile the CUDA kernels for sm_80 and sm_90 without a GPU (also run by the test suite when nvcc exists).
cuda-check:
	$(BIN)/python -m pytest -q tests/test_cuda_sources.py
