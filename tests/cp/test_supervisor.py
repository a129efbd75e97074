"""Managed etcd: three members planned from one Shoal member list form one cluster, a killed
member comes back, and without a quorum writes fail clearly within the request timeout."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.cp.etcd import EtcdStore
from shoal.cp.store import Keyspace, json_view
from shoal.cp.supervisor import EtcdSupervisor, cluster_token, plan_members
from shoal.errors import CpUnavailable
from shoal.testing.etcd import managed_cluster
from shoal.testing.wait import wait_until

META = Keyspace.META


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[list[EtcdSupervisor]]:
    members = managed_cluster(tmp_path, 3, restart_initial_ms=100, restart_max_ms=1000)
    try:
        for member in members:
            await member.start()
        for member in members:
            await member.wait_listening(30)
        yield members
    finally:
        await asyncio.gather(*(m.stop() for m in members))


async def _store_on(member: EtcdSupervisor, timeout_ms: int = 2000) -> EtcdStore:
    """A client of this one member only (no failover), so the test knows who answers."""
    store = EtcdStore([member.me.endpoint], request_timeout_ms=timeout_ms, backoff_max_ms=300)
    await store.start()
    return store


async def _put(store: EtcdStore, key: str, value: bytes) -> int | None:
    try:
        return await store.put(key, value)
    except CpUnavailable:
        return None


async def test_members_of_one_list_form_one_cluster(cluster: list[EtcdSupervisor]) -> None:
    a, b = await _store_on(cluster[0]), await _store_on(cluster[1])
    try:
        revision = await wait_until(lambda: _put(a, META.key("hello"), b"from a"), 30, "a write via member 0")
        kv = await b.get(META.key("hello"))  # a linearizable read through another member
        assert kv is not None and (kv.value, kv.mod_revision) == (b"from a", revision)
    finally:
        await a.close()
        await b.close()


async def test_a_killed_member_is_restarted_and_serves_again(cluster: list[EtcdSupervisor]) -> None:
    victim = cluster[2]
    pid = victim.pid
    assert pid is not None and victim.starts == 1
    os.kill(pid, signal.SIGKILL)
    await wait_until(lambda: victim.starts == 2 and victim.pid not in (None, pid), 30, "the member restarted")
    store = await _store_on(victim)
    try:
        revision = await wait_until(lambda: _put(store, META.key("after-kill"), b"1"), 30, "a write via it")
        assert revision > 0
    finally:
        await store.close()


async def test_without_a_quorum_writes_fail_within_the_timeout_and_reads_go_on(
        cluster: list[EtcdSupervisor]) -> None:
    survivor = await _store_on(cluster[0], timeout_ms=2000)
    view = json_view(survivor, META)
    view.start()
    try:
        await wait_until(lambda: _put(survivor, META.key("before"), b'"ok"'), 30, "a write with quorum")
        await view.wait_ready(30)
        await wait_until(lambda: view.get("before") == "ok", timeout=15.0, what="the view")
        await cluster[1].stop()
        await cluster[2].stop()
        async with asyncio.timeout(15):  # request timeout 2 s: bounded, never a hang
            with pytest.raises(CpUnavailable):
                await survivor.put(META.key("during"), b'"no"')
            with pytest.raises(CpUnavailable):
                await view.create("during", "no")
        assert view.get("before") == "ok"
        await cluster[1].start()  # quorum again: writes go through
        revision = await wait_until(lambda: _put(survivor, META.key("healed"), b'"yes"'), 30, "a write after healing")
        await view.wait_revision(revision, 30)
        assert view.get("healed") == "yes"
    finally:
        await view.stop()
        await survivor.close()


def test_ports_names_and_token_come_from_the_member_list(tmp_path: Path) -> None:
    members = plan_members([("10.0.0.1", 8848), ("10.0.0.2", 8848), ("10.0.0.3", 8858)])
    assert [(m.client_port, m.peer_port) for m in members] == [(7848, 7849), (7848, 7849), (7858, 7859)]
    assert members[0].name == "shoal-10.0.0.1-8848" and members[2].endpoint == "10.0.0.3:7858"
    assert cluster_token(members) == cluster_token(list(reversed(members)))
    assert cluster_token(members) != cluster_token(members[:2])
    sup = EtcdSupervisor(members[1], members, tmp_path, "/usr/bin/etcd")
    assert sup.endpoints == ["10.0.0.2:7848", "10.0.0.1:7848", "10.0.0.3:7858"]
    cmd = sup.command()
    assert cmd[cmd.index("--initial-cluster") + 1] == (
        "shoal-10.0.0.1-8848=http://10.0.0.1:7849,shoal-10.0.0.2-8848=http://10.0.0.2:7849,"
        "shoal-10.0.0.3-8858=http://10.0.0.3:7859")
    assert cmd[cmd.index("--data-dir") + 1] == str(tmp_path / "cp" / "etcd")
    with pytest.raises(ValueError):
        plan_members([("h", 500)])
    with pytest.raises(ValueError):
        EtcdSupervisor(members[0], members[1:], tmp_path)


async def test_the_member_log_is_rotated_kept_bounded_and_written_on(tmp_path: Path) -> None:
    limit = 4096
    (member,) = managed_cluster(tmp_path, 1, log_max_bytes=limit, log_keep=2, log_check_interval_ms=100,
                                restart_initial_ms=100)
    await member.start()
    try:
        await member.wait_listening(30)
        await wait_until(lambda: member.log_rotations >= 1, 30, "the start-up output rotated")
        for _ in range(2):  # each restart writes more than the limit again
            before, pid = member.log_rotations, member.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            await wait_until(lambda b=before: member.log_rotations > b and member.pid is not None,  # type: ignore[misc]
                             30, "a rotation after the restart")
        await wait_until(lambda: member.log_path.stat().st_size > 0, 30, "etcd writing on in the truncated file")
        assert not member.log_path.read_bytes().startswith(b"\0")  # appended at the new end, no hole
        newest, oldest = member.rotated_log_paths()
        assert newest.stat().st_size > limit and oldest.stat().st_size > limit
        assert not member.log_path.with_name("etcd.log.3").exists()
        store = await _store_on(member)
        try:
            assert await wait_until(lambda: _put(store, META.key("logged"), b"1"), 30, "a write") > 0
        finally:
            await store.close()
    finally:
        await member.stop()
