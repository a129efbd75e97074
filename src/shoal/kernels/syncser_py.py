"""Client sync batches, bytes in and bytes out: pure-Python twin (the specification) of
``ext/syncser.pyx``.

Distro nodes replicate their own clients to peers (Nacos ``DistroClientDataProcessor`` /
``ClientSyncData``) as batches of :data:`ClientRecord` tuples. Both implementations produce
byte-identical output and accept exactly the same inputs.

Wire format, version 1 (all integers little-endian)::

    batch    = magic "SHSY" | version u8 (=1) | n_clients uvarint | client * n_clients
    client   = op u8 | client_id str | revision uvarint (< 2**63) | n_services uvarint
               | service * n_services
    service  = namespace str | group str | service str | is_batch u8 (0 or 1)
               | n_instances uvarint | instance * n_instances
    instance = ip str | port u16 | weight f64 (IEEE-754 binary64) | flags u8
               | cluster str | instance_id str | n_metadata uvarint | (key str | value str) * n_metadata
               | last_beat_ms svarint
    str      = n_bytes uvarint | UTF-8 bytes
    flags    = bit 0 healthy, bit 1 enabled; the other bits are 0
    uvarint  = unsigned LEB128: 7 bits per byte, least significant group first, high bit set on
               every byte but the last; at most 10 bytes, value < 2**64, minimal (the last byte
               of a multi-byte varint is not 0)
    svarint  = zigzag-mapped signed int64 (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...) as a uvarint

Metadata pairs are written in the dict's iteration order. The encoding is canonical: a decoder
rejects anything the encoder cannot produce (non-minimal varints, flag bits other than 0 and 1,
duplicate metadata keys, trailing bytes ...), so ``encode_batch(decode_batch(b)) == b`` whenever
``decode_batch(b)`` succeeds. Every malformed input raises :class:`SyncDecodeError`; a count is
checked against the bytes left (each item has a minimum encoded size) before anything is built.

``split_batch`` reads a batch as ``decode_batch`` does but leaves each service as its encoded
bytes (a ``bytes`` slice of the batch): it checks the batch's whole structure (magic, version,
every count against the bytes left, every varint, every string's length, the flag and is_batch
bytes, no trailing bytes) and decodes the client ids, but neither the UTF-8 of a service's strings
nor its metadata keys' uniqueness. A batch is one ``decode_batch`` accepts exactly when
``split_batch`` accepts it and ``decode_batch`` accepts each of its services put in a batch of
their own (:func:`shoal.distro.records.decode_service`); the services are then equal. So a
receiver can tell an unchanged service by its bytes alone and decode only the others.

Encoding checks types as it goes: ``TypeError`` for a wrongly typed field (records and list fields
must be tuples and lists/tuples; strings ``str``; flags ``bool``; weight a ``float`` or an
``int``, written as a double; metadata a ``dict`` of ``str``),
``ValueError`` for a wrong tuple arity or an out-of-range number (op 0..255, revision
0..2**63-1, port 0..65535, last_beat_ms a signed int64) or a string that is not encodable as
UTF-8 (``UnicodeEncodeError``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

from shoal.kernels.syncser_layout import (
    FORMAT_VERSION,
    MAGIC,
    ClientRecord,
    InstanceRecord,
    ServiceTuple,
    SplitRecord,
    SyncDecodeError,
)

S = TypeVar("S")

__all__ = ["ClientRecord", "InstanceRecord", "ServiceTuple", "SplitRecord", "SyncDecodeError", "decode_batch",
           "encode_batch", "split_batch"]


_HEADER = MAGIC + bytes([FORMAT_VERSION])
_U64_MAX = (1 << 64) - 1
_REVISION_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# Smallest encoded size of each item, to bound counts by the bytes left.
MIN_CLIENT = 4  # op, client_id length, revision, n_services
MIN_SERVICE = 5  # three string lengths, is_batch, n_instances
MIN_INSTANCE = 16  # ip length, port (2), weight (8), flags, cluster, instance_id, n_metadata, last_beat
MIN_METADATA = 2  # key length, value length

_PORT_WEIGHT = struct.Struct("<Hd")


# -- encoding -----------------------------------------------------------------------------------


def _put_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_str(out: bytearray, value: object, what: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, got {type(value).__name__}")
    data = value.encode("utf-8")
    _put_uvarint(out, len(data))
    out += data


def _check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be bool, got {type(value).__name__}")
    return value


def _check_int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{what} out of range [{low}, {high}]: {value}")
    return value


def _check_tuple(value: object, arity: int, what: str) -> tuple[object, ...]:
    if not isinstance(value, tuple):
        raise TypeError(f"{what} must be a tuple, got {type(value).__name__}")
    if len(value) != arity:
        raise ValueError(f"{what} must have {arity} fields, got {len(value)}")
    return value


def _check_list(value: object, what: str) -> list[object] | tuple[object, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list or tuple, got {type(value).__name__}")
    return value


def _put_instance(out: bytearray, instance: object) -> None:
    ip, port, weight, healthy, enabled, cluster, instance_id, metadata, last_beat = _check_tuple(
        instance, 9, "instance record"
    )
    _put_str(out, ip, "ip")
    port = _check_int(port, 0, 0xFFFF, "port")
    if isinstance(weight, float):
        value = weight
    elif isinstance(weight, int):
        try:
            value = float(weight)
        except OverflowError:
            raise ValueError(f"weight too large for a double: {weight}") from None
    else:
        raise TypeError(f"weight must be float, got {type(weight).__name__}")
    out += _PORT_WEIGHT.pack(port, value)
    flags = _check_bool(healthy, "healthy") | (_check_bool(enabled, "enabled") << 1)
    out.append(flags)
    _put_str(out, cluster, "cluster")
    _put_str(out, instance_id, "instance_id")
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    _put_uvarint(out, len(metadata))
    for key, item in metadata.items():
        _put_str(out, key, "metadata key")
        _put_str(out, item, "metadata value")
    last_beat = _check_int(last_beat, _INT64_MIN, _INT64_MAX, "last_beat_ms")
    _put_uvarint(out, ((last_beat << 1) ^ (last_beat >> 63)) & _U64_MAX)  # zigzag


def _put_service(out: bytearray, service: object) -> None:
    namespace, group, name, is_batch, instances = _check_tuple(service, 5, "service record")
    _put_str(out, namespace, "namespace")
    _put_str(out, group, "group")
    _put_str(out, name, "service")
    out.append(_check_bool(is_batch, "is_batch"))
    instances = _check_list(instances, "instances")
    _put_uvarint(out, len(instances))
    for instance in instances:
        _put_instance(out, instance)


def encode_batch(records: Sequence[ClientRecord]) -> bytes:
    """Encode client records (a list or tuple of :data:`ClientRecord`) into one batch."""
    items = _check_list(records, "records")
    out = bytearray(_HEADER)
    _put_uvarint(out, len(items))
    for record in items:
        op, client_id, revision, services = _check_tuple(record, 4, "client record")
        out.append(_check_int(op, 0, 0xFF, "op"))
        _put_str(out, client_id, "client_id")
        _put_uvarint(out, _check_int(revision, 0, _REVISION_MAX, "revision"))
        services = _check_list(services, "services")
        _put_uvarint(out, len(services))
        for service in services:
            _put_service(out, service)
    return bytes(out)


# -- decoding -----------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def need(self, n: int) -> int:
        """Advance past ``n`` bytes and return where they start."""
        start = self.pos
        if n > self.end - start:
            raise SyncDecodeError(f"truncated batch: need {n} bytes at offset {start}")
        self.pos = start + n
        return start

    def u8(self) -> int:
        return self.buf[self.need(1)]

    def uvarint(self) -> int:
        start = self.pos
        value = 0
        shift = 0
        while True:
            byte = self.u8()
            if shift == 63 and byte > 1:
                raise SyncDecodeError(f"varint at offset {start} exceeds 64 bits")
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if byte == 0 and shift:
                    raise SyncDecodeError(f"non-minimal varint at offset {start}")
                return value
            shift += 7

    def count(self, min_size: int, what: str) -> int:
        n = self.uvarint()
        if n > (self.end - self.pos) // min_size:
            raise SyncDecodeError(f"{what} count {n} exceeds the {self.end - self.pos} bytes left")
        return n

    def string(self) -> str:
        n = self.uvarint()
        start = self.need(n)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SyncDecodeError(f"invalid UTF-8 at offset {start}: {exc.reason}") from None


    def skip_string(self) -> None:
        self.need(self.uvarint())


def _read_instance(r: _Reader) -> InstanceRecord:
    ip = r.string()
    port, weight = _PORT_WEIGHT.unpack_from(r.buf, r.need(10))
    flags = r.u8()
    if flags > 3:
        raise SyncDecodeError(f"unknown instance flag bits {flags:#x} at offset {r.pos - 1}")
    cluster = r.string()
    instance_id = r.string()
    n_metadata = r.count(MIN_METADATA, "metadata")
    metadata: dict[str, str] = {}
    for _ in range(n_metadata):
        key = r.string()
        metadata[key] = r.string()
    if len(metadata) != n_metadata:
        raise SyncDecodeError("duplicate metadata key")
    zigzag = r.uvarint()
    last_beat = (zigzag >> 1) ^ -(zigzag & 1)
    return (ip, port, weight, bool(flags & 1), bool(flags & 2), cluster, instance_id, metadata, last_beat)


def _read_service(r: _Reader) -> ServiceTuple:
    namespace = r.string()
    group = r.string()
    name = r.string()
    is_batch = r.u8()
    if is_batch > 1:
        raise SyncDecodeError(f"is_batch must be 0 or 1, got {is_batch} at offset {r.pos - 1}")
    n_instances = r.count(MIN_INSTANCE, "instance")
    instances = [_read_instance(r) for _ in range(n_instances)]
    return (namespace, group, name, bool(is_batch), instances)


def _records(data: bytes | bytearray | memoryview,
             service: Callable[[_Reader], S]) -> list[tuple[int, str, int, list[S]]]:
    """Walk one batch's header and clients, reading each service with ``service``;
    :class:`SyncDecodeError` on any malformed input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, bytearray or memoryview, got {type(data).__name__}")
    r = _Reader(bytes(data))
    if r.end < len(_HEADER) or r.buf[:4] != MAGIC:
        raise SyncDecodeError("not a sync batch (bad magic)")
    if r.buf[4] != FORMAT_VERSION:
        raise SyncDecodeError(f"unsupported sync batch version {r.buf[4]}")
    r.pos = len(_HEADER)
    records: list[tuple[int, str, int, list[S]]] = []
    for _ in range(r.count(MIN_CLIENT, "client")):
        op = r.u8()
        client_id = r.string()
        revision = r.uvarint()
        if revision > _REVISION_MAX:
            raise SyncDecodeError(f"revision {revision} exceeds 2**63 - 1")
        n_services = r.count(MIN_SERVICE, "service")
        records.append((op, client_id, revision, [service(r) for _ in range(n_services)]))
    if r.pos != r.end:
        raise SyncDecodeError(f"{r.end - r.pos} trailing bytes after the batch")
    return records


