"""Member lists: parsing, cluster.conf reload, self detection, suspicion before death."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shoal.config import Config
from shoal.distro.members import MemberManager, MemberState, parse_member_list, read_cluster_conf
from shoal.errors import ConfigError
from shoal.testing import OPEN_SETTINGS, SimCluster


def test_cluster_conf_format(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.conf"
    conf.write_text("# the cluster\n10.0.0.1:8848\n10.0.0.2   # default port\n\n10.0.0.3:9000,10.0.0.4:8848\n")
    assert read_cluster_conf(conf) == [("10.0.0.1", 8848), ("10.0.0.2", 8848), ("10.0.0.3", 9000),
                                       ("10.0.0.4", 8848)]
    with pytest.raises(ConfigError, match="bad cluster member"):
        parse_member_list("10.0.0.1:notaport")


def test_self_is_found_by_port_and_local_address() -> None:
    members = [("10.9.9.9", 8848), ("127.0.0.1", 8848), ("127.0.0.1", 8849)]
    manager = MemberManager.from_list(members, 8849, lambda: 0)
    assert manager.self_address == "127.0.0.1:8849"
    assert sorted(manager.peers) == ["10.9.9.9:8848", "127.0.0.1:8848"]
    assert MemberManager.from_list(members, 8848, lambda: 0, self_ip="10.9.9.9").self_address == "10.9.9.9:8848"
    with pytest.raises(ConfigError, match="not in the member list"):
        MemberManager.from_list([("10.9.9.9", 8848)], 8848, lambda: 0)


async def test_cluster_conf_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.conf"
    conf.write_text("10.9.0.1:8848\n10.9.0.2:8848\n")
    cluster = SimCluster(2, cluster_conf=str(conf), **OPEN_SETTINGS)
    node = cluster[0]
    await node.distro.reload_cluster_conf()
    assert sorted(node.members.peers) == ["10.9.0.2:8848"]
    conf.write_text("10.9.0.1:8848\n10.9.0.2:8848\n10.9.0.3:8848\n")
    import os
    os.utime(conf, ns=(10**18, 10**18))
    await node.distro.reload_cluster_conf()
    assert sorted(node.members.peers) == ["10.9.0.2:8848", "10.9.0.3:8848"]
    assert node.members.peers["10.9.0.3:8848"].state is MemberState.UP
    conf.write_text("oops:port\n")
    os.utime(conf, ns=(2 * 10**18, 2 * 10**18))
    await node.distro.reload_cluster_conf()  # a broken file keeps the current members
    assert len(node.members.peers) == 2


def test_auth_in_a_cluster_requires_a_cluster_identity() -> None:
    with pytest.raises(ConfigError, match="identity"):
        dataclasses.replace(Config(), auth_enabled=True, members="127.0.0.1:8848,127.0.0.1:8858").validate()
    dataclasses.replace(Config(), auth_enabled=True, members="127.0.0.1:8848,127.0.0.1:8858",
                        cluster_identity_key="k", cluster_identity_value="v").validate()


# --- a peer's state follows our own calls to it -----------------------------
def _report_body(node_address: str) -> bytes:
    return b'{"node":{"address":"' + node_address.encode() + b'"}}'


async def test_reports_from_a_peer_we_cannot_reach_do_not_keep_it_up() -> None:
    """An asymmetric partition: C's reports reach A, A's calls to C fail. C must still go DOWN
    (its reports used to reset its failure count, so it never did)."""
    from shoal.distro.members import REPORT_REQUEST

    cluster = SimCluster(3, member_fail_access_cnt=2)
    a, c = cluster[0], cluster.addresses[2]
    cluster.network.partition(a.address, c)  # A's calls to C time out
    for _ in range(4):
        await a.distro.report_round()
        await a.distro.dispatch(c, REPORT_REQUEST, _report_body(c))  # ... while C's reports arrive
        await a.distro.reporter.stop()  # (the report back they trigger fails too)
    assert a.members.peers[c].state is MemberState.DOWN


async def test_a_report_from_a_down_peer_brings_it_back_after_one_round_trip() -> None:
    from shoal.distro.members import REPORT_REQUEST

    cluster = SimCluster(2)
    a, b = cluster[0], cluster.addresses[1]
    a.members.report_failed(b, refused=True)
    assert a.members.peers[b].state is MemberState.DOWN
    await a.distro.dispatch(b, REPORT_REQUEST, _report_body(b))  # B restarted and reports
    assert a.members.peers[b].state is MemberState.DOWN  # its word alone does not make it UP ...
    probes = list(a.distro.reporter._probes.values())
    assert probes
    await probes[0]  # ... our report back to it does
    assert a.members.peers[b].state is MemberState.UP


def test_a_failure_of_a_call_begun_before_the_last_success_is_stale() -> None:
    """A call in flight across a peer's restart, or refused by a channel still in reconnect
    back-off, fails after the peer already answered again: it must not take it DOWN."""
    manager = MemberManager("10.9.0.1", 8848, lambda: 0, fail_access_cnt=1)
    manager.set_members([("10.9.0.1", 8848), ("10.9.0.2", 8848)])
    peer = "10.9.0.2:8848"
    before = manager.attempt(peer)
    manager.report_succeeded(peer)
    manager.report_failed(peer, refused=True, attempt=before)
    assert manager.peers[peer].state is MemberState.UP and manager.peers[peer].fail_count == 0
    manager.report_failed(peer, refused=True, attempt=manager.attempt(peer))
    assert manager.peers[peer].state is MemberState.DOWN


async def test_the_periodic_report_does_not_wait_for_a_peer_that_does_not_answer() -> None:
    """A hung peer is counted once per interval, not once per interval + timeout."""
    import asyncio

    from shoal.distro.transport import PeerTransport

    release = asyncio.Event()
    cluster = SimCluster(3)
    a, hung, fine = cluster[0], cluster.addresses[1], cluster.addresses[2]
    inner: PeerTransport = a.distro.reporter.transport

    class HangsOne:
        async def call(self, target: str, type_name: str, body: bytes, timeout_ms: int) -> tuple[str, bytes]:
            if target == hung:
                await release.wait()
                raise TimeoutError(f"{target} did not answer")
            return await inner.call(target, type_name, body, timeout_ms)

        async def close(self) -> None:
            return None

    a.distro.reporter.transport = HangsOne()
    a.members.report_failed(fine)
    await a.distro.reporter.report_tick()  # returns while the hung peer's report is in flight
    await a.distro.reporter.report_tick()
    while a.members.peers[fine].state is not MemberState.UP:
        await asyncio.sleep(0)
    assert sum(not t.done() for t in a.distro.reporter._in_flight) == 2  # the hung peer's two reports
    release.set()
    while a.distro.reporter._in_flight:
        await asyncio.sleep(0)
    assert a.members.peers[hung].fail_count == 2
