"""Ip:port instances registered while their responsible node was stopped.

Expected: at every moment exactly one healthy member runs the beat check of every ip:port
client, so once C is back the instances that never beat are removed within their delete
timeout (not the 180 s synced-copy expiry), and the ones that keep beating stay, everywhere.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable

import pytest

from shoal.testing.faults import freeze, thaw, tracebacks
from shoal.testing.http import timed_call
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster, owner_index
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

#: Per-instance timeouts (Nacos metadata): beat every 1 s, unhealthy after 4 s without a beat, removed after 8 s.
SHORT = json.dumps({"preserved.heart.beat.interval": "1000", "preserved.heart.beat.timeout": "4000",
                    "preserved.ip.delete.timeout": "8000"})
#: After C is back: 8 s delete timeout + 5 s beat-check period + sync and verify slack.
REMOVED_WITHIN_S = 45


def _url(cluster: FaultCluster, node: int, path: str, **query: object) -> str:
    return cluster.nodes[node].url(f"{path}?{urllib.parse.urlencode({'serviceName': 'orphans', **query})}")


def test_instances_registered_while_the_owner_was_stopped_are_beat_checked(
        fault_cluster: Callable[..., FaultCluster]) -> None:
    cluster = fault_cluster(3, *FAST_MEMBERS)
    cluster.start_all()
    a, b, c = 0, 1, 2
    poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)), 30,
               what="every member UP everywhere")
    tags = [(f"10.3.0.{n}", 7000) for n in range(1, 120) if owner_index(cluster, f"10.3.0.{n}:7000") == c]
    silent, beating = tags[:6], tags[6]

    freeze(cluster.nodes[c])
    poll_until(lambda: all(cluster.member_states(i).get(cluster.addr(c)) == "DOWN" for i in (a, b)), 30,
               what="A and B to mark C DOWN")
    for n, (ip, port) in enumerate([*silent, beating]):
        status, text, _ = timed_call("POST", _url(cluster, (a, b)[n % 2], "/nacos/v1/ns/instance", ip=ip, port=port,
                                         metadata=SHORT))
        assert status == 200, text
    everything = {*silent, beating}
    poll_until(lambda: all(everything <= cluster.instance_ips(i, "orphans") for i in (a, b)), 20,
               what="the instances on A and B")

    stop_beating = threading.Event()

    def beat() -> None:  # the live instance beats every second, always through A (forwarded as needed)
        ip, port = beating
        while not stop_beating.is_set():
            timed_call("PUT", _url(cluster, a, "/nacos/v1/ns/instance/beat", ip=ip, port=port), timeout=5)
            stop_beating.wait(1.0)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        thaw(cluster.nodes[c])
        back = time.monotonic()
        poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)), 30,
                   what="C UP everywhere again")
        try:
            poll_until(lambda: all(cluster.instance_ips(i, "orphans") == {beating} for i in range(3)), REMOVED_WITHIN_S,
                       what="the silent instances gone and the beating one kept, on every node", interval=0.5)
            agreed = time.monotonic() - back
        finally:
            views = {i: len(cluster.instance_ips(i, "orphans")) for i in range(3)}
            print(f"fault 3: {time.monotonic() - back:.1f} s after SIGCONT the nodes list {views} instances "
                  f"(expected 1 each)")
    finally:
        stop_beating.set()
        beater.join(10)
    logs = sum(tracebacks(cluster.nodes[i].log()) for i in range(3))
    print(f"fault 3: agreed {agreed:.1f} s after C came back; tracebacks {logs}")
    assert logs == 0
