"""A native connection whose session callback raises logs the error with its traceback and closes
(docs/native-transport.md): before, nghttp2 got a bare failure code and the connection ended without a trace.

One real NativeGrpcServer on loopback and a real h2 client over a socket; the bug is simulated by
corrupting the connection's stream table, which is what a bug in the callbacks would do.
"""

from __future__ import annotations

import asyncio
import logging
import struct

import h2.config
import h2.connection
import pytest

from shoal.config import Config
from shoal.transport.grpc.native_server import UNARY_PATH, NativeGrpcServer

pytestmark = pytest.mark.c_extension


class Echo:
    def unary(self, data: bytes, peer: str) -> bytes:
        return data


async def _serve_and_break() -> bytes:
    server = NativeGrpcServer(Config(host="127.0.0.1"), 0, "test", Echo(), None, 1 << 20)
    server.port = 0
    await server.start()
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", UNARY_PATH), (":authority", "x"),
                            ("content-type", "application/grpc")])
    writer.write(client.data_to_send())
    await writer.drain()
    async with asyncio.timeout(5):
        while not (server.connections and 1 in next(iter(server.connections)).session.streams):
            await asyncio.sleep(0.01)
    next(iter(server.connections)).session.streams[1] = "corrupted"
    client.send_data(1, struct.pack(">BI", 0, 4) + b"body", end_stream=True)
    writer.write(client.data_to_send())
    await writer.drain()
    received = b""
    async with asyncio.timeout(5):
        while chunk := await reader.read(65536):  # until the server closes the connection
            received += chunk
    writer.close()
    await server.stop(1.0)
    return received


def test_a_failing_callback_is_logged_with_its_traceback_and_the_connection_closed(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="shoal.transport.grpc.native_server"):
        received = asyncio.run(_serve_and_break())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "callback failed" in errors[0].getMessage()
    exc_info = errors[0].exc_info
    assert exc_info is not None and exc_info[1] is not None
    assert isinstance(exc_info[1].__cause__, TypeError)  # H2CallbackError from the callback's own exception
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    events = client.receive_data(received)
    assert any(getattr(ev, "error_code", None) == 2 for ev in events)  # GOAWAY INTERNAL_ERROR
