"""Serving a snapshot page of a large client: byte-exact records, nothing per instance kept alive,
and stream pages bounded by ``snapshot.chunk-bytes`` whatever the size of one client."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from shoal.distro import records
from shoal.distro.snapshot import INSTANCES_PER_SLICE, split_header, split_page
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


async def _stream_pages(server: object, request: dict[str, object]) -> list[tuple[dict[str, object], bytes]]:
    pages = []
    for _ in range(10_000):
        body = await server.page(json.dumps(request).encode())  # type: ignore[attr-defined]
        header, page = split_header(body)
        pages.append((header, page))
        if header["done"]:
            return pages
        request = {**request, "session": header["session"], "offset": header["next"]}
    raise AssertionError("the stream did not end")


async def test_stream_pages_cut_a_large_client_at_the_chunk_size() -> None:
    """A client larger than a page is cut across pages (a page of whole clients was the size of
    its largest client, and serving it held the loop for every copy of it); the pages' bytes
    joined are the groups of the whole-client pages, and the loader's take_groups rebuilds them."""
    chunk = 16_384
    cluster = SimCluster(2, snapshot_chunk_bytes=chunk)
    node = cluster[0]
    big = node.connect("conn-1")
    node.clients.replace(big, _big_client(5_000).publications, now_ms=0)
    for i in range(30):
        node.register(f"small-{i}", 2000 + i)
    expected = sorted((records.client_record(c) for c in node.clients.clients.values()), key=lambda r: r[1])
    server = node.distro.snapshots

    pages = await _stream_pages(server, {"session": "", "offset": 0, "stream": True})
    assert len(pages) > 10
    assert all(header["stream"] is True and len(page) <= chunk for header, page in pages)
    tail = b""
    loaded = []
    for _header, page in pages:
        groups, tail = records.take_groups(tail, page)
        loaded += [(owner, record) for owner, batch in groups for record in records.decode(batch)]
    assert tail == b""
    assert {owner for owner, _ in loaded} == {cluster.addresses[0]}
    assert sorted((record for _, record in loaded), key=lambda r: r[1]) == expected

    whole = await _stream_pages(server, {"session": "", "offset": 0})  # a loader without "stream"
    assert "stream" not in whole[0][0] and max(len(page) for _, page in whole) > 10 * chunk
    assert sorted((r for _, page in whole for _o, b in records.decode_page(page) for r in records.decode(b)),
                  key=lambda r: r[1]) == expected


async def test_a_stream_page_is_answered_once() -> None:
    """A request whose offset is not where the session's stream is (a repeated or skipped page)
    is refused: the loader starts over with a new session rather than load a gap."""
    cluster = SimCluster(2, snapshot_chunk_bytes=1_000)
    for i in range(50):
        cluster[0].register(f"c{i}", i)
    server = cluster[0].distro.snapshots
    header, _page = split_header(await server.page(json.dumps({"offset": 0, "stream": True}).encode()))
    assert header["done"] is False and header["next"] == 1_000
    again = json.dumps({"session": header["session"], "offset": 0, "stream": True}).encode()
    with pytest.raises(ValueError, match="offset 0"):
        await server.page(again)


async def test_a_newcomer_loads_a_client_larger_than_a_page() -> None:
    cluster = SimCluster(2, snapshot_chunk_bytes=8_192)
    big = cluster[0].connect("conn-1")
    cluster[0].clients.replace(big, _big_client(3_000).publications, now_ms=0)
    cluster[0].register("small", 80)
    await cluster.flush()
    newcomer = "10.9.0.9:8848"
    for node in cluster.nodes.values():
        node.members.set_members([(a.split(":")[0], 8848) for a in [*cluster.addresses, newcomer]])
    node = cluster.add_node(newcomer, [*cluster.addresses, newcomer], loaded=False)
    await node.distro.load_snapshot()
    assert node.distro.loaded
    assert len(cluster.calls("DistroSnapshotRequest")) > 10  # ~150 KB in pages of 8 KiB
    copy = node.clients.get("conn-1")
    assert copy is not None and copy.owner == cluster.addresses[0]
    assert records.client_record(copy)[3] == records.client_record(big)[3]
    assert node.clients.get("small") is not None


def test_the_sole_client_id_of_a_batch_is_read_without_decoding_it() -> None:
    client = _big_client(10)
    one = records.encode([records.client_record(client)])
    assert records.sole_client_id(one) == "conn-1"
    long_id = (records.OP_CHANGE, "é" * 100, 5, [])
    assert records.sole_client_id(records.encode([long_id])) == "é" * 100
    assert records.sole_client_id(records.encode([long_id, long_id])) is None
    assert records.sole_client_id(records.encode([])) is None
    assert records.sole_client_id(one[:8]) is None
    assert records.sole_client_id(b"garbage") is None
