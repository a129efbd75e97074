"""The native gRPC transport: libnghttp2 (``shoal._ext.h2grpc``) under one asyncio Protocol
per TCP connection.

The connection's HTTP/2 session parses what arrives and yields batched events; a unary
``/Request/request`` is answered inside ``data_received`` (no task, unless the service
returns an awaitable, as the cluster port's does); a ``/BiRequestStream/requestBiStream``
becomes a :class:`NativeStreamSink` given to the stream service. Output is written after each
batch, and not while the socket is paused (``pause_writing``). Unsent output per connection is
bounded (``shoal.remote.outbound-queue-bytes``) and a peer that reads nothing for
``shoal.remote.write-stall-timeout-ms`` is ejected. A stop sends GOAWAY, lets running calls
finish within the grace time, then closes every socket.

HTTP/2 abuse (docs/native-transport.md) is bounded per connection by ``shoal.remote.h2.*`` (see
:func:`session_limits`): nghttp2's options for concurrent streams, the rapid-reset token
bucket, unsent PING/SETTINGS ACKs and SETTINGS entries; the session's own count of
CONTINUATION frames and its read-buffer budget; here, a connection that has not sent the
preface within ``shoal.remote.h2.preface-timeout-ms`` is closed. A connection ended for
abuse gets a GOAWAY and is closed at once (its calls end as if the peer had gone), and is
aborted if its peer does not let the close finish within a short linger. Its drops are
logged at DEBUG only, so that a flood of bad connections is not a flood of log lines.
Answers are bounded too: once a connection's unwritten answers pass
``shoal.remote.outbound-queue-bytes``, its further requests wait, unread, until they drain.

The grpc.aio transport relies on grpc core's own limits instead: its
``grpc.max_concurrent_streams`` and ``grpc.max_metadata_size`` channel arguments, the
RST_STREAM pushback it added after CVE-2023-44487 (it lowers MAX_CONCURRENT_STREAMS after
resets and refuses streams over the lowered cap), its ping-strike policy
(``grpc.http2.max_ping_strikes``, disabled by that server) and its handshake timeout
(``grpc.server_handshake_timeout_ms``, 120 s). Those are not set from ``shoal.remote.h2.*``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import socket
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from shoal._ext import h2grpc
from shoal.config import Config
from shoal.errors import GrpcStatus
from shoal.kernels.payload import PayloadDecodeError
from shoal.tls import ALPN_H2, PortTls
from shoal.tls import describe as describe_tls
from shoal.transport.grpc.connections import Connection, ConnectionGone
from shoal.transport.grpc.transports import StreamService, UnaryService

log = logging.getLogger(__name__)

UNARY_PATH = "/Request/request"
STREAM_PATH = "/BiRequestStream/requestBiStream"
#: A client that has not finished its TLS handshake by then is dropped.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
CLOSE_LINGER_S = 2.0  # after a close for abuse, how long the peer may take to read the GOAWAY


def session_limits(config: Config) -> dict[str, int]:
    """The ``H2Session`` keyword arguments that carry ``shoal.remote.h2.*``."""
    return {
        "max_concurrent_streams": config.h2_max_concurrent_streams,
        "max_header_list": config.h2_max_header_list_size,
        "reset_burst": config.h2_reset_burst,
        "reset_rate": config.h2_reset_rate,
        "max_outbound_ack": config.h2_max_outbound_ack,
        "max_settings": config.h2_max_settings,
        "max_continuations": config.h2_max_continuations,
        "max_read_buffer": config.h2_max_read_buffer_bytes,
    }


def parse_grpc_timeout(value: str) -> float | None:
    """``grpc-timeout`` (e.g. ``5S``, ``100m``) in seconds; None when absent or malformed."""
    if len(value) < 2 or len(value) > 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit


@dataclass(eq=False, slots=True)
class _Call:
    """One open stream of a connection."""

    stream_id: int
    unary: bool
    conn: Connection | None = None
    sink: NativeStreamSink | None = None
    answered: bool = False
    deadline: asyncio.TimerHandle | None = None
    timeout: str = ""  # its grpc-timeout header, parsed (and a timer armed) only if it outlives its event batch
    task: asyncio.Task[None] | None = None


class NativeStreamSink:
    """The server→client side of one bi stream on the native transport."""

    __slots__ = ("closed", "owner", "stream_id")

    def __init__(self, owner: H2Connection, stream_id: int) -> None:
        self.owner = owner
        self.stream_id = stream_id
        self.closed = False

    def send(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionGone("stream closed")
        self.owner.send_message(self, data)

    def close(self, status: int, message: str) -> None:
        if not self.closed:
            self.closed = True
            self.owner.end_stream(self.stream_id, status, message)


class H2Connection(asyncio.Protocol):
    """One TCP connection: an HTTP/2 session carrying gRPC calls (one Nacos connection)."""

    # One per TCP connection, 10,000s of them idle: no per-instance __dict__.
    __slots__ = ("_abuse_logged", "_drained", "_flush_pending", "_held", "_held_bytes", "_linger", "_preface_timer",
                 "_stall_timer", "_to_arm", "calls", "loop", "lost", "paused", "peer", "server", "session", "transport")

    def __init__(self, server: NativeGrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.session: Any = None
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.calls: dict[int, _Call] = {}
        self.paused = False
        self.lost = False
        self._flush_pending = False
        self._stall_timer: asyncio.TimerHandle | None = None
        self._preface_timer: asyncio.TimerHandle | None = None
        self._drained = 0  # outbound message bytes framed so far (progress of a slow reader)
        # Created on first use: 10,000s of idle connections hold neither.
        self._to_arm: list[_Call] | None = None  # calls with a grpc-timeout, timer not armed yet
        self._abuse_logged = False
        self._linger: asyncio.TimerHandle | None = None  # aborts a close that a bad peer holds up
        self._held: deque[tuple[int, int, Any, Any]] | None = None  # events waiting for output to drain
        self._held_bytes = 0  # request bytes in _held

    # --- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp: Any = transport  # uvloop's TCP transport is no asyncio.Transport subclass
        self.transport = tcp
        self.peer = _peer_string(tcp.get_extra_info("peername"))
        tcp.set_write_buffer_limits(high=256 * 1024)
        sock = tcp.get_extra_info("socket")
        if sock is not None:  # a peer that vanished without a FIN is found by TCP keep-alive
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.session = h2grpc.H2Session(self.server.max_message, **session_limits(self.server.config))
        self.server.connections.add(self)
        self._preface_timer = self.loop.call_later(self.server.config.h2_preface_timeout_ms / 1000,
                                                   self._preface_check)
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.session.feed(data)
        except h2grpc.H2CallbackError:  # a bug of ours, not the peer's: say so, with the traceback
            log.exception("native gRPC transport: a session callback failed on the connection from %s; "
                          "closing it", self.peer)
            self.flush()  # the GOAWAY INTERNAL_ERROR the session queued
            self.abort()
            return
        except h2grpc.H2Error as exc:  # not HTTP/2 (bad preface), a protocol error or a flood: drop the peer
            self._log_abuse(str(exc))
            self.flush()  # the GOAWAY the session queued, if the peer reads at all
            self.abort()
            return
        if events:
            self._handle(events)
        if self.session.abuse is not None:
            self._log_abuse(self.session.abuse)
        self.flush()

    def _log_abuse(self, reason: str) -> None:
        # Debug only: a flood of bad connections must not become a flood of log lines.
        if not self._abuse_logged:
            self._abuse_logged = True
            log.debug("closing %s: %s", self.peer, reason)

    def _preface_check(self) -> None:
        self._preface_timer = None
        if not self.lost and not self.session.preface_received:
            stall_ms = self.server.config.h2_preface_timeout_ms
            self._log_abuse(f"no HTTP/2 preface within {stall_ms} ms")
            self.abort()

    def pause_writing(self) -> None:
        # The peer is not reading: stop reading its requests too, so their answers cannot pile up.
        self.paused = True
        self._update_reading()
        self._arm_stall_timer()

    def resume_writing(self) -> None:
        self.paused = False
        self._update_reading()
        self.flush()

    def _update_reading(self) -> None:
        """Read unless the socket is paused or the requests held back pass the outbound bound.

        Reading goes on while requests are merely held: the peer's WINDOW_UPDATEs, which let
        the held-up answers out, arrive on the same socket (stopping at once deadlocked a
        peer fetching snapshot pages bigger than the bound).
        """
        if self.transport is None or self.lost:
            return
        if self.paused or self._held_bytes > self.server.config.outbound_queue_bytes:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def _output_full(self) -> bool:
        transport = self.transport
        buffered = self.session.backlog + (transport.get_write_buffer_size() if transport is not None else 0)
        return bool(buffered > self.server.config.outbound_queue_bytes)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._held = None
        self._held_bytes = 0
        self.server.connections.discard(self)
        # Drop the timer handles too: each holds a bound method of this connection, a cycle that
        # would keep the connection and its nghttp2 session alive until a full GC pass (the node
        # runs the collector rarely), so that a stream of short connections would grow the RSS.
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._preface_timer is not None:
            self._preface_timer.cancel()
            self._preface_timer = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        streams = self.server.streams
        for call in list(self.calls.values()):
            self._finish_call(call, "transport closed")
        self.calls.clear()
        if streams is not None:
            streams.transport_closed(self.peer)
        self.server.closed_one()

    # --- events ------------------------------------------------------------------------------
    def _handle(self, events: list[tuple[int, int, Any, Any]]) -> None:
        self._handle_events(events)
        if self._to_arm is not None:
            self._arm_deadlines()

    def _arm_deadlines(self) -> None:
        """A unary call answered in the batch that opened it (the usual case: HEADERS and DATA in
        one read) needs no timer; every other call with a grpc-timeout gets one now."""
        to_arm, self._to_arm = self._to_arm or [], None
        for call in to_arm:
            if self.calls.get(call.stream_id) is not call or (call.unary and call.answered and call.task is None):
                continue
            timeout = parse_grpc_timeout(call.timeout)  # from the end of the batch that opened the call
            if timeout is not None:
                call.deadline = self.loop.call_later(timeout, self._deadline_passed, call.stream_id)

    def _handle_events(self, events: list[tuple[int, int, Any, Any]]) -> None:
        """Act on the session's events in order. Once the answers not yet written pass
        ``shoal.remote.outbound-queue-bytes``, the rest wait in ``_held`` until output drains
        (reading stops once they pass that bound too): pipelined requests cannot make the node
        build thousands of answers that their peer never reads."""
        if self._held:
            self._hold(events)
            return
        for at, (kind, stream_id, a, b) in enumerate(events):
            if kind == h2grpc.EV_MESSAGE:
                call = self.calls.get(stream_id)
                if call is None:
                    continue
                if not call.unary:
                    if call.conn is not None and self.server.streams is not None:
                        self.server.streams.stream_message(call.conn, a)
                elif call.answered:
                    self.session.send_trailers(stream_id, h2grpc.INTERNAL, "more than one request message")
                elif self._output_full():
                    self._hold(events[at:])
                    return
                else:
                    call.answered = True
                    self._answer(call, a)
            elif kind == h2grpc.EV_HEADERS:
                self._new_call(stream_id, a, b)
            elif kind == h2grpc.EV_HALF_CLOSE:
                call = self.calls.get(stream_id)
                if call is None:
                    continue
                if call.unary:
                    if not call.answered:
                        call.answered = True
                        self.session.send_trailers(stream_id, h2grpc.INTERNAL, "missing request message")
                else:  # the client ended its stream: end ours too (as grpc.aio's handler returns)
                    self._finish_call(call, "stream closed by client")
                    self.session.send_trailers(stream_id, 0, "")
            elif kind == h2grpc.EV_CLOSED:
                call = self.calls.pop(stream_id, None)
                if call is not None:
                    self._finish_call(call, "stream closed by client" if a == 0 else "stream reset by client")
            elif kind == h2grpc.EV_FAILED:
                call = self.calls.get(stream_id)
                if call is not None:
                    self._finish_call(call, f"stream failed: {b}")

    def _hold(self, events: list[tuple[int, int, Any, Any]]) -> None:
        if self._held is None:
            self._held = deque()
        self._held.extend(events)
        self._held_bytes += sum(len(a) if kind == h2grpc.EV_MESSAGE else 64 for kind, _, a, _ in events)
        self._update_reading()

    def _new_call(self, stream_id: int, path: str, headers: dict[str, str]) -> None:
        streams = self.server.streams
        if path == UNARY_PATH:
            call = _Call(stream_id, unary=True)
        elif path == STREAM_PATH and streams is not None:
            call = _Call(stream_id, unary=False)
        else:
            self.session.send_trailers(stream_id, h2grpc.UNIMPLEMENTED, f"unknown method {path}")
            return
        content_type = headers.get("content-type", "")
        if not content_type.startswith("application/grpc"):
            self.session.send_trailers(stream_id, h2grpc.INTERNAL, f"bad content-type {content_type!r}")
            return
        self.calls[stream_id] = call
        timeout = headers.get("grpc-timeout")
        if timeout:
            call.timeout = timeout
            if self._to_arm is None:
                self._to_arm = []
            self._to_arm.append(call)
        if not call.unary and streams is not None:
            sink = NativeStreamSink(self, stream_id)
            call.sink = sink
            call.conn = streams.open_stream(self.peer, sink)

    def _answer(self, call: _Call, data: bytes) -> None:
        try:
            reply = self.server.unary.unary(data, self.peer)
        except PayloadDecodeError as exc:  # the bytes are no Payload: the caller's fault, not ours
            self.session.send_trailers(call.stream_id, GrpcStatus.INVALID_ARGUMENT, str(exc))
            return
        except Exception:  # the service answers its own errors; this is a bug: never a traceback to the peer
            log.exception("unexpected failure answering a call from %s", self.peer)
            self.session.send_trailers(call.stream_id, h2grpc.INTERNAL, "server error")
            return
        if isinstance(reply, bytes):
            self.session.reply(call.stream_id, reply)
        elif inspect.isawaitable(reply):
            call.task = self.loop.create_task(self._answer_later(call, reply))

    async def _answer_later(self, call: _Call, reply: Awaitable[bytes]) -> None:
        try:
            data = await reply
        except PayloadDecodeError as exc:  # the bytes are no Payload: the caller's fault, not ours
            self.session.send_trailers(call.stream_id, GrpcStatus.INVALID_ARGUMENT, str(exc))
        except Exception:
            log.exception("unexpected failure answering a call from %s", self.peer)
            self.session.send_trailers(call.stream_id, h2grpc.INTERNAL, "server error")
        else:
            self.session.reply(call.stream_id, data)
        call.task = None
        self.schedule_flush()

    def _deadline_passed(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is None:
            return
        call.deadline = None
        self._finish_call(call, "deadline exceeded")
        self.session.send_trailers(stream_id, h2grpc.DEADLINE_EXCEEDED, "deadline exceeded")
        self.schedule_flush()

    def _finish_call(self, call: _Call, reason: str) -> None:
        """The call is over for us: stop its timer/task, tell the stream service once."""
        if call.deadline is not None:
            call.deadline.cancel()
            call.deadline = None
        if call.task is not None:
            call.task.cancel()
            call.task = None
        sink, conn = call.sink, call.conn
        call.sink = call.conn = None
        if sink is not None:
            sink.closed = True
        if conn is not None and self.server.streams is not None:
            self.server.streams.stream_ended(conn, reason)

    # --- output ----------------------------------------------------------------------------
    def send_message(self, sink: NativeStreamSink, data: bytes) -> None:
        if self.lost:
            raise ConnectionGone("transport closed")
        limit = self.server.config.outbound_queue_bytes
        transport = self.transport
        buffered = self.session.backlog + (transport.get_write_buffer_size() if transport is not None else 0)
        if buffered + len(data) > limit:
            self._eject(f"outbound queue over {limit} bytes (peer not reading)")
            raise ConnectionGone("outbound queue full")
        if not self.session.send_message(sink.stream_id, data):
            raise ConnectionGone("stream closed")
        self.schedule_flush()

    def end_stream(self, stream_id: int, status: int, message: str) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.sink = None  # ended by the service: it needs no stream_ended
            call.conn = None
        if not self.lost:
            self.session.send_trailers(stream_id, status, message)
            self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flush_pending and not self.lost:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what the session has for the socket (unless paused); close when it is done."""
        self._flush_pending = False
        if self.lost or self.transport is None:
            return
        if not self.paused:
            before = self.session.backlog
            try:
                out = self.session.output_parts()
            except h2grpc.H2CallbackError:
                log.exception("native gRPC transport: a session callback failed while writing to %s; "
                              "closing the connection", self.peer)
                self.abort()
                return
            except h2grpc.H2Error:  # it failed while sending before: it never sends again
                self.abort()
                return
            if out:  # a large answer's bytes are handed over uncopied (memoryview slices)
                if len(out) == 1:
                    self.transport.write(out[0])
                else:
                    self.transport.writelines(out)
            self._drained += max(0, before - self.session.backlog)
            events = self.session.take_events()
            if events:
                self._handle(events)
            if self._held and not self._output_full():  # output drained: the held requests go on
                held = list(self._held)
                self._held = None
                self._held_bytes = 0
                self._handle(held)
                self._update_reading()
                self.schedule_flush()
        abuse = self.session.abuse
        if self.session.is_done() or abuse is not None or (self.session.goaway_sent and not self.calls):
            self.transport.close()  # after GOAWAY, once the last call is over (at once for abuse)
            if abuse is not None and self._linger is None:  # a misbehaving peer gets no say in how long that takes
                self._linger = self.loop.call_later(CLOSE_LINGER_S, self.abort)
        elif self.paused or self.session.backlog:
            self._arm_stall_timer()

    def _arm_stall_timer(self) -> None:
        if self._stall_timer is None and not self.lost:
            stall_s = self.server.config.write_stall_timeout_ms / 1000
            self._stall_timer = self.loop.call_later(stall_s, self._stall_check, self._drained)

    def _stall_check(self, drained_then: int) -> None:
        self._stall_timer = None
        if self.lost or not (self.paused or self.session.backlog):
            return
        if self._drained == drained_then:
            stall_ms = self.server.config.write_stall_timeout_ms
            self._eject(f"peer read nothing for {stall_ms} ms")
            return
        self._arm_stall_timer()

    def _eject(self, reason: str) -> None:
        """Close a connection that does not read: the stream service unregisters it (one log line)."""
        streams = self.server.streams
        for call in list(self.calls.values()):
            conn = call.conn
            call.sink = call.conn = None
            if conn is not None and streams is not None:
                streams.eject(conn, reason)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abort()

    # --- shutdown --------------------------------------------------------------------------
    def goaway(self) -> None:
        if not self.lost:
            self.flush()  # what the streams were told (e.g. UNAVAILABLE) goes out before the GOAWAY
            self.session.goaway()
            self.flush()

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()


