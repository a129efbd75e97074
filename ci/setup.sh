#!/usr/bin/env bash
# Creates ./.venv and installs Shoal in editable mode with its dev tools; compiles ext/*.pyx
# unless SHOAL_NO_EXTENSIONS=1. Needs only python3 (3.11+), gcc and the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
.venv/bin/python -m pip install --quiet -e '.[dev,analytics]'
.venv/bin/python -c 'import shoal.kernels as k; print("shoal installed; kernels:", k.implementation())'
