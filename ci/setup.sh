#!/usr/bin/env bash
# Creates ./.venv and installs Shoal in editable mode with its dev tools; compiles ext/*.pyx
# unless SHOAL_NO_EXTENSIONS=1. Needs python3 (3.11+), gcc, the package index and etcd (installed
# here from Debian's etcd-server when run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# Some machines list package mirrors that do not exist; pip warns once per package about them.
pip_quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }; }
# The CP store's tests and managed-etcd mode need etcd (Debian: etcd-server, /usr/bin/etcd).
if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
  else
    echo "etcd is missing: install it as root with 'apt-get install etcd-server' (or put an etcd 3.4+ on PATH)" >&2
  fi
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_quiet .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
pip_quiet .venv/bin/python -m pip install --quiet -e '.[dev,analytics]'
# nacos-sdk-python 2.0.11 ships the 1.x HTTP client (nacos.NacosClient) that 3.x dropped; it is the
# same distribution as the 3.x dev dependency, so it lives in its own directory, which the HTTP
# integration tests put on sys.path. Its dependencies are those of 3.x, already installed.
[ -f .venv/nacos-v1/nacos/client.py ] || \
  pip_quiet .venv/bin/python -m pip install --quiet --no-deps --target .venv/nacos-v1 'nacos-sdk-python==2.0.11'
.venv/bin/python -c 'import shoal.kernels as k; print("shoal installed; kernels:", k.implementation())'
