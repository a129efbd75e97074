"""Which gRPC server transport serves a port, and what a transport calls into.

Both gRPC ports can run on either transport (``shoal.remote.transport``):

* ``native``: HTTP/2 by libnghttp2 in the ``h2grpc`` Cython extension, one asyncio Protocol
  per TCP connection, a unary call answered synchronously (no task per request);
* ``grpcio``: grpc.aio.

The default is native when the extension is built and imports (and ``SHOAL_NO_EXTENSIONS`` is
unset). The extension refuses to import with a libnghttp2 it was not tested with
(docs/native-transport.md): the node then says why, once, and serves on grpc.aio; asking for
native explicitly is then a ConfigError carrying the same reason.
A transport hands raw Payload bytes to a :class:`UnaryService` and, on the SDK port, the bi
streams to a :class:`StreamService`; the connection is identified by its peer address
(``ipv4:ip:port``), one per TCP connection.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Awaitable
from typing import Protocol

from shoal.config import Config
from shoal.errors import ConfigError
from shoal.tls import PortTls
from shoal.transport.grpc.connections import Connection, StreamSink

log = logging.getLogger(__name__)

NATIVE = "native"
GRPCIO = "grpcio"


class UnaryService(Protocol):
    """Answers /Request/request: Payload bytes in, Payload bytes out (or an awaitable of them).

    Raises PayloadDecodeError when the request is not a Payload."""

    def unary(self, data: bytes, peer: str) -> bytes | Awaitable[bytes]: ...


class StreamService(Protocol):
    """Serves /BiRequestStream/requestBiStream over a transport-provided :class:`StreamSink`."""

    def open_stream(self, peer: str, sink: StreamSink) -> Connection: ...

    def stream_message(self, conn: Connection, data: bytes) -> None: ...

    def stream_ended(self, conn: Connection, reason: str = ...) -> None: ...

    def eject(self, conn: Connection, reason: str) -> None: ...

    def transport_closed(self, peer: str) -> None: ...


class GrpcTransport(Protocol):
    """A listening gRPC server on one port."""

    async def start(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


_explained = False  # the fallback to grpc.aio for an unusable extension was logged


def native_unavailable_reason() -> str | None:
    """Why the native transport cannot run here (None when it can): extensions switched off,
    the extension not built, or its import refused (e.g. an untested libnghttp2)."""
    if os.environ.get("SHOAL_NO_EXTENSIONS", "") not in ("", "0"):
        return "SHOAL_NO_EXTENSIONS is set"
    try:
        importlib.import_module("shoal._ext.h2grpc")
    except ImportError as exc:
        return str(exc) or "the h2grpc extension is not built"
    return None


def native_available() -> bool:
    """True when the h2grpc extension is built, imports, and extensions are not switched off."""
    return native_unavailable_reason() is None


def transport_name(config: Config) -> str:
    """The transport the gRPC ports run on; ConfigError for a bad or unavailable choice."""
    global _explained
    reason = native_unavailable_reason()
    wanted = config.remote_transport or (NATIVE if reason is None else GRPCIO)
    if wanted not in (NATIVE, GRPCIO):
        raise ConfigError(f"shoal.remote.transport must be {NATIVE} or {GRPCIO}, not {wanted!r}")
    if wanted == NATIVE and reason is not None:
        raise ConfigError("shoal.remote.transport=native needs the h2grpc extension (built with libnghttp2; "
                          f"not available with SHOAL_NO_EXTENSIONS=1): {reason}")
    if not config.remote_transport and reason is not None and not _explained and \
            reason != "SHOAL_NO_EXTENSIONS is set":
        _explained = True  # an unusable build is worth one line; extensions switched off on purpose are not
        log.warning("the gRPC ports run on grpc.aio: the native transport is unavailable (%s)", reason)
    for name in ("max_inbound_message_size", "cluster_max_inbound_message_size", "outbound_queue_bytes",
                 "write_stall_timeout_ms"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(config, name)}")
    return wanted


def make_transport(config: Config, port: int, label: str, unary: UnaryService, streams: StreamService | None,
                   max_message: int, tls: PortTls | None = None) -> GrpcTransport:
    """The configured transport for one port (not started); with ``tls`` it serves TLS only (ALPN h2)."""
    name = transport_name(config)
    if name == NATIVE:
        from shoal.transport.grpc.native_server import NativeGrpcServer
        return NativeGrpcServer(config, port, label, unary, streams, max_message, tls)
    from shoal.transport.grpc.grpcio_server import GrpcioServer
    return GrpcioServer(config, port, label, unary, streams, max_message, tls)
