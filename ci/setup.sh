#!/usr/bin/env bash
# Creates ./.venv and installs Shoal in editable mode with its dev tools; compiles ext/*.pyx
# unless SHOAL_NO_EXTENSIONS=1. Needs python3 (3.11+), gcc, libnghttp2's headers (installed here
# when run as root) and the package index. What only the tests need is installed by ci/test-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# Some machines list package mirrors that do not exist; pip warns once per package about them.
pip_quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }; }
# The native gRPC transport (ext/h2grpc.pyx) links libnghttp2: install its headers if we can.
if [ "${SHOAL_NO_EXTENSIONS:-0}" = "0" ] && [ ! -f /usr/include/nghttp2/nghttp2.h ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libnghttp2-dev >/dev/null
  else
    echo "ci/setup.sh: libnghttp2's headers are missing: install libnghttp2-dev (Debian/Ubuntu) or" \
         "libnghttp2-devel (Fedora), or build without extensions (SHOAL_NO_EXTENSIONS=1)" >&2
    exit 1
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
