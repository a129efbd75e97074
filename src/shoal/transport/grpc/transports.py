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

import logging
from collections.abc import Awaitable
from typing import Protocol

from shoal.config import Config
from shoal.tls import PortTls
from shoal.transport.grpc.connections import Connection, StreamSink
from shoal.transport.selection import NATIVE
from shoal.transport.selection import transport_name as transport_name  # re-exported: the choice moved there

log = logging.getLogger(__name__)


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


def make_transport(config: Config, port: int, label: str, unary: UnaryService, streams: StreamService | None,
                   max_message: int, tls: PortTls | None = None, reuse_port: bool = False) -> GrpcTransport:
    """The configured transport for one port (not started); with ``tls`` it serves TLS only (ALPN h2);
    with ``reuse_port`` the port is shared with the node's other workers (SO_REUSEPORT)."""
    name = transport_name(config)
    if name == NATIVE:
        from shoal.transport.grpc.native_server import NativeGrpcServer
        return NativeGrpcServer(config, port, label, unary, streams, max_message, tls, reuse_port)
    from shoal.transport.grpc.grpcio_server import GrpcioServer
    return GrpcioServer(config, port, label, unary, streams, max_message, tls, reuse_port)
