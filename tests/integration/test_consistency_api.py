"""Issue 23 item 4 on one node with auth on: the digests and the comparison are operator routes
(admin or the cluster identity), `shoal check` takes `shoal status`'s auth options, and the
periodic check keeps the disagreement gauge without anyone asking."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing.http import call, http_get
from shoal.testing.procs import SECURE, ServerProcess, start_server
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.integration

IDENTITY = {"shoal-test": "shoal-test-secret"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server(tmp_path, ["--auth", "-D", "nacos.core.auth.server.identity.key=shoal-test",
                                     "-D", "nacos.core.auth.server.identity.value=shoal-test-secret",
                                     "-D", "shoal.consistency.check-interval-ms=200"], auth=SECURE)
    yield server
    server.kill()


def shoal_check(server: ServerProcess, *extra: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "shoal", "check", "--addr", server.addr, *extra],
                          capture_output=True, text=True, timeout=30, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def test_digests_need_an_operator_and_check_uses_the_status_auth_options(node: ServerProcess) -> None:
    for path in ("/nacos/v1/shoal/digests", "/nacos/v1/shoal/consistency"):
        status, text = call("GET", node.url(path))
        assert status == 403, (path, status, text)
    status, text = call("POST", node.url("/nacos/v1/ns/instance"), {"serviceName": "s", "ip": "10.0.0.1", "port": "80"},
                        headers=IDENTITY)
    assert status == 200, text
    status, text = call("GET", node.url("/nacos/v1/shoal/digests"), headers=IDENTITY)
    assert status == 200 and list(json.loads(text)["services"]) == ["public/DEFAULT_GROUP@@s"], text

    code, out = shoal_check(node)
    assert code == 1 and "member list answered 403" in out, out
    code, out = shoal_check(node, "--identity-key", "shoal-test", "--identity-value", "shoal-test-secret")
    assert (code, out.strip()) == (0, "1 node, no other member to compare it with; it holds 1 service"), out
    code, out = shoal_check(node, "--identity-key", "shoal-test")
    assert code == 2 and "go together" in out


def test_the_periodic_check_sets_the_gauge_and_bad_input_is_a_400(node: ServerProcess) -> None:
    def gauge() -> str | None:
        _status, text = http_get(node.url("/nacos/actuator/prometheus"), 3)
        match = re.search(r'^shoal_consistency_disagreements\{member="[^"]+"\} (\S+)$', text, re.MULTILINE)
        return match.group(1) if match else None

    assert poll_until(gauge, 10, what="the periodic check's gauge") == "0.0"
    status, text = call("GET", node.url("/nacos/v1/shoal/consistency"), {"recheckMs": "soon"}, headers=IDENTITY)
    assert status == 400 and "recheckMs" in text and "Traceback" not in node.log()


def test_an_unreachable_node_is_exit_status_1(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "shoal", "check", "--addr", "127.0.0.1:9", "--timeout", "1"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and "cannot reach" in done.stderr, done.stderr
