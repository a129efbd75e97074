"""The grpc.aio transport: a thin adapter from grpc.aio calls to the gRPC services.

Requests and responses stay raw bytes (no (de)serializer): the service decodes them. Writes
to a bi stream go through :class:`GrpcioStreamSink`, one at a time in order, from a bounded
queue; a queue over its bound or a write the peer does not take within the stall bound
ejects the connection, instead of piling up pending operations and memory in grpc.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from shoal.config import Config
from shoal.kernels.payload import PayloadDecodeError
from shoal.tls import PortTls
from shoal.tls import describe as describe_tls
from shoal.transport.grpc.connections import ConnectionGone
from shoal.transport.grpc.transports import StreamService, UnaryService

log = logging.getLogger(__name__)

_STATUS = {code.value[0]: code for code in grpc.StatusCode}


class GrpcioStreamSink:
    """The server→client side of one grpc.aio bi stream: a bounded, serialised write queue."""

    def __init__(self, context: Any, limit_bytes: int, stall_s: float) -> None:
        self.context = context
        self.limit_bytes = limit_bytes
        self.stall_s = stall_s
        self.on_fail: Callable[[str], None] = lambda reason: None
        self.handler_task: asyncio.Task[Any] | None = None
        self.abort: tuple[int, str] | None = None
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._writer: asyncio.Task[None] | None = None
        self.stuck = False

    def send(self, data: bytes) -> None:
        if self.abort is not None:
            raise ConnectionGone("stream closed")
        if self._queued + len(data) > self.limit_bytes:
            self.on_fail(f"outbound queue over {self.limit_bytes} bytes (peer not reading)")
            raise ConnectionGone("outbound queue full")
        self._queue.append(data)
        self._queued += len(data)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._queue and self.abort is None:
                data = self._queue[0]
                write = asyncio.ensure_future(self.context.write(data))
                done, _ = await asyncio.wait((write,), timeout=self.stall_s)
                if not done:
                    # grpc cannot cancel a started write: leave it to end with the transport (the
                    # keep-alive ping closes a peer that stopped reading) and give up the connection.
                    self.stuck = True
                    write.add_done_callback(_consume)
                    self.on_fail(f"peer read nothing for {self.stall_s:g} s")
                    return
                if write.exception() is not None:  # the call is over (client gone): the handler ends it
                    log.debug("stream write failed: %s", write.exception())
                    return
                self._queue.popleft()
                self._queued -= len(data)
        finally:
            self._writer = None

    def close(self, status: int, message: str) -> None:
        if self.abort is not None:
            return
        self.abort = (status, message)
        self.stop()
        task = self.handler_task
        if self.stuck:  # no status can be sent behind a stuck write: the call ends with its transport
            return
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()  # the handler ends the call with this status

    def release(self) -> None:
        """Forget the call once its handler ends. The connection holds this sink and the sink held
        the connection (``on_fail``) and the handler's task, whose frame holds grpc's context and
        the last message: a cycle that kept each ended stream's last message (up to the message
        limit) until the cycle collector ran."""
        self.handler_task = None
        self.on_fail = _ignore_failure
        self.context = None

    def stop(self) -> None:
        """Drop queued output and stop the writer (unless its write is stuck in grpc)."""
        writer = self._writer
        if writer is not None and writer is not asyncio.current_task() and not self.stuck:
            writer.cancel()
        self._writer = None
        self._queue.clear()
        self._queued = 0


def _ignore_failure(reason: str) -> None:
    """``on_fail`` of a released sink."""


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception never retrieved" noise


class GrpcioServer:
    """One port served by grpc.aio."""

    def __init__(self, config: Config, port: int, label: str, unary: UnaryService,
                 streams: StreamService | None, max_message: int, tls: PortTls | None = None,
                 reuse_port: bool = False) -> None:
        self.config = config
        self.tls = tls
        self.port = port
        self.reuse_port = reuse_port  # shared with the node's other workers (SO_REUSEPORT)
        self.label = label
        self.unary_service = unary
        self.streams = streams
        self.max_message = max_message
        self._server: Any = None

    async def start(self) -> None:
        options = [
            ("grpc.max_receive_message_length", self.max_message),
            ("grpc.max_send_message_length", -1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", self.config.grpc_permit_keepalive_ms),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            # a peer that stops reading stops answering pings too: grpc then drops its transport
            ("grpc.keepalive_time_ms", self.config.write_stall_timeout_ms),
            ("grpc.keepalive_timeout_ms", self.config.write_stall_timeout_ms),
            ("grpc.so_reuseport", 1 if self.reuse_port else 0),
        ]
        server = grpc.aio.server(options=options)
        handlers = [grpc.method_handlers_generic_handler(
            "Request", {"request": grpc.unary_unary_rpc_method_handler(self._unary)})]
        if self.streams is not None:
            handlers.append(grpc.method_handlers_generic_handler(
                "BiRequestStream", {"requestBiStream": grpc.stream_stream_rpc_method_handler(self._bi_stream)}))
        server.add_generic_rpc_handlers(handlers)
        address = f"{self.config.host}:{self.port}"
        try:
            if self.tls is None:
                bound = server.add_insecure_port(address)
            else:  # TLS only; grpc offers ALPN h2 itself
                credentials = grpc.ssl_server_credentials(
                    [(self.tls.unencrypted_key(), self.tls.cert_chain)], root_certificates=self.tls.trust,
                    require_client_auth=self.tls.settings.mutual)
                bound = server.add_secure_port(address, credentials)
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {address} for {self.label}: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {address} for {self.label} (address in use?)")
        await server.start()
        self._server = server
        log.info("%s server listening on %s (transport grpcio, %s)", self.label, address, describe_tls(self.tls))

    async def stop(self, grace_s: float) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    async def _unary(self, data: bytes, context: Any) -> bytes:
        try:
            reply = self.unary_service.unary(data, context.peer())
            if inspect.isawaitable(reply):
                reply = await reply
        except PayloadDecodeError as exc:  # the bytes are no Payload: the caller's fault, not ours
            # The status is set, not raised with context.abort(): grpc's AbortError ends in a
            # reference cycle among its own frames, one of which is this one, holding the request:
            # every refused message (up to the inbound limit) stayed until a full collection.
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(str(exc))
            return b""
        return reply

    async def _bi_stream(self, request_iterator: Any, context: Any) -> None:
        streams = self.streams
        assert streams is not None
        sink = GrpcioStreamSink(context, self.config.outbound_queue_bytes, self.config.write_stall_timeout_ms / 1000)
        sink.handler_task = asyncio.current_task()
        conn = streams.open_stream(context.peer(), sink)
        sink.on_fail = functools.partial(streams.eject, conn)
        try:
            try:
                # context.read(), not request_iterator: grpc's iterator holds the last message it
                # yielded and grpc's call state holds the iterator in a cycle, so every stream the
                # server ended kept its last message (up to the message limit) until the cycle
                # collector ran; 200 bad 300 KB setups grew the node by 60 MB.
                while sink.abort is None:
                    data = await context.read()
                    if data is grpc.aio.EOF:
                        break
                    streams.stream_message(conn, data)
            except asyncio.CancelledError:
                if sink.abort is None:  # cancelled by grpc (call over), not by us
                    raise
            finally:
                sink.stop()
                streams.stream_ended(conn)
            if sink.abort is not None and not sink.stuck:  # ended by the server: tell the client why
                status, message = sink.abort  # set, not context.abort(): nothing raised into grpc
                context.set_code(_STATUS.get(status, grpc.StatusCode.UNAVAILABLE))
                context.set_details(message)
        finally:
            sink.release()
