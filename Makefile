# posbench: `make help` lists the targets.
PYTHON ?= python3
comma := ,
space := $() $()
# every encoding with a config in conf/encoding, comma-separated for a sweep
ENCODINGS ?= $(subst $(space),$(comma),$(sort $(basename $(notdir $(wildcard conf/encoding/*.yaml)))))
# empty: the WikiText-2 slice shipped with posbench (the quick preset's data=wikitext2_mini)
DATA ?=
SWEEP_DIR ?= outputs/quick

.PHONY: help install quick test test-fast lint format

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install: ## install posbench editable (CPU torch 2.13.0 first where no torch is present)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e '.[test]'

quick: ## sweep ENCODINGS (all) with experiment=quick on the shipped slice (DATA=DIR: a folder), then report
	$(PYTHON) -m posbench -m train encoding=$(ENCODINGS) experiment=quick $(if $(DATA),data.path=$(DATA)) \
		hydra.sweep.dir=$(SWEEP_DIR)
	$(PYTHON) -m posbench report $(SWEEP_DIR)

test: ## the whole test suite, slow end-to-end tests included (what CI runs)
	$(PYTHON) -m pytest -q

test-fast: ## the fast tests only
	$(PYTHON) -m pytest -q -m "not slow"

lint: ## ruff: lint and format check (CI runs it before the tests)
	$(PYTHON) -m ruff check src tests scripts
	$(PYTHON) -m ruff format --check src tests scripts

format: ## ruff: fix what it can and format
	$(PYTHON) -m ruff check --fix src tests scripts
	$(PYTHON) -m ruff format src tests scripts
