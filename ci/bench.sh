#!/usr/bin/env bash
# Kernel micro-benchmarks (compiled vs pure Python) and the in-process request path per request
# type (bench/requests) into bench/results/kernels.json, then a table of the kernels' speed-ups per
# group. Extra arguments go to pytest (e.g. -k syncser, -k requests).
# Each run is also saved to bench/results/history (pytest-benchmark storage). With --compare
# the run is compared with the last saved one instead of being saved, and fails when a median
# is more than BENCH_FAIL (default 25%) slower; see bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
HISTORY=(--benchmark-storage=bench/results/history --benchmark-autosave)
if [[ "${1:-}" == "--compare" ]]; then
    shift
    compgen -G "bench/results/history/*/*.json" >/dev/null || { echo "bench: no saved run in bench/results/history; run 'make bench' first" >&2; exit 2; }
    HISTORY=(--benchmark-storage=bench/results/history --benchmark-compare "--benchmark-compare-fail=median:${BENCH_FAIL:-25%}")
fi
.venv/bin/python -m pytest bench/kernels bench/requests --benchmark-only --benchmark-json=bench/results/kernels.json "${HISTORY[@]}" -q "$@"
.venv/bin/python bench/report_ratios.py bench/results/kernels.json