class NativeGrpcServer:
    """One port served by the native transport."""

    def __init__(self, config: Config, port: int, label: str, unary: UnaryService,
                 streams: StreamService | None, max_message: int, tls: PortTls | None = None,
                 reuse_port: bool = False) -> None:
        self.config = config
        self.tls = tls
        self.port = port
        self.reuse_port = reuse_port  # shared with the node's other workers (SO_REUSEPORT)
        self.label = label
        self.unary = unary
        self.streams = streams
        self.max_message = max_message
        self.connections: set[H2Connection] = set()
        self._server: asyncio.Server | None = None
        self._all_closed: asyncio.Event | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        address = f"{self.config.host}:{self.port}"
        # TLS through the loop's SSL transport: H2Connection sees decrypted bytes, and a client that
        # does not complete a TLS handshake never reaches it (no plaintext beside TLS).
        ssl_context = self.tls.server_context(alpn=[ALPN_H2]) if self.tls is not None else None
        try:
            self._server = await loop.create_server(functools.partial(H2Connection, self), self.config.host,
                                                    self.port, reuse_address=True, backlog=1024, ssl=ssl_context,
                                                    reuse_port=self.reuse_port or None,
                                                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl_context
                                                    else None)
        except OSError as exc:
            raise OSError(f"cannot listen on {address} for {self.label}: {exc.strerror or exc}") from None
        log.info("%s server listening on %s (transport native, %s)", self.label, address, describe_tls(self.tls))

    def closed_one(self) -> None:
        if not self.connections and self._all_closed is not None:
            self._all_closed.set()

    async def stop(self, grace_s: float) -> None:
        """GOAWAY to every connection, let open calls finish within ``grace_s``, close all."""
        if self._server is None:
            return
        self._server.close()
        self._server = None
        for conn in list(self.connections):
            conn.goaway()
        self._all_closed = asyncio.Event()
        if not self.connections:
            return
        try:  # each connection closes itself once its last call is over
            async with asyncio.timeout(grace_s):
                await self._all_closed.wait()
            return
        except TimeoutError:
            pass
        for conn in list(self.connections):
            conn.close()
        try:
            async with asyncio.timeout(1.0):
                await self._all_closed.wait()
        except TimeoutError:
            for conn in list(self.connections):
                conn.abort()


def _peer_string(peername: Any) -> str:
    """The peer as grpc names it: ``ipv4:1.2.3.4:5`` or ``ipv6:[::1]:5``."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
    return f"unix:{peername}"
