"""SIGTERM while a starting node waits for a snapshot from an unreachable peer."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from shoal.testing.faults import Partition, tracebacks
from shoal.testing.http import http_get
from shoal.testing.nodes import FaultCluster
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

#: The README's promise: a node exits 0 within 5 s of SIGTERM. A loaded CI box gets 3 s more.
STOP_WITHIN_S = 8.0


def _loading(cluster: FaultCluster) -> bool:
    """True once the node answers readiness and says it is still loading its snapshot."""
    node = cluster.nodes[0]
    if node.proc.poll() is not None:
        raise AssertionError(f"node exited early:\n{node.log()}")
    try:
        status, text = http_get(node.url("/nacos/v1/console/health/readiness"), 0.5)
    except OSError:
        return False
    return status != 200 and "snapshot" in text


@pytest.mark.parametrize("peer", ["refused", "blackholed"])
def test_sigterm_while_loading_a_snapshot_stops_promptly(
        fault_cluster: Callable[..., FaultCluster], request: pytest.FixtureRequest, peer: str) -> None:
    cluster = fault_cluster(2)
    if peer == "blackholed":  # the peer's address drops every packet: connects hang, nothing is refused
        part: Partition = request.getfixturevalue("partition")
        part.blackhole(cluster.hosts[1], cluster.ports_of(1))
    # the peer is never started; Nacos's default load timeout (30 s) applies
    node = cluster.start(0, "-D", "nacos.core.protocol.distro.data.load.timeoutMs=30000", wait=False)
    poll_until(lambda: _loading(cluster), 30, what="the node to listen while it loads a snapshot")

    signalled = time.monotonic()
    node.signal(signal.SIGTERM)
    try:
        code = node.proc.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - signalled
    log = node.log()
    print(f"fault 5 ({peer}): exit code {code} after {took:.1f} s; tracebacks {tracebacks(log)}")
    assert code == 0, f"still running {took:.1f} s after SIGTERM"
    assert "node serving" not in log
    assert tracebacks(log) == 0
