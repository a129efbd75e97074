"""Payload bytes ⇄ (type, headers, client_ip, body): the wire codec both gRPC transports use.

This is a stand-in with exactly the signature of ``shoal.kernels.payload`` (being written
separately); once that kernel lands, the import in the transports switches to it and this
module goes. It uses the protobuf classes of ``_proto``.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.message import DecodeError

from shoal.transport.grpc._proto import Metadata, Payload


class PayloadDecodeError(ValueError):
    """The bytes are not a Nacos Payload message."""


def decode(data: bytes) -> tuple[str, dict[str, str], str, bytes]:
    """(metadata.type, metadata.headers, metadata.clientIp, body.value) of one Payload."""
    try:
        payload = Payload.FromString(data)
    except DecodeError as exc:
        raise PayloadDecodeError(f"not a Payload message: {exc}") from None
    meta = payload.metadata
    return meta.type, dict(meta.headers), meta.clientIp, payload.body.value


def encode(type_name: str, body: bytes, headers: Mapping[str, str] | None = None, client_ip: str = "") -> bytes:
    """One serialized Payload (``body.type_url`` left empty, as Nacos does)."""
    meta = Metadata(type=type_name, clientIp=client_ip, headers=dict(headers) if headers else None)
    return bytes(Payload(metadata=meta, body={"value": body}).SerializeToString())
