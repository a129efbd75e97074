#!/usr/bin/env bash
# System tools the test suite drives for real (not needed to run a node): installed from Debian's
# packages when missing and this runs as root, otherwise named so a developer can install them.
#   iptables  — partitions in tests/faults (rules on 127.0.0.x, always removed)
set -euo pipefail
missing=()
command -v iptables >/dev/null || missing+=(iptables)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "ci/test-deps.sh: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "ci/test-deps.sh: not installed: ${missing[*]} (the tests that need them will skip)" >&2
  fi
fi
