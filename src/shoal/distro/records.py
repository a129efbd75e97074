"""Client ⇄ sync record (the syncser kernel's tuples, or each service as its bytes), and the
snapshot page framing.

A record's services come in two forms. As tuples (:func:`client_record`, :func:`decode`, snapshot
pages), or as their encodings (:func:`wire_record`, :func:`split`): a client's record carries every
publication of the client, so a change of one of them would otherwise rebuild and re-encode all of
them on the owner, and decode, rebuild and compare all of them on every copy. Each publication
memoises its encoding (``Publication.sync_wire``; publications are replaced, never changed), the
owner joins the memos, and a copy decodes only the services whose bytes differ from what it holds.
Both forms encode to the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import cast

from shoal.kernels import syncser
from shoal.kernels.syncser import InstanceRecord, ServiceTuple, SplitRecord
from shoal.kernels.syncser_layout import (
    CLIENT_SERVICES,
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

#: A sync record either way: services as tuples (the kernel's ``ClientRecord``) or as their bytes.
ClientRecord = syncser.ClientRecord | SplitRecord

__all__ = ["OP_CHANGE", "OP_DELETE", "ClientRecord", "batch_bytes", "client_record", "client_record_parts", "decode",
           "encode", "split", "wire_record"]


def _instance_records(instances: Iterable[InstanceInfo]) -> list[InstanceRecord]:
    return [
        (i.ip, i.port, float(i.weight), i.healthy, i.enabled, i.cluster, i.instance_id,
         i.metadata if type(i.metadata) is dict else dict(i.metadata), 0)
        for i in instances
    ]


def _service_tuple(key: ServiceKey, publication: Publication) -> ServiceTuple:
    return (key.namespace, key.group, key.name, publication.batch, _instance_records(publication.instances))


def client_record(client: Client, op: int = OP_CHANGE) -> syncser.ClientRecord:
    """A client's full state as one sync record (Nacos ClientSyncData), its services as tuples."""
    if op == OP_DELETE:
        return (OP_DELETE, client.client_id, client.revision, [])
    return (OP_CHANGE, client.client_id, client.revision,
            [_service_tuple(key, publication) for key, publication in client.publications.items()])


def wire_record(client: Client) -> SplitRecord:
    """:func:`client_record` with each service as its encoding (memoised on the publication):
    what the sync engine sends."""
    return (OP_CHANGE, client.client_id, client.revision,
            [memo[1] if (memo := publication.sync_wire) is not None and memo[0] is key  # the memo, inline
             else service_bytes(key, publication) for key, publication in client.publications.items()])


# A batch of one record of one service is these bytes and then the service's encoding.
_SERVICE_AT = len(MAGIC) + 1 + 1 + 4  # magic, version, count 1; op, "" client id, revision 0, 1 service
_ONE_SERVICE_HEAD = syncser.encode_batch([(OP_CHANGE, "", 0, [("", "", "", False, [])])])[:_SERVICE_AT]


def service_bytes(key: ServiceKey, publication: Publication) -> bytes:
    """The encoding of ``publication`` as the service ``key`` of a record, memoised on it."""
    memo = publication.sync_wire
    if memo is not None and memo[0] == key:
        return memo[1]
    data = syncser.encode_batch([(OP_CHANGE, "", 0, [_service_tuple(key, publication)])])[_SERVICE_AT:]
    publication.sync_wire = (key, data)
    return data


def decode_service(data: bytes) -> ServiceTuple:
    """One service's encoding (an item of a :func:`split` record) decoded and checked in full."""
    return syncser.decode_batch(_ONE_SERVICE_HEAD + data)[0][CLIENT_SERVICES][0]


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
    encoding twice). For tuples it runs about 1.4 to 1.6 times the encoding; a service given as
    bytes counts twice its length, so the sync engine, which adds a record to a batch before it
    checks the bound, keeps the same margin under it as with tuples."""
    _op, client_id, _revision, services = record
    return 64 + len(client_id) + sum(
        2 * len(service) if isinstance(service, bytes)
        else 48 + sum(80 + 32 * len(instance[INSTANCE_METADATA]) for instance in service[SERVICE_INSTANCES])
        for service in services)


def delete_record(client_id: str) -> ClientRecord:
    return (OP_DELETE, client_id, 0, [])


def publications_of(record: ClientRecord,
                    held: Mapping[ServiceKey, Publication] | None = None) -> dict[ServiceKey, Publication]:
    """The publications a change record carries. A service whose bytes equal the memo of what
    ``held`` (the copy's current publications) publishes for it keeps that very Publication: an
    unchanged service is neither decoded nor built again. A service decoded here is checked in
    full (:class:`~shoal.kernels.syncser.SyncDecodeError`), and memoises its bytes."""
    _op, _client_id, _revision, services = record
    out: dict[ServiceKey, Publication] = {}
    known: dict[bytes, tuple[ServiceKey, Publication]] = {}
    if held:
        for key, publication in held.items():
            memo = publication.sync_wire
            if memo is not None and (memo[0] is key or memo[0] == key):
                known[memo[1]] = (key, publication)
    for service in services:
        wire: bytes | None = None
        if isinstance(service, bytes):
            hit = known.get(service)
            if hit is not None:
                out[hit[0]] = hit[1]
                continue
            wire = service
            service = decode_service(service)
        namespace, group, name, batch, instances = service
        key = ServiceKey(namespace, group, name)
        publication = out[key] = Publication(
            tuple(InstanceInfo(ip, port, weight, healthy, enabled, cluster, instance_id, metadata)
                  for ip, port, weight, healthy, enabled, cluster, instance_id, metadata, _beat in instances),
            batch,
        )
        # memoised only as this node would encode it (its records carry no beat times)
        if wire is not None and all(instance[INSTANCE_LAST_BEAT] == 0 for instance in instances):
            publication.sync_wire = (key, wire)
    return out


def kind_of(client_id: str) -> ClientKind:
    """Connection ids never contain ``#``; ip:port clients are ``ip:port#true``."""
    return ClientKind.IP_PORT if "#" in client_id else ClientKind.CONNECTION


def encode(records: Sequence[ClientRecord]) -> bytes:
    """One batch of records, each in either form (all its services as tuples, or all as bytes):
    the same bytes for the same content."""
    if not any(isinstance(service, bytes) for record in records for service in record[CLIENT_SERVICES][:1]):
        return syncser.encode_batch(cast("list[syncser.ClientRecord]", records))
    parts = [batch_head(len(records))]
    for record in records:
        op, client_id, revision, services = record
        if services and not isinstance(services[0], bytes):
            parts.append(syncser.encode_batch([cast("syncser.ClientRecord", record)])[_BATCH_HEAD + 1:])
            continue
        parts.append(_client_head(op, client_id, revision, len(services)))
        parts.extend(cast("list[bytes]", services))
    return b"".join(parts)


def decode(data: bytes) -> list[ClientRecord]:
    """A batch with its services decoded (as tuples)."""
    return cast("list[ClientRecord]", syncser.decode_batch(data))


def split(data: bytes) -> list[ClientRecord]:
    """A batch with each service left as its bytes (checked in full when
    :func:`publications_of` decodes it)."""
    return cast("list[ClientRecord]", syncser.split_batch(data))


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
