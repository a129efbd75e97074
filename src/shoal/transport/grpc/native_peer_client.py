"""The native side of the Distro peer seam: unary gRPC calls to peers' cluster ports over a
libnghttp2 client session (``shoal._ext.h2client``) under one asyncio Protocol per peer.

It behaves exactly as :class:`shoal.transport.grpc.peer_client.GrpcPeerTransport` (which
``shoal.cluster.client.transport=grpcio`` selects; ``transport/selection.py`` chooses): the
same constructor, the same Payload (``MEMBER_HEADER`` and the cluster identity in its metadata
headers), the same errors (refused → ``PeerUnavailable(refused=True)``, unreachable or lost →
``PeerUnavailable``, no answer within the timeout → ``TimeoutError``, an error status →
``PeerError``) and the same logging (one WARNING when a peer stops answering, DEBUG while it
stays so, one INFO when it answers again).

One connection per peer carries every call to it, each call a stream (many in flight at once).
A call is submitted to the session at once, even while the connection is still being made: the
session holds it until the socket is there. Calls of one loop iteration go out in one write.
Each call has a deadline (a ``grpc-timeout`` header for the server, and a timer here that
resets the stream with CANCEL when it passes). A connection that failed (refused, lost, a
protocol error) fails its calls in flight and is forgotten, so the next call connects at once
(a restarted peer is reached without waiting for a back-off). One that received GOAWAY, or
whose call ended UNAVAILABLE, takes no new calls: its calls in flight finish, and it closes
when the last one has (or after ``CHANNEL_CLOSE_GRACE_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Mapping
from typing import Any

from shoal._ext import h2client
from shoal.distro.transport import MEMBER_HEADER, PeerError, PeerUnavailable
from shoal.kernels.payload import PayloadDecodeError, decode, encode
from shoal.tls import ALPN_H2, PortTls
from shoal.transport.grpc.peer_client import CHANNEL_CLOSE_GRACE_S, MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

UNARY_PATH = b"/Request/request"
#: A connection not made by then fails its calls unavailable (each call's own deadline comes first
#: when shorter: it then times out and the connection attempt goes on for the calls after it).
CONNECT_TIMEOUT_S = 10.0
#: The stream flow-control window we offer (the connection's is four times it): snapshot pages
#: of up to 64 MiB arrive with a WINDOW_UPDATE per 8 MiB read, not per 64 KB.
RECEIVE_WINDOW = 16 * 1024 * 1024
_MAX_TIMEOUT_MS = 99_999_999  # grpc-timeout takes at most 8 digits
#: gRPC status code → its name, for the PeerError text (as grpc.StatusCode names them)
STATUS_NAMES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
                5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
                9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
                14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


class _Unreachable(Exception):
    """The connection carrying a call failed: ``reason`` says how (refused, lost, ...)."""

    def __init__(self, reason: str, refused: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refused = refused


class PeerConnection(asyncio.Protocol):
    """One HTTP/2 connection to one peer's cluster port, carrying unary calls as streams."""

    __slots__ = ("_close_timer", "_flush_pending", "authority", "connecting", "failure", "host", "loop", "owner",
                 "paused", "pending", "port", "request_head", "session", "target", "transport", "usable")

    def __init__(self, owner: NativePeerTransport, target: str, host: str, port: int) -> None:
        self.owner = owner
        self.target = target
        self.host = host
        self.port = port
        self.loop = asyncio.get_running_loop()
        self.session = h2client.H2ClientSession(owner.max_message, RECEIVE_WINDOW)
        self.transport: Any = None
        self.pending: dict[int, tuple[asyncio.Future[tuple[int, str, Any]], asyncio.TimerHandle]] = {}
        self.usable = True  # takes new calls
        self.failure: _Unreachable | None = None
        self.paused = False
        self._flush_pending = False
        self._close_timer: asyncio.TimerHandle | None = None
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.authority = authority
        scheme = b"https" if owner.ssl_context is not None else b"http"
        self.request_head = [(b":method", b"POST"), (b":scheme", scheme), (b":path", UNARY_PATH),
                             (b":authority", authority.encode()), (b"te", b"trailers"),
                             (b"content-type", b"application/grpc"), (b"user-agent", b"shoal-peer")]
        self.connecting: asyncio.Task[None] | None = self.loop.create_task(self._connect())

    # --- connecting ----------------------------------------------------------------------
    async def _connect(self) -> None:
        context = self.owner.ssl_context
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await self.loop.create_connection(lambda: self, self.host, self.port, ssl=context,
                                                  server_hostname=self.host if context is not None else None)
        except ConnectionRefusedError:
            self._fail(_Unreachable("connection refused", refused=True))
        except TimeoutError:
            self._fail(_Unreachable(f"unavailable (no connection within {CONNECT_TIMEOUT_S:g} s)"))
        except ssl.SSLError as exc:
            self._fail(_Unreachable(f"unavailable (TLS handshake failed: {exc.reason or exc})"))
        except OSError as exc:
            self._fail(_Unreachable(f"unavailable ({exc.strerror or exc})"))
        finally:
            self.connecting = None

    def connection_made(self, transport: Any) -> None:  # uvloop's TCP transport is no asyncio.Transport
        if self.failure is not None:  # closed while connecting
            transport.abort()
            return
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a peer that vanished without a FIN is found by TCP keep-alive
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.flush()  # the preface, our SETTINGS and the calls submitted while connecting

    # --- calls ---------------------------------------------------------------------------
    def start(self, message: bytes, timeout_ms: int) -> tuple[int, asyncio.Future[tuple[int, str, Any]]]:
        """Submit one call; its future gives ``(status, message, answer bytes)``, or raises
        TimeoutError (deadline) or _Unreachable (the connection failed)."""
        headers = [*self.request_head, (b"grpc-timeout", b"%dm" % min(timeout_ms, _MAX_TIMEOUT_MS))]
        stream_id = self.session.call(headers, message)
        future: asyncio.Future[tuple[int, str, Any]] = self.loop.create_future()
        timer = self.loop.call_later(timeout_ms / 1000, self._expire, stream_id)
        self.pending[stream_id] = (future, timer)
        self.schedule_flush()
        return stream_id, future

    def cancel(self, stream_id: int) -> None:
        """The caller stopped waiting (deadline, or its task was cancelled): reset the stream."""
        entry = self.pending.pop(stream_id, None)
        if entry is not None:
            entry[1].cancel()
            self.session.cancel(stream_id)
            self.schedule_flush()
            self._close_if_drained()

    def _expire(self, stream_id: int) -> None:
        entry = self.pending.get(stream_id)
        if entry is not None:
            if not entry[0].done():
                entry[0].set_exception(TimeoutError())
            self.cancel(stream_id)

    # --- input ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        try:
            events = self.session.feed(data)
        except h2client.H2CallbackError:
            log.exception("native peer client: a session callback failed on the connection to %s", self.target)
            self._fail(_Unreachable("unavailable (client session failed)"))
            return
        except h2client.H2Error as exc:
            self._fail(_Unreachable(f"unavailable (HTTP/2 protocol error: {exc})"))
            return
        if events:
            self._handle(events)
        self.flush()

    def _handle(self, events: list[tuple[int, Any, Any, Any, Any]]) -> None:
        for kind, a, b, c, d in events:
            if kind == h2client.EV_DONE:
                entry = self.pending.pop(a, None)
                if entry is not None:
                    entry[1].cancel()
                    if not entry[0].done():
                        entry[0].set_result((b, c, d))
            elif kind == h2client.EV_GOAWAY:  # the peer is stopping: calls up to ``a`` finish, the rest fail
                self.retire()
        self._close_if_drained()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        reason = "connection closed by the peer" if exc is None else f"connection lost: {exc}"
        self._fail(_Unreachable(f"unavailable ({reason})"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

    # --- output --------------------------------------------------------------------------
    def schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_pending = False
        if self.transport is None or self.paused or self.failure is not None:
            return  # still connecting (the session keeps what it has), or over
        try:
            out = self.session.output()
        except h2client.H2Error as exc:
            self._fail(_Unreachable(f"unavailable (HTTP/2 send failed: {exc})"))
            return
        if out:
            self.transport.write(out)
        events = self.session.take_events()
        if events:
            self._handle(events)

    # --- ending ----------------------------------------------------------------------------
    def retire(self) -> None:
        """Take no new calls; close once the calls in flight are over (or after a grace time)."""
        if self.usable:
            self.usable = False
            self.owner.forget(self)
            if self.failure is None and self.pending:
                self._close_timer = self.loop.call_later(CHANNEL_CLOSE_GRACE_S, self._grace_over)
            self._close_if_drained()

    def _grace_over(self) -> None:
        self._close_timer = None
        self._fail(_Unreachable("unavailable (connection replaced)"))

    def _close_if_drained(self) -> None:
        if not self.usable and not self.pending and self.failure is None:
            self._fail(_Unreachable("unavailable (connection closed)"))

    def _fail(self, failure: _Unreachable) -> None:
        """The connection is over: its calls in flight fail with ``failure``; it is forgotten."""
        if self.failure is not None:
            return
        self.failure = failure
        self.usable = False
        self.owner.forget(self)
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        pending, self.pending = self.pending, {}
        for future, timer in pending.values():
            timer.cancel()
            if not future.done():
                future.set_exception(failure)
        if self.transport is not None:
            self.transport.close()
        if self.connecting is not None and self.connecting is not asyncio.current_task():
            self.connecting.cancel()

    def close(self) -> None:
        self._fail(_Unreachable("unavailable (transport closed)"))


class NativePeerTransport:
    """A PeerTransport over the native HTTP/2 client: one connection per peer, closed by :meth:`close`."""

    def __init__(self, self_address: str, port_offset: int, identity: tuple[str, str] | None = None,
                 max_message: int = MAX_MESSAGE_BYTES, tls: PortTls | None = None,
                 introduction: Mapping[str, str] | None = None) -> None:
        self.self_address = self_address
        self.port_offset = port_offset
        self.identity = identity
        self.max_message = max_message
        # With the peer TLS settings on, peers are called over TLS only: verified against the
        # trust file (or the system's CAs), showing our cluster certificate for mutual auth.
        self.ssl_context: ssl.SSLContext | None = None
        if tls is not None:
            self.ssl_context = tls.client_context()
            self.ssl_context.set_alpn_protocols([ALPN_H2])
        headers = {MEMBER_HEADER: self_address, **(introduction or {})}  # a worker's node and workers
        if identity is not None:
            headers[identity[0]] = identity[1]
        self._headers = headers
        self._connections: dict[str, PeerConnection] = {}
        self._retired: set[PeerConnection] = set()  # replaced, finishing their calls
        #: Peers whose last call failed unavailable or timed out → the reason logged.
        self._unreachable: dict[str, str] = {}

    def _connection(self, target: str) -> PeerConnection:
        conn = self._connections.get(target)
        if conn is None or not conn.session.can_open():
            if conn is not None:
                conn.retire()
            ip, _, port = target.rpartition(":")
            conn = PeerConnection(self, target, ip.strip("[]"), int(port) + self.port_offset)
            self._connections[target] = conn
        return conn

    def forget(self, conn: PeerConnection) -> None:
        """``conn`` takes no new calls: the next call to its peer opens a fresh connection."""
        if self._connections.get(conn.target) is conn:
            del self._connections[conn.target]
        if conn.failure is None:
            self._retired.add(conn)
        else:
            self._retired.discard(conn)

    async def call(self, target: str, type_name: str, body: bytes, timeout_ms: int) -> tuple[str, bytes]:
        """Send one request to the peer at ``target`` (its main ip:port) and return its answer."""
        message = encode(type_name, body, self._headers)
        if len(message) > self.max_message:  # as grpc refuses to send it
            raise PeerError(f"{type_name} to {target}: RESOURCE_EXHAUSTED message of {len(message)} bytes is over "
                            f"the limit of {self.max_message} bytes")
        conn = self._connection(target)
        try:
            stream_id, future = conn.start(message, timeout_ms)
        except h2client.H2Error:  # the session takes no new stream after all: a fresh connection does
            conn.retire()
            conn = self._connection(target)
            stream_id, future = conn.start(message, timeout_ms)
        try:
            status, details, answer = await future
        except TimeoutError:
            self._not_answering(target, f"no answer within {timeout_ms} ms", "deadline passed")
            raise TimeoutError(f"{type_name} to {target} timed out after {timeout_ms} ms") from None
        except _Unreachable as exc:
            self._not_answering(target, exc.reason, exc.reason)
            raise PeerUnavailable(f"{type_name} to {target}: {exc.reason}", exc.refused) from None
        except asyncio.CancelledError:
            conn.cancel(stream_id)
            raise
        if status != 0:
            if status == h2client.DEADLINE_EXCEEDED:
                self._not_answering(target, f"no answer within {timeout_ms} ms", details)
                raise TimeoutError(f"{type_name} to {target} timed out after {timeout_ms} ms")
            name = STATUS_NAMES.get(status, str(status))
            if status != h2client.UNAVAILABLE:  # the peer is there; the call itself failed
                raise PeerError(f"{type_name} to {target}: {name} {_short(details)}")
            reason = f"unavailable ({_short(details)})"
            self._not_answering(target, reason, details)
            conn.retire()
            raise PeerUnavailable(f"{type_name} to {target}: {reason}", False)
        try:
            reply_type, _headers, _client_ip, reply_body = decode(answer)
        except PayloadDecodeError as exc:
            raise PeerError(f"{type_name} to {target}: the answer is no Payload ({exc})") from None
        if self._unreachable.pop(target, None) is not None:
            log.info("peer %s answers again", target)
        return reply_type, reply_body

    def _not_answering(self, target: str, reason: str, details: str) -> None:
        if target in self._unreachable:
            log.debug("peer %s still not answering: %s (%s)", target, reason, details)
            return
        self._unreachable[target] = reason
        log.warning("peer %s is not answering: %s", target, reason)
        log.debug("peer %s: %s", target, details)

    async def close(self) -> None:
        """Close every connection (in-flight calls fail with PeerUnavailable)."""
        connections = [*self._connections.values(), *self._retired]
        self._connections.clear()
        self._retired.clear()
        connecting = [conn.connecting for conn in connections if conn.connecting is not None]
        for conn in connections:
            conn.close()
        await asyncio.gather(*connecting, return_exceptions=True)


def _short(details: str) -> str:
    """A status message cut to one short line."""
    return details.strip().split("\n", 1)[0][:120] or "no detail"
