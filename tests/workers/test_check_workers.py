"""``shoal check`` on a node of workers asks each worker (each holds a replica) on its private
port and talks about the node, with its workers as detail (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from shoal.testing import ServerProcess, poll_until
from shoal.testing.openapi import register
from shoal.testing.workers import worker_listed_ips

pytestmark = pytest.mark.integration


def shoal_check(node: ServerProcess, *extra: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "shoal", "check", "--addr", node.addr, "--recheck", "0.2", *extra],
                          capture_output=True, text=True, timeout=30, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def test_check_compares_the_workers_of_a_node(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    assert register(node, "chk", "10.21.4.1", 80)[0] == 200
    for index in range(2):
        poll_until(lambda index=index: worker_listed_ips(node, index, "chk") == {"10.21.4.1"}, 10,
                   what=f"worker {index} to list the instance")
    code, out = shoal_check(node)
    assert (code, out.strip()) == (0, "the node's 2 workers agree on 1 service"), out
    code, out = shoal_check(node, "--json")
    report = json.loads(out)
    workers = sorted(f"127.0.0.1:{port}" for port in node.worker_ports())
    assert code == 0 and report["nodes"] == {node.addr: workers} and sorted(report["members"]) == workers, out
