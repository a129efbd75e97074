"""Client ⇄ sync record (the syncser kernel's tuples), and the snapshot page framing."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping

from shoal.kernels import syncser
from shoal.kernels.syncser import ClientRecord, InstanceRecord, ServiceTuple
from shoal.kernels.syncser_layout import (
    FORMAT_VERSION,
    INSTANCE_LAST_BEAT,
    INSTANCE_METADATA,
    MAGIC,
    SERVICE_INSTANCES,
)
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey

OP_CHANGE = 0
OP_DELETE = 1

__all__ = ["OP_CHANGE", "OP_DELETE", "ClientRecord", "batch_bytes", "client_record", "client_record_parts", "decode",
           "encode"]


def _instance_records(instances: Iterable[InstanceInfo]) -> list[InstanceRecord]:
    return [
        (i.ip, i.port, float(i.weight), i.healthy, i.enabled, i.cluster, i.instance_id,
         i.metadata if type(i.metadata) is dict else dict(i.metadata), 0)
        for i in instances
    ]


def instance_records_of(publication: Publication) -> list[InstanceRecord]:
    """A publication's instances as sync records, memoised on it (publications are replaced,
    never changed). The list is shared: records built from it must not be changed."""
    cached = publication.sync_records
    if cached is None:
        cached = publication.sync_records = _instance_records(publication.instances)
    return cached


def client_record(client: Client, op: int = OP_CHANGE) -> ClientRecord:
    """A client's full state as one sync record (Nacos ClientSyncData)."""
    if op == OP_DELETE:
        return (OP_DELETE, client.client_id, client.revision, [])
    services: list[ServiceTuple] = [
        (key.namespace, key.group, key.name, publication.batch, instance_records_of(publication))
        for key, publication in client.publications.items()
    ]
    return (OP_CHANGE, client.client_id, client.revision, services)


# --- one record as encoded pieces -----------------------------------------------------------
# The batch format (shoal.kernels.syncser_py) is a plain concatenation: a batch is its header and
# count followed by the clients' encodings, a client its head and count followed by its
# services', a service its head and count followed by its instances'. So a large client can be
# encoded a slice of instances at a time, each slice's tuples freed as soon as it is encoded:
# nothing per instance outlives its slice, so building a snapshot page neither holds the loop
# for a whole client nor leaves a million young tuples for the collector to scan and promote.
# The pieces are cut out of the kernel's own encoding of a one-record batch, so the kernel
# stays the only encoder of every field.
_BATCH_HEAD = len(MAGIC) + 1  # magic, version
_EMPTY_CLIENT = 4  # op, "" client id, revision 0, and the service count (1 in the stencils below)
_EMPTY_SERVICE = 4  # three "" strings and is_batch


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def batch_head(n_records: int) -> bytes:
    """What precedes ``n_records`` encoded records in a batch (as :func:`encode` makes)."""
    return MAGIC + bytes([FORMAT_VERSION]) + _uvarint(n_records)


def batch_bytes(encoded_records: list[bytes]) -> bytes:
    """A batch (as :func:`encode` makes) of already encoded records."""
    return b"".join([batch_head(len(encoded_records)), *encoded_records])


def _client_head(op: int, client_id: str, revision: int, n_services: int) -> bytes:
    stencil = syncser.encode_batch([(op, client_id, revision, [])])
    return stencil[_BATCH_HEAD + 1:-1] + _uvarint(n_services)  # batch count 1 .. service count 0


def _service_head(key: ServiceKey, batch: bool, n_instances: int) -> bytes:
    stencil = syncser.encode_batch([(OP_CHANGE, "", 0, [(key.namespace, key.group, key.name, batch, [])])])
    return stencil[_BATCH_HEAD + 1 + _EMPTY_CLIENT:-1] + _uvarint(n_instances)


def _instances_bytes(instances: list[InstanceRecord]) -> bytes:
    stencil = syncser.encode_batch([(OP_CHANGE, "", 0, [("", "", "", False, instances)])])
    return stencil[_BATCH_HEAD + 1 + _EMPTY_CLIENT + _EMPTY_SERVICE + len(_uvarint(len(instances))):]


def client_record_parts(client_id: str, revision: int, publications: list[tuple[ServiceKey, Publication]],
                        instances_per_part: int) -> Iterator[tuple[int, bytes]]:
    """A client's change record (as :func:`client_record`) encoded as (instances, bytes) pieces
    whose concatenation is what :func:`encode` writes for that record inside a batch; no piece
    covers more than ``instances_per_part`` instances. ``publications`` is the caller's copy of
    ``client.publications.items()`` taken with ``revision`` (publications are replaced, never
    mutated, so the copy stays consistent while the pieces are made across loop turns)."""
    yield 0, _client_head(OP_CHANGE, client_id, revision, len(publications))
    for key, publication in publications:
        instances = publication.instances
        yield 0, _service_head(key, publication.batch, len(instances))
        for start in range(0, len(instances), instances_per_part):
            part = instances[start:start + instances_per_part]
            yield len(part), _instances_bytes(_instance_records(part))


