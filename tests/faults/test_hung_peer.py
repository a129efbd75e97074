"""Issue 11 item 2: a SIGSTOPped peer must not make HTTP writes forwarded to it fail."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from shoal.testing.faults import Partition, RssSampler, freeze, rss_kb, thaw, tracebacks
from shoal.testing.http import timed_call
from shoal.testing.nodes import FaultCluster, owner_index
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

#: Instances registered here never beat; keep them for the whole test.
KEEP = json.dumps({"preserved.heart.beat.timeout": "600000", "preserved.ip.delete.timeout": "600000"})


def _register_url(cluster: FaultCluster, node: int, ip: str, port: int) -> str:
    query = urllib.parse.urlencode({"serviceName": "hung", "ip": ip, "port": port, "metadata": KEEP})
    return cluster.nodes[node].url(f"/nacos/v1/ns/instance?{query}")


def _tags(cluster: FaultCluster, owner: int, count: int, start: int) -> list[tuple[str, int]]:
    """``count`` ip:ports that node ``owner`` is responsible for while all nodes are UP."""
    found: list[tuple[str, int]] = []
    n = start
    while len(found) < count:
        ip, port = f"10.2.{n // 200}.{n % 200}", 8080
        if owner_index(cluster, f"{ip}:{port}") == owner:
            found.append((ip, port))
        n += 1
    return found


@pytest.mark.parametrize("hang", ["sigstop", "blackholed"])
def test_writes_for_a_hung_owner_succeed(fault_cluster: Callable[..., FaultCluster], request: pytest.FixtureRequest,
                                         hang: str) -> None:
    cluster = fault_cluster(3)  # Nacos's member failure detection: a report every 2 s, DOWN after 3 failures
    cluster.start_all()
    a, c = 0, 2
    poll_until(lambda: all(s == "UP" for s in cluster.member_states(a).values()), 30, what="A to see every member UP")
    owned_by_c = iter(_tags(cluster, c, 400, 0))

    part: Partition | None = request.getfixturevalue("partition") if hang == "blackholed" else None
    sampler = RssSampler(cluster.nodes[a].pid)
    rss_before = rss_kb(cluster.nodes[a].pid)
    if part is not None:  # nothing reaches C, while C's own reports still reach A and B
        part.blackhole(cluster.hosts[c], cluster.ports_of(c))
    else:
        freeze(cluster.nodes[c])
    frozen_at = time.monotonic()
    statuses: list[int] = []
    latencies: list[float] = []
    written: list[tuple[str, int]] = []
    c_down_at: float | None = None
    with ThreadPoolExecutor(max_workers=8) as pool, sampler:
        # a round of 4 concurrent writes every ~0.5 s, through C's detection and 3 s past it (≤ 45 s)
        while time.monotonic() - frozen_at < 45:
            batch = [next(owned_by_c) for _ in range(4)]
            started = time.monotonic()
            results = list(pool.map(lambda t: timed_call("POST", _register_url(cluster, a, *t), timeout=15), batch))
            for tag, (status, _text, took) in zip(batch, results, strict=True):
                statuses.append(status)
                latencies.append(took)
                if status == 200:
                    written.append(tag)
            if c_down_at is None and cluster.member_states(a).get(cluster.addr(c)) == "DOWN":
                c_down_at = time.monotonic()
            if c_down_at is not None and time.monotonic() - c_down_at > 3:
                break
            time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))

    if part is not None:
        part.heal()
    else:
        thaw(cluster.nodes[c])
    thawed_at = time.monotonic()
    poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)), 60,
               what="every node to see every member UP again")
    up_again = time.monotonic() - thawed_at
    # A and B hold every write that succeeded. (That C gets them too is item 3's test: today the
    # writes accepted while C was DOWN never reach it.)
    poll_until(lambda: all(set(written) <= cluster.instance_ips(i, "hung") for i in (0, 1)), 30,
               what="every written instance on A and B")
    agreed = time.monotonic() - thawed_at
    rss_after = rss_kb(cluster.nodes[a].pid)
    failures = [s for s in statuses if s != 200]
    logs = sum(tracebacks(cluster.nodes[i].log()) for i in range(3))
    print(f"fault 2 ({hang}): A's RSS {rss_before // 1024} MB before, {sampler.peak_kb // 1024} MB peak, "
          f"{rss_after // 1024} MB after")
    print(f"fault 2 ({hang}): {len(statuses)} writes while C was hung, {len(failures)} failed "
          f"{sorted(set(failures))}; "
          f"latency max {max(latencies):.2f} s; C DOWN on A after "
          f"{(c_down_at - frozen_at) if c_down_at else float('nan'):.1f} s; "
          f"all UP {up_again:.1f} s and agreed {agreed:.1f} s after SIGCONT; tracebacks {logs}")
    assert c_down_at is not None, "A never marked the stopped node DOWN"
    assert failures == []
    assert logs == 0
