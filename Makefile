# headway: the two set-up commands are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint pytest pytest-native native bench services clean FORCE

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The compiled build (setup.py): the wheel a user's `pip install .` gets, unpacked where PYTHONPATH can
# put it ahead of the editable install. Rebuilt when a source or data file changes, or one is added or
# removed (build/native-sources, rewritten only when the list changes). setuptools copies the package into
# build/lib* and never removes what is no longer in src/: those go first, or a deleted module would
# still ship in the wheel (and the compiled-build tests would import it).
NATIVE := build/native
NATIVE_STAMP := $(NATIVE)/.built
NATIVE_SRC := $(sort $(wildcard src/headway/*.py src/headway/*/*.py src/headway/data/*))
build/native-sources: FORCE
	@mkdir -p build
	@echo '$(NATIVE_SRC)' | cmp -s - $@ || echo '$(NATIVE_SRC)' > $@
FORCE:
$(NATIVE_STAMP): $(STAMP) setup.py pyproject.toml $(NATIVE_SRC) build/native-sources
	rm -rf $(NATIVE) build/native-wheel build/lib build/lib.* build/bdist.*
	$(BIN)/pip wheel --no-deps -q -w build/native-wheel .
	$(BIN)/python -m zipfile -e build/native-wheel/headway-*.whl $(NATIVE)
	touch $(NATIVE_STAMP)

native: $(NATIVE_STAMP)

# The tests of the compiled modules and of the code that drives them, run on the compiled build.
NATIVE_TESTS := tests/test_native_build.py tests/test_engine.py tests/test_engine_equivalence.py \
	tests/test_engine_fastpath.py tests/test_engine_helpers.py tests/test_placement.py \
	tests/test_placement_index.py tests/test_placement_topology.py tests/test_placement_alibaba.py \
	tests/test_policy.py tests/test_policy_reserve.py tests/test_policy_short.py tests/test_starvation.py \
	tests/test_sim_predictions.py tests/test_simulate_cli.py tests/test_simulate_parallel.py \
	tests/test_sweep.py tests/test_local_ordering.py

demo: $(STAMP)
	$(BIN)/headway demo

services:
	bash tests/setup/services.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks setup.py
	$(BIN)/ruff format --check src tests benchmarks setup.py
	$(BIN)/mypy
	$(BIN)/mypy setup.py

pytest: $(STAMP) services
	$(BIN)/pytest -q

pytest-native: $(NATIVE_STAMP)
	HEADWAY_EXPECT_NATIVE=1 PYTHONPATH=$(CURDIR)/$(NATIVE) $(BIN)/pytest -q -p no:cacheprovider $(NATIVE_TESTS)

test: lint pytest pytest-native

bench: $(NATIVE_STAMP)
	PYTHONPATH=$(CURDIR)/$(NATIVE) $(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info headway.duckdb headway-demo.duckdb headway-report.html