def estimated_size(record: ClientRecord) -> int:
    """A cheap upper-ish estimate of a record's encoded bytes (to bound messages without
    encoding twice)."""
    _op, client_id, _revision, services = record
    return 64 + len(client_id) + sum(
        48 + sum(80 + 32 * len(instance[INSTANCE_METADATA]) for instance in service[SERVICE_INSTANCES])
        for service in services)


def delete_record(client_id: str) -> ClientRecord:
    return (OP_DELETE, client_id, 0, [])


def publications_of(record: ClientRecord,
                    held: Mapping[ServiceKey, Publication] | None = None) -> dict[ServiceKey, Publication]:
    """The publications a change record carries. A service whose record equals what ``held``
    (the copy's current publications) already publishes keeps that very Publication object, so
    an unchanged service is neither turned into instances again nor compared field by field."""
    _op, _client_id, _revision, services = record
    out: dict[ServiceKey, Publication] = {}
    for namespace, group, name, batch, instances in services:
        key = ServiceKey(namespace, group, name)
        if held is not None:
            current = held.get(key)
            if current is not None and current.batch == batch and instance_records_of(current) == instances:
                out[key] = current
                continue
        publication = out[key] = Publication(
            tuple(InstanceInfo(ip, port, weight, healthy, enabled, cluster, instance_id, metadata)
                  for ip, port, weight, healthy, enabled, cluster, instance_id, metadata, _beat in instances),
            batch,
        )
        if all(instance[INSTANCE_LAST_BEAT] == 0 for instance in instances):  # what this node would send
            publication.sync_records = instances
    return out


def kind_of(client_id: str) -> ClientKind:
    """Connection ids never contain ``#``; ip:port clients are ``ip:port#true``."""
    return ClientKind.IP_PORT if "#" in client_id else ClientKind.CONNECTION


def encode(records: list[ClientRecord]) -> bytes:
    return syncser.encode_batch(records)


def decode(data: bytes) -> list[ClientRecord]:
    return syncser.decode_batch(data)


# --- snapshot pages: groups of (owner address, encoded batch) --------------------------------
_GROUP_HEAD = struct.Struct("<HI")


def encode_page(groups: Iterable[tuple[str, bytes]]) -> bytes:
    out = bytearray()
    for owner, batch in groups:
        owner_bytes = owner.encode()
        out += _GROUP_HEAD.pack(len(owner_bytes), len(batch))
        out += owner_bytes
        out += batch
    return bytes(out)


def page_pieces(groups: Iterable[tuple[str, list[list[bytes]]]]) -> list[bytes]:
    """:func:`encode_page` of groups of (owner, records each given as its encoded pieces), as
    pieces to join once: a page of a few large records is copied once, not once per level."""
    out: list[bytes] = []
    for owner, recs in groups:
        owner_bytes = owner.encode()
        head = batch_head(len(recs))
        out.append(_GROUP_HEAD.pack(len(owner_bytes), len(head) + sum(len(p) for rec in recs for p in rec)))
        out.append(owner_bytes)
        out.append(head)
        for rec in recs:
            out.extend(rec)
    return out


def sole_client_id(batch: bytes) -> str | None:
    """The client id of a batch holding exactly one record, read from the record's head without
    decoding the rest (a client with 100,000 instances takes ~70 ms to decode); None for any other
    batch or bytes that do not read as one (a full :func:`decode` judges those)."""
    view = memoryview(batch)
    if len(view) < 7 or bytes(view[:4]) != MAGIC or view[4] != FORMAT_VERSION or view[5] != 1:
        return None
    pos = 7  # past the count (1) and the record's op byte
    length = shift = 0
    while pos < len(view) and shift < 35:
        byte = view[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if pos + length > len(view):
                return None
            try:
                return bytes(view[pos:pos + length]).decode()
            except UnicodeDecodeError:
                return None
    return None


def decode_page(data: bytes) -> list[tuple[str, bytes]]:
    groups, rest = take_groups(b"", data)
    if rest:
        raise syncser.SyncDecodeError("truncated snapshot page " + ("header" if len(rest) < _GROUP_HEAD.size
                                                                   else "group"))
    return groups


def take_groups(tail: bytes, data: bytes) -> tuple[list[tuple[str, bytes]], bytes]:
    """The complete groups of ``tail + data`` (a snapshot stream's bytes), and what is left of an
    incomplete last one (the next page's bytes continue it)."""
    if tail:
        data = b"".join([tail, data])
    groups: list[tuple[str, bytes]] = []
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if pos + _GROUP_HEAD.size > len(view):
            break
        owner_len, batch_len = _GROUP_HEAD.unpack_from(view, pos)
        end = pos + _GROUP_HEAD.size + owner_len + batch_len
        if end > len(view):
            break
        pos += _GROUP_HEAD.size
        try:
            owner = bytes(view[pos:pos + owner_len]).decode()
        except UnicodeDecodeError:
            raise syncser.SyncDecodeError("bad owner address in snapshot page") from None
        groups.append((owner, bytes(view[pos + owner_len:end])))
        pos = end
    return groups, bytes(view[pos:])
