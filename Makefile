# posbench: `make help` lists the targets.
# PYTHON makes the virtual environment VENV; inside an active virtual environment it is used as it is.
PYTHON ?= python3
VENV ?= .venv
# "venv" when a virtual environment is active (VIRTUAL_ENV set, or PYTHON runs inside one)
ACTIVE := $(if $(VIRTUAL_ENV),venv,$(shell $(PYTHON) -c 'import sys; print("venv" if sys.prefix != sys.base_prefix else "")' 2>/dev/null))
ifeq ($(ACTIVE),venv)
INSTALL_PY := $(PYTHON)
PY = $(PYTHON)
else
# no active environment (a distribution's externally managed python3, PEP 668): install into VENV, and
# every target runs VENV's python once it exists (looked up when the target runs, so `make install quick` works)
INSTALL_PY := $(VENV)/bin/python
PY = $(shell test -x $(VENV)/bin/python && echo $(VENV)/bin/python || echo $(PYTHON))
endif
comma := ,
space := $() $()
# every encoding with a config in conf/encoding, comma-separated for a sweep
ENCODINGS ?= $(subst $(space),$(comma),$(sort $(basename $(notdir $(wildcard conf/encoding/*.yaml)))))
# empty: the WikiText-2 slice shipped with posbench (the quick preset's data=wikitext2_mini)
DATA ?=
SWEEP_DIR ?= outputs/quick
# more pip options for make install (e.g. PIP_ARGS=--dry-run)
PIP_ARGS ?=

.PHONY: help install quick test test-fast lint format

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: ## make .venv (unless a virtual environment is active) and install posbench editable into it, CPU torch first
ifneq ($(ACTIVE),venv)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV) || { echo "make install: '$(PYTHON) -m venv $(VENV)' failed;\
	 on Debian or Ubuntu: sudo apt install python3-venv, then make install again" >&2; rm -rf $(VENV); exit 1; }
endif
	$(INSTALL_PY) -c "import torch" 2>/dev/null || $(INSTALL_PY) -m pip install $(PIP_ARGS) torch==2.13.0
	$(INSTALL_PY) -m pip install $(PIP_ARGS) -e '.[test]'

quick: ## sweep ENCODINGS (all) with experiment=quick on the shipped slice (DATA=DIR: a folder), then report
	$(PY) -m posbench -m train encoding=$(ENCODINGS) experiment=quick $(if $(DATA),data.path=$(DATA)) \
		hydra.sweep.dir=$(SWEEP_DIR)
	$(PY) -m posbench report $(SWEEP_DIR)

# one pytest worker per core (pytest-xdist), each with one torch thread: the cores are not oversubscribed
TEST_ENV := OMP_NUM_THREADS=1

test: ## the whole test suite, slow end-to-end tests included, a worker per core (what CI runs)
	$(TEST_ENV) $(PY) -m pytest -q -n auto

test-fast: ## the fast tests only
	$(TEST_ENV) $(PY) -m pytest -q -n auto -m "not slow"

lint: ## ruff: lint and format check (CI runs it before the tests)
	$(PY) -m ruff check src tests scripts
	$(PY) -m ruff format --check src tests scripts

format: ## ruff: fix what it can and format
	$(PY) -m ruff check --fix src tests scripts
	$(PY) -m ruff format src tests scripts
