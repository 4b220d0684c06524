# `make test` and `make demo` bootstrap .venv on a fresh machine; re-running
# them reinstalls only when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.baton-installed

.PHONY: test demo docs lint typecheck install clean

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Not --quiet: the first install takes a minute or two, and pip's progress shows it is
# working (issue 12, item 7: the newcomer's first `make demo` looked stuck).
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "Installing Baton and its dependencies into $(VENV)/ (first run: a minute or two) ..."
	$(BIN)/python -m pip install --progress-bar on -e '.[dev]'
	touch $@

# lint-imports: the import contracts in pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite runs in PYTEST_WORKERS xdist processes: most of a test's time is spent waiting on
# Temporal, timers and child processes, so two processes on two cores roughly halve the wall
# time. The process-heavy fault tests share one group (tests/conftest.py). PYTEST_WORKERS=0
# runs everything in this process.
PYTEST_WORKERS ?= 2

test: lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

demo: $(STAMP)
	$(BIN)/baton demo

# The docs site into site/: first the generated pages (settings, CLI and API reference,
# see docs/gen.py), then mkdocs with the Material theme; --strict fails on any warning.
# Offline: no plugin fetches anything (mkdocs.yml). NO_MKDOCS_2_WARNING silences
# Material's banner about a future MkDocs, which is not about this build.
docs: $(STAMP)
	$(BIN)/python -m docs.gen
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .baton .pytest_cache .mypy_cache .ruff_cache .import_linter_cache site
