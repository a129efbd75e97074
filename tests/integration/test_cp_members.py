""""How it is shown", for both etcd modes on three real nodes: a persistent instance
written on A is listed on B and C within a second (external three-member etcd), and one etcd
member killed does not stop persistent writes on any live node; the member comes back and
catches up (managed: the node's supervisor restarts it; external: restarted by hand)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing import OPEN, ServerProcess, poll_until
from shoal.testing.etcd import ExternalEtcdCluster, etcd_pids, healthy, kill_pid, revision
from shoal.testing.nodes import CpCluster
from shoal.testing.openapi import listed_ips, register_persistent

#: A short store deadline so a write sent to a dead member fails over quickly.
CP_FAST = ["-D", "shoal.cp.request-timeout-ms=2000"]
#: How long the cluster may take to elect a new etcd leader and answer the first write after a
#: member loss (the election itself is ~1 s; the box is shared and loaded).
FAILOVER_S = 20.0


@pytest.fixture
def external(tmp_path: Path) -> Iterator[ExternalEtcdCluster]:
    etcd = ExternalEtcdCluster(tmp_path).start()
    try:
        yield etcd
    finally:
        etcd.stop()


def _first_write(node: ServerProcess, service: str, ip: str) -> float:
    """Seconds until ``node`` takes a persistent write (retrying within :data:`FAILOVER_S`)."""
    started = time.monotonic()
    answers: list[tuple[int, str]] = []

    def attempt() -> bool:
        answers.append(register_persistent(node, service, ip))
        return answers[-1][0] == 200

    poll_until(attempt, FAILOVER_S, 0.2, f"a persistent write on {node.addr} after the member loss")
    return time.monotonic() - started


def _writes_continue(nodes: list[ServerProcess], service: str, subnet: str) -> tuple[list[float], set[str]]:
    """One write per node (its first allowed to wait for failover), then three more each that must
    succeed at once; returns the failover times and every IP written."""
    waits = [_first_write(node, service, f"{subnet}.{i}.1") for i, node in enumerate(nodes)]
    written = {f"{subnet}.{i}.1" for i in range(len(nodes))}
    for i, node in enumerate(nodes):
        for n in range(2, 5):
            status, body = register_persistent(node, service, f"{subnet}.{i}.{n}")
            assert status == 200, (node.addr, status, body)
            written.add(f"{subnet}.{i}.{n}")
    return waits, written


def _caught_up(endpoint: str, reference: str) -> bool:
    target = revision(reference, serializable=False)
    return target > 0 and revision(endpoint, serializable=True) >= target


def test_external_etcd_lists_within_a_second_and_survives_a_member_loss(
        tmp_path: Path, external: ExternalEtcdCluster) -> None:
    cluster = CpCluster(tmp_path, 3, ["--cp-endpoints", external.endpoints, *CP_FAST], auth=OPEN)
    try:
        cluster.start_all()
        a, b, c = (cluster.node(i) for i in range(3))
        status, body = register_persistent(a, "shared", "10.7.0.1")
        assert status == 200, body
        written_at = time.monotonic()
        for node in (b, c):
            poll_until(lambda n=node: listed_ips(n, "shared") == {"10.7.0.1"}, 1.0, 0.02,  # type: ignore[misc]
                       f"the persistent instance on {node.addr}")
        visible = time.monotonic() - written_at

        # The first member of every node's endpoint list dies: writes go on through the others.
        lost = external.members[0]
        lost.kill()
        waits, written = _writes_continue([a, b, c], "after-loss", "10.7")
        for node in (a, b, c):
            poll_until(lambda n=node: listed_ips(n, "after-loss") == written, 10, 0.05,  # type: ignore[misc]
                       f"every write listed on {node.addr}")

        # Restarted on its data dir, the member rejoins and applies what it missed.
        lost.start()
        poll_until(lambda: healthy(lost.endpoint), 30, 0.1, "the restarted member healthy")
        poll_until(lambda: _caught_up(lost.endpoint, external.members[1].endpoint), 30, 0.1,
                   "the restarted member caught up")
        status, body = register_persistent(a, "after-rejoin", "10.7.9.1")
        assert status == 200, body
        print(f"external etcd: listed on B and C {visible * 1000:.0f} ms after the write on A; "
              f"first write per node after a member loss {[f'{w:.2f}' for w in waits]} s")
    finally:
        cluster.stop_all()


def test_managed_etcd_member_killed_writes_continue_and_it_catches_up(tmp_path: Path) -> None:
    cluster = CpCluster(tmp_path, 3, CP_FAST, auth=OPEN)
    try:
        cluster.start_all()
        nodes = [cluster.node(i) for i in range(3)]
        status, body = register_persistent(nodes[0], "before", "10.8.0.1")
        assert status == 200, body

        # kill -9 node A's etcd child only; node A stays up
        victim = nodes[0]
        [old_pid] = etcd_pids(victim.data_dir)
        kill_pid(old_pid)
        killed_at = time.monotonic()
        waits, written = _writes_continue(nodes, "after-loss", "10.8")
        for node in nodes:
            poll_until(lambda n=node: listed_ips(n, "after-loss") == written, 10, 0.05,  # type: ignore[misc]
                       f"every write listed on {node.addr}")
        assert victim.alive()

        # The supervisor restarts the member (a new pid) and it catches up with the cluster.
        poll_until(lambda: [p for p in etcd_pids(victim.data_dir) if p != old_pid], 30, 0.1,
                   "the supervisor to restart the member")
        endpoint = f"127.0.0.1:{cluster.ports[0] - 1000}"
        reference = f"127.0.0.1:{cluster.ports[1] - 1000}"
        poll_until(lambda: _caught_up(endpoint, reference), 30, 0.1, "the restarted member caught up")
        back = time.monotonic() - killed_at
        status, body = register_persistent(victim, "after-rejoin", "10.8.9.1")
        assert status == 200, body
        print(f"managed etcd: first write per node after the kill {[f'{w:.2f}' for w in waits]} s; "
              f"member restarted and caught up {back:.1f} s after the kill")
    finally:
        cluster.stop_all()
