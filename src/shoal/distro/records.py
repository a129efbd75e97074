"""Client ⇄ sync record (the syncser kernel's tuples), and the snapshot page framing."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from shoal.kernels import syncser
from shoal.kernels.syncser import ClientRecord, InstanceRecord, ServiceTuple
from shoal.kernels.syncser_layout import INSTANCE_METADATA, SERVICE_INSTANCES
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey

OP_CHANGE = 0
OP_DELETE = 1

__all__ = ["OP_CHANGE", "OP_DELETE", "ClientRecord", "client_record", "decode", "encode"]


def client_record(client: Client, op: int = OP_CHANGE) -> ClientRecord:
    """A client's full state as one sync record (Nacos ClientSyncData)."""
    if op == OP_DELETE:
        return (OP_DELETE, client.client_id, client.revision, [])
    services: list[ServiceTuple] = []
    for key, publication in client.publications.items():
        instances: list[InstanceRecord] = [
            (i.ip, i.port, float(i.weight), i.healthy, i.enabled, i.cluster, i.instance_id,
             i.metadata if type(i.metadata) is dict else dict(i.metadata), 0)
            for i in publication.instances
        ]
        services.append((key.namespace, key.group, key.name, publication.batch, instances))
    return (OP_CHANGE, client.client_id, client.revision, services)


def estimated_size(record: ClientRecord) -> int:
    """A cheap upper-ish estimate of a record's encoded bytes (to bound messages without
    encoding twice)."""
    _op, client_id, _revision, services = record
    return 64 + len(client_id) + sum(
        48 + sum(80 + 32 * len(instance[INSTANCE_METADATA]) for instance in service[SERVICE_INSTANCES])
        for service in services)


def delete_record(client_id: str) -> ClientRecord:
    return (OP_DELETE, client_id, 0, [])


def publications_of(record: ClientRecord) -> dict[ServiceKey, Publication]:
    _op, _client_id, _revision, services = record
    out: dict[ServiceKey, Publication] = {}
    for namespace, group, name, batch, instances in services:
        out[ServiceKey(namespace, group, name)] = Publication(
            tuple(InstanceInfo(ip, port, weight, healthy, enabled, cluster, instance_id, metadata)
                  for ip, port, weight, healthy, enabled, cluster, instance_id, metadata, _beat in instances),
            batch,
        )
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


def decode_page(data: bytes) -> list[tuple[str, bytes]]:
    groups: list[tuple[str, bytes]] = []
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if pos + _GROUP_HEAD.size > len(view):
            raise syncser.SyncDecodeError("truncated snapshot page header")
        owner_len, batch_len = _GROUP_HEAD.unpack_from(view, pos)
        pos += _GROUP_HEAD.size
        end = pos + owner_len + batch_len
        if end > len(view):
            raise syncser.SyncDecodeError("truncated snapshot page group")
        try:
            owner = bytes(view[pos:pos + owner_len]).decode()
        except UnicodeDecodeError:
            raise syncser.SyncDecodeError("bad owner address in snapshot page") from None
        groups.append((owner, bytes(view[pos + owner_len:end])))
        pos = end
    return groups
