"""Serving a snapshot page of a large client: byte-exact records, and nothing per instance kept alive."""

from __future__ import annotations

import asyncio
import gc
import json

from shoal.distro import records
from shoal.distro.snapshot import INSTANCES_PER_SLICE, split_page
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import SimCluster


def _big_client(instances: int) -> Client:
    """One connection client: an empty service, a one-instance one, and a batch of ``instances``."""
    batch = tuple(InstanceInfo(f"10.1.{i // 250}.{i % 250}", 1000 + i % 250, weight=1.5, healthy=i % 3 != 0,
                               cluster="c1", instance_id=f"id-{i}", metadata={"app": "bulk", "zone": "é"})
                  for i in range(instances))
    publications = {
        ServiceKey("public", "G", "empty"): Publication((), batch=True),
        ServiceKey("public", "G", "one"): Publication((InstanceInfo("10.0.0.1", 80),)),
        ServiceKey("ns-ü", "G2", "many"): Publication(batch, batch=True),
    }
    return Client("conn-1", ClientKind.CONNECTION, native=True, created_ms=0, revision=7, publications=publications)


def test_record_pieces_concatenate_to_the_kernels_encoding() -> None:
    client = _big_client(2_500)
    pieces = list(records.client_record_parts(client.client_id, client.revision,
                                              list(client.publications.items()), 1_000))
    assert max(n for n, _ in pieces) <= 1_000
    assert sum(n for n, _ in pieces) == 2_501
    assert records.batch_bytes([b"".join(p for _, p in pieces)]) == records.encode([records.client_record(client)])
    assert records.batch_bytes([]) == records.encode([])
    parts = [p for _, p in pieces]
    page = b"".join(records.page_pieces([("10.0.0.1:8848", [parts, parts[:1] + parts[1:]]), ("10.0.0.2:8848", [])]))
    assert page == records.encode_page([("10.0.0.1:8848", records.batch_bytes([b"".join(parts)] * 2)),
                                        ("10.0.0.2:8848", records.encode([]))])


async def test_serving_a_large_client_keeps_no_per_instance_objects_alive() -> None:
    """A page is built from encoded slices: the net count of live GC-tracked objects stays
    within a slice or two while a 60,000-instance client is served (building the whole record
    first left 60,000 instance tuples alive across collections and made them old)."""
    instances = 60_000
    cluster = SimCluster(2)
    node = cluster[0]
    client = node.connect("conn-1")
    node.clients.replace(client, _big_client(instances).publications, now_ms=0)
    expected = records.client_record(client)
    server = node.distro.snapshots
    peak = [0]
    serving = asyncio.Event()

    async def watch(base: int) -> None:
        while not serving.is_set():
            peak[0] = max(peak[0], gc.get_count()[0] - base)
            await asyncio.sleep(0)

    gc.collect()
    gc.disable()  # so gen0's count is the net of tracked allocations since the collection
    try:
        watcher = asyncio.create_task(watch(gc.get_count()[0]))
        await asyncio.sleep(0)
        body = await server.page(json.dumps({"session": "", "offset": 0}).encode())
        serving.set()
        await watcher
    finally:
        gc.enable()
    header, groups = split_page(body)
    assert header["done"] is True
    decoded = [record for _owner, batch in groups for record in records.decode(batch)]
    assert decoded == [expected]
    assert peak[0] < 4 * INSTANCES_PER_SLICE < instances
