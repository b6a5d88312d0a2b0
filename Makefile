# headway: the two set-up commands are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint pytest bench services clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/headway demo

services:
	bash tests/setup/services.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

# Test files run in parallel, each file on one worker (the live Slurm cluster and the browser are
# session fixtures of their own files); at most 4 workers, as many as the CPUs allow.
pytest: $(STAMP) services
	$(BIN)/pytest -q -n auto --maxprocesses 4 --dist loadfile

test: lint pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info headway.duckdb headway-demo.duckdb headway-report.html
