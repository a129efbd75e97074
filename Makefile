# The README's two commands are `make serve` and `make test`; both create ./.venv first.
# Two stamps: the node (runtime dependencies and the Cython kernels only: what `make serve` needs)
# and dev (the node plus the dev and analytics extras: tests, linters, SDKs, PySpark).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
NODE_STAMP := $(VENV)/.installed-node
DEV_STAMP  := $(VENV)/.installed-dev
ARGS   ?=

.PHONY: serve install test lint typecheck unit integration bench clean

$(NODE_STAMP): pyproject.toml setup.py $(wildcard ext/*.pyx ext/*.pxd) ci/setup.sh
	bash ci/setup.sh node
	touch $@

# dev installs the node too (one editable install with the extras, one kernel build)
$(DEV_STAMP): pyproject.toml setup.py $(wildcard ext/*.pyx ext/*.pxd) ci/setup.sh
	bash ci/setup.sh dev
	touch $(NODE_STAMP) $@

## install: the node only into ./.venv (runtime dependencies, Cython kernels); `shoal` is .venv/bin/shoal
install: $(NODE_STAMP)

## serve: install the node into ./.venv and start a standalone node on 8848/9848
# Every API needs a login by default (Nacos 3.3): say how to make the first admin, or run open.
serve: $(NODE_STAMP)
	@echo "shoal: first admin: open http://127.0.0.1:8848/nacos/ or: curl -X POST http://127.0.0.1:8848/nacos/v3/auth/user/admin --data-urlencode password=YOUR-PASSWORD"
	@echo "shoal: open for local development only: make serve ARGS='-D nacos.core.auth.enabled=false -D nacos.core.auth.admin.enabled=false -D nacos.core.auth.console.enabled=false'"
	$(BIN)/shoal server $(ARGS)

## test: lint, type-check, then the whole suite (compiled kernels, then the pure-Python twins)
test: $(DEV_STAMP)
	bash ci/test.sh

## unit: the in-process suites (unit, kernels, in-memory cluster): no server processes
unit: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -ra tests/unit tests/kernels tests/transport tests/cluster $(ARGS)

## integration: the real-process suite (tests/integration, marked `integration`)
integration: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -ra -m integration tests/integration $(ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

## bench: kernel micro-benchmarks (Cython vs pure Python) and the in-process request path into bench/results/
bench: $(DEV_STAMP)
	bash ci/bench.sh

## bench-compare: those benches vs the last saved `make bench` run; fails past a 25% slower median
.PHONY: bench-compare
bench-compare: $(DEV_STAMP)
	bash ci/bench.sh --compare

clean:
	rm -rf build $(VENV) src/*.egg-info ext/*.c ext/*.html src/shoal/_ext/*.so .pytest_cache .mypy_cache .ruff_cache
