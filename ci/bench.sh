#!/usr/bin/env bash
# Kernel micro-benchmarks (compiled vs pure Python) into bench/results/kernels.json, then a
# table of speed-ups per group. Extra arguments go to pytest (e.g. -k syncser).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
.venv/bin/python -m pytest bench/kernels --benchmark-only --benchmark-json=bench/results/kernels.json -q "$@"
.venv/bin/python bench/report_ratios.py bench/results/kernels.json
