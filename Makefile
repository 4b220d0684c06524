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
# working (a silent first `make demo` looks stuck).
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
# time. The process-heavy fault tests share one group (tests/xdist_groups.py). PYTEST_WORKERS=0
# runs everything in this process.
PYTEST_WORKERS ?= 2

test: lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

# Ports: `make demo PORT=8010 TEMPORAL_PORT=7300 UI_PORT=8300` (API, Temporal frontend,
# Temporal Web UI); each left out is its default (8000, 7233, 8233) or a free one. The
# demo exits non-zero when any step fails.
demo: $(STAMP)
	$(BIN)/baton demo$(if $(PORT), --port $(PORT))$(if $(TEMPORAL_PORT), --temporal-port $(TEMPORAL_PORT))$(if $(UI_PORT), --ui-port $(UI_PORT))

# The docs site into site/: first the generated pages (settings, CLI and API reference,
# see docs/gen.py), then mkdocs with the Material theme; --strict fails on any warning.
# Offline: no plugin fetches anything (mkdocs.yml). NO_MKDOCS_2_WARNING silences
# Material's banner about a future MkDocs, which is not about this build.
docs: $(STAMP)
	$(BIN)/python -m docs.gen
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .baton .pytest_cache .mypy_cache .ruff_cache .import_linter_cache site
