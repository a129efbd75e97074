#!/usr/bin/env bash
# System tools the test suite drives for real (not needed to run a node): installed from Debian's
# packages when missing and this runs as root, otherwise named so a developer can install them.
#   iptables     — partitions in tests/faults (rules on 127.0.0.x, always removed)
#   etcd-server  — the CP store's etcd and managed-etcd tests (a cluster node in managed-etcd mode
#                  needs it too; a standalone node's embedded store does not)
#   chromium, chromium-driver — the console's browser tests (tests/integration/test_console_browser.py,
#                  headless; selenium is given /usr/bin/chromedriver and never downloads a driver)
#   dnsutils     — `dig`, the real DNS client of tests/integration/test_dns.py
#   slapd, ldap-utils — the LDAP login tests (tests/integration/test_ldap.py start their own slapd)
# Then the real SDK clients that are not Python packages (grpc-js from npm, grpc-java from Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v iptables >/dev/null || missing+=(iptables)
command -v etcd >/dev/null || missing+=(etcd-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
command -v dig >/dev/null || missing+=(dnsutils)
[ -x /usr/sbin/slapd ] || missing+=(slapd)
command -v ldapsearch >/dev/null || missing+=(ldap-utils)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "ci/test-deps.sh: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "ci/test-deps.sh: not installed: ${missing[*]} (the tests that need them will skip)" >&2
  fi
fi
bash ci/setup_clients.sh
