"""Beat-expiry log figures, log noise about a down peer, and a restarted peer's flap."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from shoal.testing import OPEN
from shoal.testing.faults import kill9, tracebacks
from shoal.testing.http import timed_call
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster
from shoal.testing.procs import ServerProcess, free_port_block, kill
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

#: How long the log of a node with a down peer is watched (a rate needs a window).
WATCH_S = 12.0
#: At most this many WARNING lines about the down peer in that window (its state change, a reminder).
WARNINGS_IN_WINDOW = 2
#: How long a killed peer stays down before it is restarted.
DOWN_S = 6.0


def test_beat_expiry_logs_the_real_idle_time(tmp_path: Path) -> None:
    host = "127.0.0.2"
    port = free_port_block(host=host)
    node = ServerProcess(port, tmp_path / f"node-{host}-{port}", ["-D", "shoal.naming.beat-check-interval-ms=300"],
                         host=host, ready_timeout=45, auth=OPEN).start()
    try:
        node.wait_ready()
        metadata = json.dumps({"preserved.heart.beat.interval": "500", "preserved.heart.beat.timeout": "1000",
                               "preserved.ip.delete.timeout": "2000"})
        query = urllib.parse.urlencode({"serviceName": "expiry", "ip": "10.7.0.1", "port": 1, "metadata": metadata})
        status, text, _ = timed_call("POST", node.url(f"/nacos/v1/ns/instance?{query}"))
        assert status == 200, text
        poll_until(lambda: "AUTO-DELETE-IP" in node.log(), 20, what="the never-beating instance to expire")
        idle = {kind: int(ms) for kind, ms in
                re.findall(r"\[(AUTO-DELETE-IP|IP-DISABLED)\] \S+ of .*?: no beat for (-?\d+) ms", node.log())}
        print(f"fault 7 beat expiry: logged idle times {idle}")
        assert idle.get("IP-DISABLED", 1000) >= 1000
        assert idle["AUTO-DELETE-IP"] >= 2000
        assert tracebacks(node.log()) == 0
    finally:
        kill(node)


@pytest.mark.parametrize("when", [
    "killed-after-start",
    "down-at-start",
])
def test_a_down_peer_is_logged_briefly(fault_cluster: Callable[..., FaultCluster], when: str) -> None:
    cluster = fault_cluster(2, *FAST_MEMBERS)
    if when == "killed-after-start":
        cluster.start_all()
        kill9(cluster.nodes[1])
    else:  # B never starts; A serves after a short load timeout and keeps trying to load
        cluster.start(0, "-D", "nacos.core.protocol.distro.data.load.timeoutMs=2000")
    a = cluster.nodes[0]
    poll_until(lambda: cluster.member_states(0).get(cluster.addr(1)) == "DOWN", 30, what="A to mark B DOWN")
    since = len(a.log())
    watch_until = time.monotonic() + WATCH_S
    poll_until(lambda: time.monotonic() >= watch_until, WATCH_S + 5, what="the watch window to pass", interval=0.5)
    window = a.log()[since:]
    about_b = [line for line in window.splitlines() if " WARNING " in line and cluster.addr(1) in line]
    print(f"fault 7 down peer ({when}): {len(about_b)} WARNING lines about it in {WATCH_S:.0f} s")
    assert len(about_b) <= WARNINGS_IN_WINDOW, about_b[:3]
    assert not any("failed to connect to all addresses" in line for line in about_b)
    assert tracebacks(a.log()) == 0


def test_a_restarted_peer_stays_up(fault_cluster: Callable[..., FaultCluster]) -> None:
    cluster = fault_cluster(3, *FAST_MEMBERS)  # frequent reports: more calls meet the channel in backoff
    cluster.start_all()
    poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)), 30,
               what="every member UP everywhere")
    c = cluster.addr(2)
    kill9(cluster.nodes[2])
    poll_until(lambda: all(cluster.member_states(i).get(c) == "DOWN" for i in (0, 1)), 45,
               what="A and B to mark C DOWN")
    # C stays down a while, as a restarted process does: A's and B's reconnect backoff grows to its cap
    down_until = time.monotonic() + DOWN_S
    poll_until(lambda: time.monotonic() >= down_until, DOWN_S + 5, what="C's down time to pass", interval=0.5)
    logs_from = {i: len(cluster.nodes[i].log()) for i in (0, 1)}
    restarted = time.monotonic()
    cluster.start(2)
    poll_until(lambda: all(cluster.member_states(i).get(c) == "UP" for i in (0, 1)), 30, what="A and B to see C UP")
    up_after = time.monotonic() - restarted
    seen: dict[int, set[str]] = {0: set(), 1: set()}
    watch_until = time.monotonic() + WATCH_S  # C must stay UP on A and B for the whole window

    def watch() -> bool:
        for i in (0, 1):
            seen[i].add(cluster.member_states(i).get(c, "missing"))
        return time.monotonic() >= watch_until

    poll_until(watch, WATCH_S + 10, what="the watch window to pass", interval=0.2)
    flaps = {i: re.findall(rf"member {re.escape(c)} is UP -> (\w+)", cluster.nodes[i].log()[logs_from[i]:])
             for i in (0, 1)}
    print(f"fault 7 restarted peer: UP on A and B {up_after:.1f} s after the restart; states seen after {seen}; "
          f"transitions out of UP logged {flaps}")
    assert seen == {0: {"UP"}, 1: {"UP"}}
    assert flaps == {0: [], 1: []}
