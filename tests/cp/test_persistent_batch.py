"""The persistent batch is one CP store txn: all of it or none, on a real three-member etcd.

Two "nodes" (a registry, its views and its PersistentNaming each) on different members of one
managed etcd cluster: what node A writes as a batch reaches node B's watch whole, a batch the
store refuses part-way leaves nothing, and a batch worked out from a stale view is not applied
half (docs/protocol.md §3.5)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shoal.cp.etcd import EtcdError, EtcdStore
from shoal.cp.store import CpView, EventKind, Keyspace, json_codec
from shoal.cp.supervisor import EtcdSupervisor
from shoal.errors import CpUnavailable, InvalidParam
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.service_layer.ephemeral import with_instance_id
from shoal.service_layer.persistent import MAX_BATCH, PersistentNaming, instance_doc, instance_name
from shoal.testing import Registry, make_registry
from shoal.testing.etcd import managed_cluster
from shoal.testing.wait import wait_until

from .test_contract import Collector

SVC = ServiceKey("public", "DEFAULT_GROUP", "db")
INSTANCES = Keyspace.INSTANCES


@dataclass
class Node:
    registry: Registry
    store: EtcdStore
    instances: CpView[Any]
    services: CpView[Any]
    persistent: PersistentNaming

    def ips(self) -> set[str]:
        return {h["ip"] for h in json.loads(self.registry.naming.reads.query(SVC))["hosts"]}


async def _node(member: EtcdSupervisor) -> Node:
    """A node whose store talks to this one member only, so A and B really use different members."""
    store = EtcdStore([member.me.endpoint], request_timeout_ms=3000, backoff_max_ms=300)
    await store.start()
    registry = make_registry(store=store, metadata_max_length=4_000_000)  # room for a value etcd refuses
    node = Node(registry, store, registry.instance_view, registry.service_view, registry.naming.persistent)
    registry.start_views()
    await registry.instance_view.wait_ready(30)
    await registry.service_view.wait_ready(30)
    return node


async def _stop(node: Node) -> None:
    await node.instances.stop()
    await node.services.stop()
    await node.store.close()


async def _answers(node: Node) -> bool:
    try:
        await node.store.put(Keyspace.META.key("probe"), b"1")
    except CpUnavailable:
        return False
    return True


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    members = managed_cluster(tmp_path, 3, restart_initial_ms=100, restart_max_ms=1000)
    made: list[Node] = []
    try:
        for member in members:
            await member.start()
        for member in members:
            await member.wait_listening(30)
        made.append(await _node(members[0]))
        made.append(await _node(members[1]))
        for node in made:
            await wait_until(lambda n=node: _answers(n), 30, "a write through each member")  # type: ignore[misc]
        yield made[0], made[1]
    finally:
        for node in made:
            await _stop(node)
        for member in members:
            await member.stop()


def batch(count: int, first: int = 1) -> list[InstanceInfo]:
    return [InstanceInfo(f"10.1.{i // 250}.{i % 250 + 1}", 5432, metadata={"n": str(i)})
            for i in range(first, first + count)]


async def test_a_batch_reaches_a_watcher_on_another_member_whole(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    watcher = Collector(b.store, INSTANCES.prefix, b.instances.revision + 1)
    try:
        instances = batch(MAX_BATCH)
        await a.persistent.batch_register(SVC, instances)
        assert len(a.ips()) == MAX_BATCH  # the writer's own view has all of it on return
        await wait_until(lambda: len(b.ips()) == MAX_BATCH, 15, "the batch listed on B")
        await wait_until(lambda: len(watcher.events()) >= MAX_BATCH, 15, "the batch's events on B's watch")
        events = watcher.events()
        assert sorted(e[1] for e in events) == sorted(INSTANCES.key(instance_name(SVC, "DEFAULT", i.ip, i.port))
                                                      for i in instances)
        assert {e[0] for e in events} == {EventKind.PUT}
        assert len({e[3] for e in events}) == 1  # one etcd revision: one txn, never seen half-applied

        await a.persistent.batch_deregister(SVC, instances[: MAX_BATCH // 2])
        await wait_until(lambda: len(b.ips()) == MAX_BATCH - MAX_BATCH // 2, 15, "the removal listed on B")
        await wait_until(lambda: len(watcher.events()) >= MAX_BATCH + MAX_BATCH // 2, 15, "the removal's events")
        removed = [e for e in watcher.events() if e[0] is EventKind.DELETE]
        assert len(removed) == MAX_BATCH // 2 and len({e[3] for e in removed}) == 1

        with pytest.raises(InvalidParam, match=f"at most {MAX_BATCH}"):
            await a.persistent.batch_register(SVC, batch(MAX_BATCH + 1, 1000))
        assert len((await a.store.range(INSTANCES.prefix)).items) == MAX_BATCH - MAX_BATCH // 2
    finally:
        await watcher.stop()


async def test_a_batch_the_store_refuses_part_way_writes_nothing(nodes: tuple[Node, Node]) -> None:
    """etcd refuses a request over --max-request-bytes (1.5 MiB): one instance of the batch with
    huge metadata. Written key by key, the others would have been stored; as one txn, none is."""
    a, b = nodes
    huge = InstanceInfo("10.2.0.99", 5432, metadata={"blob": "x" * 2_000_000})
    with pytest.raises(EtcdError, match="too large"):
        await a.persistent.batch_register(SVC, [*batch(10), huge])
    assert (await a.store.range(INSTANCES.prefix)).items == ()
    await a.persistent.batch_register(SVC, batch(10))  # the store still takes the rest
    await wait_until(lambda: len(b.ips()) == 10, 15, "the smaller batch on B")


async def test_a_batch_worked_out_from_a_stale_view_is_applied_whole(nodes: tuple[Node, Node]) -> None:
    """A's view lags (stopped here): it still holds an instance B has since changed. The batch
    puts only what A's view says changed, under compares of every key it read: the first txn fails
    on that key and writes nothing; the next, worked out from what etcd reported, stores the
    whole batch, the instance B changed included."""
    a, b = nodes
    x, y = InstanceInfo("10.3.0.1", 5432), InstanceInfo("10.3.0.2", 5432)
    await a.persistent.batch_register(SVC, [x])
    await wait_until(lambda: b.ips() == {"10.3.0.1"}, 15, "x on B")
    await a.instances.stop()
    await b.persistent.batch_register(SVC, [InstanceInfo("10.3.0.1", 5432, weight=5.0)])
    watcher = Collector(b.store, INSTANCES.prefix, b.instances.revision + 1)
    try:
        await a.persistent.batch_register(SVC, [x, y])
        decode, _ = json_codec()
        stored = {kv.key: decode(kv.value) for kv in (await a.store.range(INSTANCES.prefix)).items}
        assert stored == {INSTANCES.key(instance_name(SVC, "DEFAULT", i.ip, i.port)):
                          instance_doc(SVC, with_instance_id(SVC, i)) for i in (x, y)}
        await wait_until(lambda: len(watcher.events()) == 2, 15, "the batch's two events")
        assert len({e[3] for e in watcher.events()}) == 1
    finally:
        await watcher.stop()
