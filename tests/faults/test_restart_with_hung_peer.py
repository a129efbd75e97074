"""A fault the issue's list does not name: a node restarts while one of its peers is hung.

The restarting node loads its snapshot from the first peer that answers; a SIGSTOPped peer
answers nothing, so the load must give up on it quickly and take the healthy peer's snapshot,
well inside the 30 s load timeout, and the data must be there once the node reports ready.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable

import pytest

from shoal.testing.faults import freeze, kill9, tracebacks
from shoal.testing.http import timed_call
from shoal.testing.nodes import FaultCluster
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

KEEP = json.dumps({"preserved.heart.beat.timeout": "600000", "preserved.ip.delete.timeout": "600000"})
#: The restarted node is ready within this: half the 30 s load timeout (a healthy peer answers at once).
READY_WITHIN_S = 15


def test_restart_while_a_peer_is_hung_loads_from_the_healthy_one(
        fault_cluster: Callable[..., FaultCluster]) -> None:
    cluster = fault_cluster(3)
    cluster.start_all()
    poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)), 30,
               what="every member UP everywhere")
    tags = [(f"10.11.0.{n}", 80) for n in range(1, 7)]
    for ip, port in tags:
        query = urllib.parse.urlencode({"serviceName": "restart", "ip": ip, "port": port, "metadata": KEEP})
        status, text, _ = timed_call("POST", cluster.nodes[2].url(f"/nacos/v1/ns/instance?{query}"))
        assert status == 200, text
    poll_until(lambda: all(cluster.instance_ips(i, "restart") == set(tags) for i in range(3)), 20, what="replicated")

    freeze(cluster.nodes[1])  # B (127.0.0.3) comes first in A's peer list
    kill9(cluster.nodes[0])
    restarted = time.monotonic()
    node = cluster.start(0, wait=False)
    node.wait_ready(60)
    ready_after = time.monotonic() - restarted
    has_data = cluster.instance_ips(0, "restart")
    print(f"restart with a hung peer: ready {ready_after:.1f} s after the restart, holding {len(has_data)} of "
          f"{len(tags)} instances; tracebacks {tracebacks(node.log())}")
    assert ready_after <= READY_WITHIN_S
    assert has_data == set(tags)
    assert tracebacks(node.log()) == 0
