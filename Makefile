# `make test` and `make demo` bootstrap .venv on a fresh machine; re-running
# them reinstalls only when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.baton-installed

.PHONY: test demo lint typecheck install clean

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

demo: $(STAMP)
	$(BIN)/baton demo

clean:
	rm -rf $(VENV) .baton .pytest_cache .mypy_cache .ruff_cache
