"""Nacos gRPC ``Payload`` codec (pure-Python twin of ``ext/payload.pyx``; this module is the spec).

Every Nacos 2.x gRPC message is one protobuf message (``nacos_grpc_service.proto``)::

    message Metadata { string type = 3; string clientIp = 8; map<string, string> headers = 7; }
    message Payload  { Metadata metadata = 2; google.protobuf.Any body = 3; }

``decode`` turns the bytes of a Payload into ``(type, headers, client_ip, body)`` and ``encode``
does the reverse. Both are built on protobuf message classes made here, in a private descriptor
pool (a kernel is a leaf: it does not import the transport's ``_proto`` package), from a wire
view of that schema: the same field numbers and types, with ``headers`` declared as what a map is
on the wire, a repeated ``HeadersEntry {string key = 1; string value = 2;}`` message.

Decoding is protobuf's proto3 parsing, with these differences:

* a known field that arrives with a wire type other than length-delimited (all seven known
  fields are strings, bytes or messages) is an error, where protobuf would keep it as an unknown
  field;
* field number 0 is an error everywhere, where protobuf accepts it inside an unknown group;
* a headers entry is read as the entry message it is on the wire: a missing key or value means
  ``""``, a repeated key keeps the last value, and an unknown field inside an entry is skipped
  (the C parser behind protobuf's Python package would instead move such an entry out of the
  map, into Metadata's unknown fields);
* everything else is protobuf's: unknown fields of every wire type are skipped (groups
  included, nested at most 100 deep counting the submessages around them), a repeated
  ``metadata`` or ``body`` merges into the earlier one, a repeated scalar keeps the last value,
  strings must be valid UTF-8 (``Any.type_url`` too, though it is dropped), a tag is a varint of
  at most 5 bytes below 2**32, a length is a varint of at most 5
  bytes and must fit in the bytes left, any other varint at most 10 bytes.

Any malformed input raises :class:`PayloadDecodeError`, and nothing else (an argument that is not
bytes-like is a caller bug and raises ``TypeError``).

Encoding writes what protobuf's serializer writes for ``Payload(metadata=Metadata(type=...,
clientIp=..., headers=...), body=Any(value=...))``: field 2 (metadata, always present) then field
3 (body, always present), proto3 defaults omitted, ``Any.type_url`` left empty as Nacos's SDKs
send it, each header entry with both key and value written. The entries come in the mapping's
iteration order (protobuf itself writes a map in hash order, or sorted when asked to be
deterministic), so the bytes equal protobuf's whenever the orders agree, e.g. with one header.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError

__all__ = ["PayloadDecodeError", "decode", "encode"]


class PayloadDecodeError(ValueError):
    """The bytes are not a well-formed Nacos ``Payload`` message."""


def _schema() -> descriptor_pb2.FileDescriptorProto:
    """The wire view of nacos_grpc_service.proto's messages that both directions use.

    Field numbers and types are the schema's; ``headers`` is declared as what a map is on the
    wire, a repeated ``HeadersEntry`` message, so that every entry (and any unknown field inside
    one) stays visible and in order when decoding, and entries are written in the caller's
    order when encoding. Key and value have explicit presence (``optional``) so that both are
    always written, as protobuf writes a map entry.
    """
    fdp = descriptor_pb2.FileDescriptorProto(
        name="shoal/kernels/payload_wire.proto", syntax="proto3", dependency=["google/protobuf/any.proto"]
    )
    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED

    entry = fdp.message_type.add(name="HeadersEntry")
    for index, name in enumerate(("key", "value")):
        entry.oneof_decl.add(name=f"_{name}")
        entry.field.add(
            name=name, number=index + 1, type=field.TYPE_STRING, label=optional, oneof_index=index, proto3_optional=True
        )
    metadata = fdp.message_type.add(name="Metadata")
    metadata.field.add(name="type", number=3, type=field.TYPE_STRING, label=optional)
    metadata.field.add(name="headers", number=7, type=field.TYPE_MESSAGE, label=repeated, type_name=".HeadersEntry")
    metadata.field.add(name="clientIp", number=8, type=field.TYPE_STRING, label=optional)
    payload = fdp.message_type.add(name="Payload")
    payload.field.add(name="metadata", number=2, type=field.TYPE_MESSAGE, label=optional, type_name=".Metadata")
    payload.field.add(name="body", number=3, type=field.TYPE_MESSAGE, label=optional, type_name=".google.protobuf.Any")
    return fdp


def _classes() -> tuple[Any, Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    any_fdp = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_fdp)
    pool.Add(any_fdp)
    pool.Add(_schema())
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("Payload")),
        get(pool.FindMessageTypeByName("Metadata")),
        get(pool.FindMessageTypeByName("google.protobuf.Any")),
    )


_Payload, _Metadata, _Any = _classes()

_UnknownFieldSet = unknown_fields.UnknownFieldSet
_LENGTH_DELIMITED = 2
_START_GROUP = 3


def _check_unknown_fields(message: Any, known: tuple[int, ...], what: str) -> None:
    """Reject a known field number that protobuf kept as unknown because of its wire type, and
    field number 0 inside an unknown group (protobuf rejects it only outside groups)."""
    for unknown in _UnknownFieldSet(message):
        if unknown.field_number in known:
            raise PayloadDecodeError(
                f"{what} field {unknown.field_number} has wire type {unknown.wire_type}, "
                f"expected {_LENGTH_DELIMITED} (length-delimited)"
            )
        if unknown.wire_type == _START_GROUP:
            _check_group(unknown.data)


def _check_group(fields: Any) -> None:
    for unknown in fields:
        if unknown.field_number == 0:
            raise PayloadDecodeError("field number 0 inside a group")
        if unknown.wire_type == _START_GROUP:
            _check_group(unknown.data)


def _as_bytes(data: object) -> bytes:
    if type(data) is bytes:
        return data
    view = memoryview(data)  # type: ignore[arg-type]  # TypeError for a non-buffer, as the C side
    if not view.c_contiguous:
        raise BufferError("a Payload buffer must be C-contiguous")
    return view.tobytes()


def decode(data: bytes | bytearray | memoryview) -> tuple[str, dict[str, str], str, bytes]:
    """``(metadata.type, metadata.headers, metadata.clientIp, body.value)`` of a serialized Payload.

    Raises :class:`PayloadDecodeError` on malformed input (see the module docstring).
    """
    raw = _as_bytes(data)
    message = _Payload()
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise PayloadDecodeError(f"malformed Payload: {exc}") from None
    _check_unknown_fields(message, (2, 3), "Payload")
    metadata = message.metadata
    _check_unknown_fields(metadata, (3, 7, 8), "Metadata")
    headers: dict[str, str] = {}
    for entry in metadata.headers:
        _check_unknown_fields(entry, (1, 2), "Metadata.headers entry")
        headers[entry.key] = entry.value
    body = message.body
    _check_unknown_fields(body, (1, 2), "Payload.body (Any)")
    return metadata.type, headers, metadata.clientIp, body.value


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, got {type(value).__name__}")
    value.encode()  # UnicodeEncodeError on a lone surrogate, before protobuf sees it
    return value


def encode(
    type: str,
    body: bytes | bytearray | memoryview,
    headers: Mapping[str, str] | None = None,
    client_ip: str = "",
) -> bytes:
    """A serialized Payload: ``metadata{type, headers, clientIp}``, ``body{value}``.

    Raises ``TypeError`` for an argument of the wrong type and ``UnicodeEncodeError`` (a
    ``ValueError``) for a string that has no UTF-8 form (a lone surrogate). Arguments are checked
    in the order type, body, client_ip, headers (each key, then its value).
    """
    _check_str(type, "type")
    value = _as_bytes(body)
    _check_str(client_ip, "client_ip")
    items: list[tuple[str, str]] = []
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping, got {builtins.type(headers).__name__}")
        for key, text in headers.items():
            items.append((_check_str(key, "header name"), _check_str(text, "header value")))
    metadata = _Metadata(type=type, clientIp=client_ip)
    for key, text in items:
        metadata.headers.add(key=key, value=text)
    return bytes(_Payload(metadata=metadata, body=_Any(value=value)).SerializeToString())
