#!/usr/bin/env bash
# Installs what the non-Python real clients of tests/integration/test_real_clients.py need, and
# returns at once when it is all there already:
#   * grpc-java from Debian (libgrpc-java, libprotobuf-java) and the runtime jars libgrpc-java
#     does not declare (guava, gson, perfmark, netty), plus a JDK if javac is missing;
#   * the Node client's packages (npm ci in tests/integration/clients/node, from its lock file).
# nacos-sdk-rust-binding-py comes from the dev extra (ci/setup.sh). Where something cannot be
# installed (not root, no apt-get, no npm), it says what to install; that is an error in CI
# (CI=true), where those tests must run, and a warning elsewhere, where they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
missing() {
  echo "ci/setup_clients.sh: $*" >&2
  if [ "${CI:-}" = "true" ]; then status=1; fi
}

# --- grpc-java (Debian) -----------------------------------------------------------------------
JARS="grpc-api grpc-context grpc-core grpc-netty grpc-stub protobuf guava gson perfmark-api
      netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks netty-common
      netty-handler netty-handler-proxy netty-resolver netty-transport"
DEBS="libgrpc-java libprotobuf-java libguava-java libgoogle-gson-java libperfmark-java libnetty-java"
need_debs=0
for jar in $JARS; do
  [ -f "/usr/share/java/$jar.jar" ] || need_debs=1
done
command -v javac >/dev/null && command -v java >/dev/null || { need_debs=1; DEBS="$DEBS default-jdk-headless"; }
if [ "$need_debs" = "1" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086  # DEBS is a list of package names
    if ! apt-get install -y -qq --no-install-recommends $DEBS >/dev/null 2>&1; then
      apt-get update -qq
      # shellcheck disable=SC2086
      apt-get install -y -qq --no-install-recommends $DEBS >/dev/null
    fi
  else
    missing "the Java client needs Debian's $DEBS (apt-get install them as root)"
  fi
fi

# --- @grpc/grpc-js (npm) ----------------------------------------------------------------------
NODE_DIR=tests/integration/clients/node
STAMP="$NODE_DIR/node_modules/.shoal-lock-sha256"
if command -v node >/dev/null && command -v npm >/dev/null; then
  want="$(sha256sum "$NODE_DIR/package-lock.json" | cut -d' ' -f1)"
  if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" > "$STAMP"
  fi
else
  missing "the Node client needs node (18 or later) and npm"
fi

exit "$status"
