#!/usr/bin/env bash
# Creates ./.venv and installs Shoal in editable mode; compiles ext/*.pyx unless SHOAL_NO_EXTENSIONS=1.
#   ci/setup.sh node   the node only: runtime dependencies and the kernels (`make serve`)
#   ci/setup.sh [dev]  the node plus the dev and analytics extras (`make test`, CI; the default)
# Needs python3 (3.11+), gcc, libnghttp2's headers (installed here when run as root) and the
# package index. What only the tests need is installed by ci/test-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHAT="${1:-dev}"
case "$WHAT" in node|dev) ;; *) echo "usage: ci/setup.sh [node|dev]" >&2; exit 2 ;; esac
# Some machines list package mirrors that do not exist; pip warns once per package about them.
pip_quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }; }
# The native gRPC transport (ext/h2grpc.pyx, ext/h2client.pyx) links libnghttp2: install its headers if we can.
if [ "${SHOAL_NO_EXTENSIONS:-0}" = "0" ] && [ ! -f /usr/include/nghttp2/nghttp2.h ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libnghttp2-dev >/dev/null
  else
    echo "ci/setup.sh: libnghttp2's headers are missing: install libnghttp2-dev (Debian/Ubuntu) or" \
         "libnghttp2-devel (Fedora), or build without extensions (SHOAL_NO_EXTENSIONS=1)" >&2
    exit 1
  fi
fi
# The rapid-reset guard needs libnghttp2 >= 1.57, or 1.52 with Debian's CVE-2023-44487 fix (1.52.0-1+deb12u1).
if [ "${SHOAL_NO_EXTENSIONS:-0}" = "0" ] && [ -f /usr/include/nghttp2/nghttp2.h ] &&
   ! grep -q nghttp2_option_set_stream_reset_rate_limit /usr/include/nghttp2/nghttp2.h; then
  echo "ci/setup.sh: libnghttp2 is too old (no nghttp2_option_set_stream_reset_rate_limit): upgrade" \
       "libnghttp2-dev to 1.52.0-1+deb12u1 or later (Debian security updates) or 1.57+" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_quiet .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
if [ "$WHAT" = node ]; then
  pip_quiet .venv/bin/python -m pip install --quiet -e .
  .venv/bin/python -c 'import shoal.kernels as k; print("shoal node installed; kernels:", k.implementation())'
  echo "run it: .venv/bin/shoal server --help (or: . .venv/bin/activate; shoal server)"
  exit 0
fi
pip_quiet .venv/bin/python -m pip install --quiet -e '.[dev,analytics]'
# nacos-sdk-python 2.0.11 ships the 1.x HTTP client (nacos.NacosClient) that 3.x dropped; it is the
# same distribution as the 3.x dev dependency, so it lives in its own directory, which the HTTP
# integration tests put on sys.path. Its dependencies are those of 3.x, already installed.
[ -f .venv/nacos-v1/nacos/client.py ] || \
  pip_quiet .venv/bin/python -m pip install --quiet --no-deps --target .venv/nacos-v1 'nacos-sdk-python==2.0.11'
.venv/bin/python -c 'import shoal.kernels as k; print("shoal installed; kernels:", k.implementation())'
