# The README's two commands are `make serve` and `make test`; both create ./.venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: serve test lint typecheck unit integration bench clean

$(STAMP): pyproject.toml setup.py $(wildcard ext/*.pyx ext/*.pxd) ci/setup.sh
	bash ci/setup.sh
	touch $@

## serve: install into ./.venv (building the Cython kernels) and start a standalone node on 8848/9848
serve: $(STAMP)
	$(BIN)/shoal server $(ARGS)

## test: lint, type-check, then the whole suite (compiled kernels, then the pure-Python twins)
test: $(STAMP)
	bash ci/test.sh

## unit: the in-process suites (unit, kernels, in-memory cluster): no server processes
unit: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests/unit tests/kernels tests/cluster $(ARGS)

## integration: the real-process suite (tests/integration, marked `integration`)
integration: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m integration tests/integration $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

## bench: kernel micro-benchmarks (Cython vs pure Python) and the in-process request path into bench/results/
bench: $(STAMP)
	bash ci/bench.sh

## bench-compare: those benches vs the last saved `make bench` run; fails past a 25% slower median
.PHONY: bench-compare
bench-compare: $(STAMP)
	bash ci/bench.sh --compare

clean:
	rm -rf build $(VENV) src/*.egg-info ext/*.c ext/*.html src/shoal/_ext/*.so .pytest_cache .mypy_cache .ruff_cache
