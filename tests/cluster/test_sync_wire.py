"""Sync records sent as their services' bytes (issue 21's per-write cost): the owner joins each
publication's memoised encoding, and a copy decodes only the services whose bytes differ from
what it holds. The bytes on the wire, the copies and the model events are those of records
built, encoded and decoded in full."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.distro import records
from shoal.kernels.syncser import SyncDecodeError
from shoal.model.events import ClientDeregisteredService, ClientRegisteredService
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import SimCluster

SERVICES = [ServiceKey("public", "G", f"s{i}") for i in range(5)]


def register(cluster: SimCluster, client_id: str, service: ServiceKey, port: int, **kw: Any) -> None:
    node = cluster[0]
    if node.clients.get(client_id) is None:
        node.connect(client_id)
    node.naming.ephemeral.register_instance(client_id, service, InstanceInfo("10.0.0.1", port, **kw))


async def test_the_sent_record_is_the_full_record_in_bytes() -> None:
    cluster = SimCluster(2)
    for i, service in enumerate(SERVICES):
        register(cluster, "c", service, 8000 + i, metadata={"k": str(i)})
    client = cluster[0].clients.get("c")
    assert client is not None
    wire = records.wire_record(client)
    assert all(type(service) is bytes for service in wire[3])
    assert records.encode([wire]) == records.encode([records.client_record(client)])
    mixed = [wire, records.client_record(client), records.delete_record("gone")]
    assert records.encode(mixed) == records.encode([records.client_record(client)] * 2 + [mixed[2]])
    assert records.split(records.encode([wire])) == [wire]
    assert records.wire_record(client)[3][0] is wire[3][0]  # memoised on the publication


async def test_a_copy_keeps_its_unchanged_publications_and_hears_only_of_the_changed() -> None:
    cluster = SimCluster(2)
    for i, service in enumerate(SERVICES):
        register(cluster, "c", service, 8000 + i)
    await cluster.flush()
    copy = cluster[1].clients.get("c")
    assert copy is not None and set(copy.publications) == set(SERVICES)
    before = dict(copy.publications)
    events: list[Any] = []
    cluster[1].bus.subscribe(ClientRegisteredService, events.append)
    cluster[1].bus.subscribe(ClientDeregisteredService, events.append)

    register(cluster, "c", SERVICES[1], 9001, metadata={"v": "2"})  # one publication changes
    cluster[0].naming.ephemeral.deregister_instance("c", SERVICES[4])  # one goes
    await cluster.flush()

    assert [(type(e).__name__, e.service) for e in events] == [
        ("ClientRegisteredService", SERVICES[1]), ("ClientDeregisteredService", SERVICES[4])]
    assert copy.publications.keys() == set(SERVICES[:4])
    assert all(copy.publications[s] is before[s] for s in (SERVICES[0], SERVICES[2], SERVICES[3]))
    changed = copy.publications[SERVICES[1]]
    assert [(i.port, dict(i.metadata)) for i in changed.instances] == [(9001, {"v": "2"})]
    assert copy.revision == cluster[0].clients.get("c").revision  # type: ignore[union-attr]
    assert cluster[1].ports(SERVICES[1]) == [9001]


async def test_a_publication_moved_to_another_service_is_not_taken_for_the_old_one() -> None:
    cluster = SimCluster(2)
    register(cluster, "c", SERVICES[0], 8000)
    await cluster.flush()
    client = cluster[0].clients.get("c")
    copy = cluster[1].clients.get("c")
    assert client is not None and copy is not None
    publication = client.publications[SERVICES[0]]
    # the same Publication object under another service: its memo names the service it was made for
    cluster[0].clients.replace(client, {SERVICES[1]: publication}, 0)
    await cluster.flush()
    assert set(copy.publications) == {SERVICES[1]}
    assert cluster[1].ports(SERVICES[0]) == [] and cluster[1].ports(SERVICES[1]) == [8000]


async def test_a_batch_with_a_service_that_does_not_decode_is_refused_whole() -> None:
    cluster = SimCluster(2)
    register(cluster, "a", SERVICES[0], 8000)
    register(cluster, "b", SERVICES[0], 8001)
    await cluster.flush()
    receiver = cluster[1].distro.sync_receiver
    a = cluster[0].clients.get("a")
    assert a is not None
    register(cluster, "a", SERVICES[2], 8002)
    good = records.wire_record(a)
    # a service whose structure splits but whose metadata repeats a key: only decoding it tells
    bad_service = records.encode([(0, "", 0, [("public", "G", "s3", False, [
        ("10.0.0.1", 8003, 1.0, True, True, "DEFAULT", "id", {"k": "v", "j": "w"}, 0)])])])[10:]
    bad_service = bad_service.replace(b"\x01j\x01w", b"\x01k\x01w")
    body = records.encode([good, (0, "b", 9, [bad_service])])
    assert len(records.split(body)) == 2
    with pytest.raises(SyncDecodeError, match="duplicate"):
        await receiver.handle(cluster.addresses[0], body)
    assert set(cluster[1].clients.get("a").publications) == {SERVICES[0]}  # type: ignore[union-attr]
    assert cluster[1].ports(SERVICES[2]) == []