def decode_batch(data: bytes | bytearray | memoryview) -> list[ClientRecord]:
    """Decode one batch; :class:`SyncDecodeError` on any malformed input."""
    return _records(data, _read_service)


def _skip_service(r: _Reader) -> None:
    """Walk past one service as :func:`_read_service` reads it, checking what it checks but the
    UTF-8 of the strings and the uniqueness of metadata keys."""
    r.skip_string()
    r.skip_string()
    r.skip_string()
    is_batch = r.u8()
    if is_batch > 1:
        raise SyncDecodeError(f"is_batch must be 0 or 1, got {is_batch} at offset {r.pos - 1}")
    for _ in range(r.count(MIN_INSTANCE, "instance")):
        r.skip_string()
        r.need(10)
        flags = r.u8()
        if flags > 3:
            raise SyncDecodeError(f"unknown instance flag bits {flags:#x} at offset {r.pos - 1}")
        r.skip_string()
        r.skip_string()
        for _ in range(r.count(MIN_METADATA, "metadata")):
            r.skip_string()
            r.skip_string()
        r.uvarint()


def _service_bytes(r: _Reader) -> bytes:
    """One service left as its encoded bytes (checked by :func:`_skip_service`)."""
    start = r.pos
    _skip_service(r)
    return r.buf[start:r.pos]


def split_batch(data: bytes | bytearray | memoryview) -> list[SplitRecord]:
    """Read one batch with each service left as its encoded bytes; :class:`SyncDecodeError` on
    any malformed structure (see the module's docstring for what is left to decoding)."""
    return _records(data, _service_bytes)
