# Two entry points for a fresh clone: `make demo` and `make test`. Both create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.talk_hf-installed
SOURCES := setup.py pyproject.toml $(wildcard csrc/*.h csrc/*.cpp csrc/cpu/* csrc/cuda/*)

# The oldest transformers release talk_hf supports (talk_hf/versions.py), installed beside the venv's newest one;
# the tests that run the models through transformers (forward, generate, pipelines, Trainer, Hub) run on both.
TRANSFORMERS_OLDEST := $(shell sed -n 's/^OLDEST = "\(.*\)"$$/\1/p' talk_hf/versions.py)
OLDEST := $(VENV)/transformers-$(TRANSFORMERS_OLDEST)
TRANSFORMERS_TESTS := tests/models tests/test_versions.py tests/test_hub_models.py tests/training/test_loop.py \
	tests/training/test_scripts.py::test_reported_bleu_is_what_the_saved_model_gives

# fairseq, the oracle the checkpoint converter is tested against (tests/convert), built from source against the
# venv's torch into a --target folder beside the venv: its pins (hydra-core, omegaconf) and pytest plugin stay out of
# the venv, and --no-deps keeps pip from resolving a second torch; the tests put the folder on sys.path.
FAIRSEQ := $(VENV)/fairseq-0.12.3.1
FAIRSEQ_PACKAGES := fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
	bitarray scikit-learn scipy threadpoolctl narwhals

.PHONY: install test test-oldest demo cuda-check

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[train,dev]"
	touch $@

$(FAIRSEQ)/.installed: $(STAMP)
	$(BIN)/python -m pip install -q cython
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation --upgrade --target $(FAIRSEQ) $(FAIRSEQ_PACKAGES)
	touch $@

install: $(STAMP) $(FAIRSEQ)/.installed

test: install test-oldest
	$(BIN)/python -m pytest -q

$(OLDEST): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $@ transformers==$(TRANSFORMERS_OLDEST)

test-oldest: $(OLDEST)
	PYTHONPATH=$(OLDEST) $(BIN)/python -m pytest -q $(TRANSFORMERS_TESTS)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# Compile the CUDA kernels for sm_80 and sm_90 without a GPU (also run by the test suite when nvcc exists).
cuda-check:
	$(BIN)/python -m pytest -q tests/test_cuda_sources.py
