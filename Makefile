# Two commands: `make run` (set up, start the all-in-one gateway with the echo agent) and
# `make test` (set up, install the system test peers where possible, run the whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run test lint peers bench compiled clean

setup: $(STAMP)

# The gateway with its test and plot extras, and the benchmarks beside it (bench/, their own distribution).
$(STAMP): pyproject.toml bench/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,plot]' -e './bench[records]'
	mkdir -p $(VENV)/typeshim && ln -sfn $(CURDIR)/codecs $(VENV)/typeshim/telcodecs
	touch $(STAMP)

run: setup
	$(BIN)/gateway run

peers:
	bash deploy/install-peers.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python deploy/check_commit_subjects.py   # subjects since the rule: 'Area: summary', <= 72

# The suite in two tiers (tests/run_suite.py): most tests over two processes, then peers and load tests alone.
test: setup peers lint
	$(BIN)/python -m tests.run_suite

bench: setup
	$(BIN)/gateway bench codecs

# The media plane's hot modules compiled with mypyc (ADR 0008); run with GATEWAY_COMPILED=build/compiled.
compiled: setup
	$(BIN)/gateway compile --out build/compiled

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
