# SGME L0 — everything sets itself up: a .venv with the project installed in it.
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3.13 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install hermes-env browser wrk ui-test run test lint unit integration bench chaos clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# setuptools tells every editable install of a flat layout to "be careful with folders
	@# named like the package": true of any checkout, and it made installs look broken
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e '.[dev,bench,embed]'
	@touch $@

install: $(STAMP)

## make hermes-env: .venv-hermes with the real hermes-agent (the provider's and the state.db
## importer's tests run it); rebuilt only when its requirements change. Hermes pins its own
## dependencies, so it gets a virtualenv of its own and nothing leaks into .venv.
HERMES_PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3.13)
HERMES_VENV ?= .venv-hermes
HERMES_REQUIREMENTS := integrations/hermes/requirements-test.txt
HERMES_STAMP := $(HERMES_VENV)/.installed

$(HERMES_STAMP): $(HERMES_REQUIREMENTS)
	@test -n "$(HERMES_PYTHON)" || { echo "hermes-agent needs Python 3.11-3.13"; exit 1; }
	rm -rf $(HERMES_VENV)
	$(HERMES_PYTHON) -m venv $(HERMES_VENV)
	$(HERMES_VENV)/bin/pip install --quiet --upgrade pip
	$(HERMES_VENV)/bin/pip install --quiet -r $(HERMES_REQUIREMENTS)
	@touch $@

hermes-env: $(HERMES_STAMP)

## make browser: Debian's headless Chromium for the web view's browser tests (Playwright drives
## /usr/bin/chromium; no browser is downloaded). Needs root (apt-get).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

## make wrk: Debian's wrk, the C load generator bench/bench_http.py --wrk drives the servers
## with (so that the load generator is not the bottleneck). Needs root (apt-get).
wrk:
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }

## make ui-test: the web view in the browser; screenshots go to $(SCREENSHOTS)
SCREENSHOTS ?= screenshots
ui-test: $(STAMP) browser
	SGME_UI_SCREENSHOTS=$(abspath $(SCREENSHOTS)) $(BIN)/pytest -q tests/e2e/test_ui_browser.py

## make run: the embedded service (SQLite + ./data + in-process flusher) on 127.0.0.1:8765
run: $(STAMP)
	$(BIN)/sgme migrate
	$(BIN)/sgme serve

## make test: lint, type-check and the whole test suite
## Two workers (this machine has two cores): the long end-to-end tests mostly wait (a minute
## of quiet before refinement, a 30 s broker outage), so they overlap well.
PYTEST_WORKERS ?= 2
test: $(STAMP) $(HERMES_STAMP) lint
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check pipeline workers tests bench integrations
	$(BIN)/ruff format --check pipeline workers tests bench integrations
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

## make bench: every benchmark (about an hour here); results in docs/benchmarks.md
bench: $(STAMP) $(HERMES_STAMP) wrk
	$(BIN)/python bench/bench_peers.py --stages
	$(BIN)/python bench/bench_wake.py
	$(BIN)/python bench/bench_http.py --wrk
	$(BIN)/python bench/bench_append.py
	$(BIN)/python bench/bench_refine.py
	$(BIN)/python bench/bench_serve.py
	$(BIN)/python bench/bench_serve.py --only production
	$(BIN)/python bench/bench_groups.py
	$(BIN)/python bench/bench_parse.py
	$(BIN)/python bench/bench_archive.py
	$(BIN)/python bench/bench_reindex.py
	$(BIN)/python bench/bench_search.py
	$(BIN)/python bench/bench_secrets.py
	$(BIN)/python bench/bench_cli.py

## make chaos: the crash test with many more kill points (a new seed each run) and the
## broker-wipe / worker-kill runs repeated; needs PostgreSQL and Redis like the suite.
CHAOS_ROUNDS ?= 3
chaos: $(STAMP)
	SGME_CHAOS_CYCLES=60 SGME_CHAOS_SEED=$$(date +%s) CI=true $(BIN)/pytest -q tests/integration/test_crash.py
	for i in $$(seq $(CHAOS_ROUNDS)); do CI=true $(BIN)/pytest -q tests/e2e/test_chaos.py || exit 1; done

clean:
	rm -rf $(VENV) $(HERMES_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
