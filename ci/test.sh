#!/usr/bin/env bash
# The whole suite: lint and types over src/, every test with the compiled kernels, then the
# kernel, unit and in-memory cluster tests again on the pure-Python twins (SHOAL_NO_EXTENSIONS=1),
# the same set as `make unit` (no server processes: -m "not integration" excludes those anywhere;
# tests/transport is the compiled gRPC transport, whose pure-Python counterpart is grpc.aio, run below),
# and the real-process integration tests (multi-worker nodes included) again with the gRPC ports on grpc.aio
# (the default is native).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
bash ci/test-deps.sh
echo "== ruff"; $BIN/ruff check src tests bench
echo "== mypy"; $BIN/mypy
echo "== pytest (compiled kernels)"; $BIN/python -m pytest -q -ra "$@"
echo "== pytest (pure-Python kernels)"; SHOAL_NO_EXTENSIONS=1 $BIN/python -m pytest -q -ra -m "not integration" tests/unit tests/kernels tests/cluster
# (test_export.py runs Spark jobs whose outcome does not depend on the gRPC transport: once is enough)
echo "== pytest integration (grpcio transport)"; SHOAL_REMOTE_TRANSPORT=grpcio $BIN/python -m pytest -q -ra tests/integration tests/workers \
  --ignore=tests/integration/test_export.py
