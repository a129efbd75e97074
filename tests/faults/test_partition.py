"""A fault the issue's list does not name: a node nobody can reach for a while (iptables blackhole).

While C is blackholed, A and B keep accepting writes they are responsible for; after the rules
are removed every node agrees again (time to agree measured), with no traceback anywhere.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable

import pytest

from shoal.testing.faults import Partition, tracebacks
from shoal.testing.http import timed_call
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster, owner_index
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

KEEP = json.dumps({"preserved.heart.beat.timeout": "600000", "preserved.ip.delete.timeout": "600000"})
#: How long C stays unreachable after A and B have marked it DOWN.
CUT_S = 8.0


def test_a_blackholed_node_rejoins_and_agrees(fault_cluster: Callable[..., FaultCluster],
                                              partition: Partition) -> None:
    cluster = fault_cluster(3, *FAST_MEMBERS)
    cluster.start_all()
    poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)), 30,
               what="every member UP everywhere")
    # ip:ports that A owns with or without C, so no write below is ever forwarded
    tags = [(f"10.9.0.{n}", 9000) for n in range(1, 250)
            if owner_index(cluster, f"10.9.0.{n}:9000") == 0 and owner_index(cluster, f"10.9.0.{n}:9000", [0, 1]) == 0]
    before, during = tags[:5], tags[5:15]

    def write(tag: tuple[str, int]) -> int:
        query = urllib.parse.urlencode({"serviceName": "cut", "ip": tag[0], "port": tag[1], "metadata": KEEP})
        return timed_call("POST", cluster.nodes[0].url(f"/nacos/v1/ns/instance?{query}"), timeout=15)[0]

    assert [write(t) for t in before] == [200] * len(before)
    poll_until(lambda: all(set(before) <= cluster.instance_ips(i, "cut") for i in range(3)), 20,
               what="replicated before")

    c = cluster.addr(2)
    partition.blackhole(cluster.hosts[2], cluster.ports_of(2))
    cut_at = time.monotonic()
    poll_until(lambda: cluster.member_states(0).get(c) != "UP" and cluster.member_states(1).get(c) != "UP", 30,
               what="A and B to stop trusting C")
    statuses = [write(t) for t in during]
    hold_until = time.monotonic() + CUT_S
    poll_until(lambda: time.monotonic() >= hold_until, CUT_S + 5, what="the partition to last", interval=0.5)
    partition.heal()
    healed_at = time.monotonic()
    everything = {*before, *during}
    poll_until(lambda: all(cluster.instance_ips(i, "cut") == everything for i in range(3)), 60,
               what="every node to agree after the partition", interval=0.2)
    agreed = time.monotonic() - healed_at
    logs = sum(tracebacks(cluster.nodes[i].log()) for i in range(3))
    print(f"partition: C cut {healed_at - cut_at:.1f} s; writes during the cut {statuses}; "
          f"agreed {agreed:.1f} s after the heal; tracebacks {logs}")
    assert statuses == [200] * len(during)
    assert logs == 0
