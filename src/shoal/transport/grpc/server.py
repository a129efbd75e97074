"""The SDK gRPC service (Nacos GrpcSdkServer + GrpcRequestAcceptor + GrpcBiStreamRequestAcceptor).

This is the transport-neutral core: serialized Payload bytes in, Payload bytes out. The
transport (``shoal.remote.transport``: native over libnghttp2, or grpc.aio) only frames
calls and hands them here, identifying the connection by its peer address; see
``transports.py``.

Unary dispatch follows Nacos's order exactly (docs/protocol.md §1.6): cluster-only type → 502; node not
serving → 300; ServerCheck answered without registration; unknown type → 302; unregistered
connection → 301; unparseable body → 502; then the parameter filter (typed response 500/400)
and the handler, whose NacosError becomes an ErrorResponse with resultCode == errorCode. An
unexpected exception is logged once and answered 500: it never reaches the transport, the
connection or the loop.

Garbage is answered, never raised: bytes that are no Payload get INVALID_ARGUMENT (the stream
they came on is ended with it), a body that is not a JSON object (or is nested too deeply) a
502, a malformed ``*Response`` on a stream is dropped. Each kind is logged at most once per
interval with a count (:class:`shoal.logutil.RateLimitedLog`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from shoal.config import Config
from shoal.errors import (
    BadRequestBody,
    Code,
    Forbidden,
    GrpcStatus,
    NacosError,
    NoHandler,
    ParamCheckFailed,
    ServerStarting,
    Unregistered,
)
from shoal.kernels.payload import PayloadDecodeError, decode, encode
from shoal.logutil import RateLimitedLog
from shoal.metrics import Metrics
from shoal.tls import PortTls
from shoal.transport.grpc import codec
from shoal.transport.grpc.connections import Connection, ConnectionGone, ConnectionManager, StreamSink, is_success
from shoal.transport.grpc.handlers import CLUSTER_ONLY_TYPES, Handler, RequestContext
from shoal.transport.grpc.transports import GrpcTransport, make_transport

log = logging.getLogger(__name__)


class AuthFilter(Protocol):
    """Auth of SDK requests (Nacos RemoteRequestAuthFilter); both raise Forbidden."""

    def check_request(self, ctx: RequestContext, type_name: str, body: dict[str, Any]) -> None: ...

    def check_setup(self, headers: dict[str, str]) -> None: ...


#: Abilities we advertise in SetupAckRequest: only what is implemented (docs/protocol.md §2.3).
SERVER_ABILITIES = {"supportPersistentInstanceByGrpc": True, "fuzzyWatch": True, "lock": True}


class SdkServer:
    """Serves /Request/request and /BiRequestStream/requestBiStream on one port."""

    def __init__(self, config: Config, manager: ConnectionManager, handlers: dict[str, Handler],
                 is_serving: Callable[[], bool], metrics: Metrics, port: int,
                 source: str = "sdk", auth: AuthFilter | None = None, tls: PortTls | None = None,
                 reuse_port: bool = False) -> None:
        self.config = config
        self.reuse_port = reuse_port  # a worker's: the port is shared with the node's other workers
        self.tls = tls  # None: plaintext
        self.auth = auth  # Nacos RemoteRequestAuthFilter: raises Forbidden
        self.manager = manager
        self.handlers = dict(handlers)
        self.handlers["HealthCheckRequest"] = Handler("HealthCheckResponse", lambda ctx, body: codec.ok())
        self.is_serving = is_serving
        self.metrics = metrics
        self.port = port
        self.source = source
        self.garbage = RateLimitedLog(log)  # one line per kind of bad input per interval
        self._transport: GrpcTransport | None = None

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        transport = make_transport(self.config, self.port, f"{self.source} gRPC", self, self,
                                   self.config.max_inbound_message_size, self.tls, self.reuse_port)
        await transport.start()
        self._transport = transport

    async def stop(self, grace_s: float) -> None:
        if self._transport is None:
            return
        self.manager.close_all("server shutting down")
        await self._transport.stop(grace_s)
        self._transport = None

    # --- unary --------------------------------------------------------------------------
    def unary(self, data: bytes, peer: str) -> bytes | Awaitable[bytes]:
        """Answer one /Request/request call; raises PayloadDecodeError for bytes that are no Payload
        (the transport answers INVALID_ARGUMENT). A handler that waits (a CP write) makes the answer
        an awaitable; both transports await it."""
        started = time.perf_counter()
        try:
            type_name, headers, _client_ip, raw = decode(data)
        except PayloadDecodeError as exc:
            self.garbage.warning("bad-frame", "request from %s is no Payload (answered INVALID_ARGUMENT): %s",
                                 peer, exc)
            raise
        handler = self.handlers.get(type_name)
        label = type_name if handler is not None or type_name == "ServerCheckRequest" else "unknown"
        try:
            reply_type, body, code = self._dispatch(peer, type_name, headers, raw, handler)
        except Exception as exc:  # the last line of defence: never let the transport see an exception
            self.garbage.log(logging.ERROR, f"unexpected {type(exc).__name__}", "unexpected failure answering %s "
                             "from %s", type_name, peer, exc_info=True)
            code = NacosError.code
            reply_type, body = "ErrorResponse", codec.error(code, code, "server error")
        if not isinstance(body, bytes):
            if isinstance(body, codec.Encoded):  # the handler encoded the whole answer itself
                self.metrics.request("grpc", label, code, time.perf_counter() - started)
                return body.data
            return self._answer_later(type_name, label, reply_type, body, peer, started)
        self.metrics.request("grpc", label, code, time.perf_counter() - started)
        return encode(reply_type, body)

    async def _answer_later(self, type_name: str, label: str, reply_type: str, pending: Awaitable[bytes],
                            peer: str, started: float) -> bytes:
        code = 200
        try:
            body = await pending
        except NacosError as exc:
            code, reply_type = exc.code, "ErrorResponse"
            body = codec.error(exc.code, exc.code, exc.message)
        except Exception:
            log.exception("unexpected failure answering %s from %s", type_name, peer)
            code, reply_type = NacosError.code, "ErrorResponse"
            body = codec.error(code, code, "server error")
        self.metrics.request("grpc", label, code, time.perf_counter() - started)
        return encode(reply_type, body)

    def _dispatch(self, peer: str, type_name: str, headers: dict[str, str], raw: bytes,
                  handler: Handler | None) -> tuple[str, bytes | codec.Encoded | Awaitable[bytes], int]:
        try:
            if self.source == "sdk" and type_name in CLUSTER_ONLY_TYPES:
                raise BadRequestBody(f" invoke {type_name} from sdk is forbidden")
            if not self.is_serving():
                raise ServerStarting()
            if type_name == "ServerCheckRequest":
                conn = self.manager.ensure(peer)
                self.manager.touch(conn)
                return "ServerCheckResponse", codec.ok(
                    {"connectionId": conn.connection_id, "supportAbilityNegotiation": True}), 200
            if handler is None:
                raise NoHandler()
            found = self.manager.for_peer(peer)
            if found is None or not found.registered:
                raise Unregistered()
            conn = found
            body = codec.parse_body(raw)
            merged = _merge_headers(body.get("headers"), headers)
        except NacosError as exc:  # refused before any handler ran: resultCode 500
            return "ErrorResponse", codec.error(Code.SERVER_ERROR, exc.code, exc.message), exc.code
        self.manager.touch(conn)
        ctx = RequestContext(conn, merged)
        try:
            if self.auth is not None:
                self.auth.check_request(ctx, type_name, body)
            return handler.response_type, handler.handle(ctx, body), 200
        except Forbidden as exc:  # the auth filter's refusal is typed as the handler's response too
            return handler.response_type, codec.error(Code.SERVER_ERROR, exc.code, exc.message), exc.code
        except ParamCheckFailed as exc:  # a filter failure is typed as the handler's response
            return handler.response_type, codec.error(Code.SERVER_ERROR, exc.code, exc.message), exc.code
        except NacosError as exc:
            return "ErrorResponse", codec.error(exc.code, exc.code, exc.message), exc.code

    # --- bi stream ----------------------------------------------------------------------
    def open_stream(self, peer: str, sink: StreamSink) -> Connection:
        """A bi stream opened on this transport: its connection, whose stream is now ``sink``."""
        conn = self.manager.ensure(peer)
        if conn.stream is not None:
            self.manager.unregister(conn.connection_id, "replaced by a new stream on the same transport")
            conn = self.manager.ensure(peer)
        conn.stream = sink
        return conn

    def stream_message(self, conn: Connection, data: bytes) -> None:
        """One message the client sent on its stream (setup, or a response to our request).

        Never raises: bytes that are no Payload, or a ConnectionSetupRequest whose body is not a
        JSON object, end the stream with INVALID_ARGUMENT (and the connection); anything
        unexpected is logged and the message dropped."""
        if conn.closed:
            return
        try:
            self._stream_message(conn, data)
        except Exception as exc:  # the last line of defence: the transport's read path must not see it
            self.garbage.log(logging.ERROR, f"unexpected {type(exc).__name__} on a stream", "unexpected failure "
                             "handling a message on the stream of %s", conn.connection_id, exc_info=True)

    def _stream_message(self, conn: Connection, data: bytes) -> None:
        try:
            type_name, headers, client_ip, raw = decode(data)
        except PayloadDecodeError as exc:
            self.garbage.warning("bad-stream-frame", "message on the stream of %s is no Payload (stream ended "
                                 "INVALID_ARGUMENT): %s", conn.connection_id, exc)
            self._end_stream(conn, f"message is not a Payload: {exc}")
            return
        if type_name == "ConnectionSetupRequest":
            try:
                refusal = self._setup(conn, headers, client_ip, raw)
            except BadRequestBody as exc:
                self.garbage.warning("bad-setup", "ConnectionSetupRequest on the stream of %s refused (stream "
                                     "ended INVALID_ARGUMENT): %s", conn.connection_id, exc.message)
                self._end_stream(conn, f"bad ConnectionSetupRequest: {exc.message}")
                return
            if refusal is not None:
                self.manager.unregister(conn.connection_id, refusal)  # ends the stream UNAVAILABLE
                return
            if self._wants_setup_ack(raw):
                with contextlib.suppress(ConnectionGone):
                    self.manager.send(conn, encode("SetupAckRequest", codec.dumps(
                        {"headers": {}, "abilityTable": SERVER_ABILITIES, "module": "internal"})))
        elif type_name.endswith("Response"):
            self.manager.on_response(conn, type_name, raw)
        else:
            log.debug("ignoring %s sent on the stream of %s", type_name, conn.connection_id)

    def _end_stream(self, conn: Connection, reason: str) -> None:
        """End the stream with INVALID_ARGUMENT (the client sent something unusable) and drop the
        connection; resending the same bytes on a new stream would fail the same way."""
        if conn.stream is not None:
            conn.stream.close(GrpcStatus.INVALID_ARGUMENT, reason)
        self.manager.unregister(conn.connection_id, reason)

    def stream_ended(self, conn: Connection, reason: str = "stream closed by client") -> None:
        """The stream is over (client end, reset, or transport gone): drop its connection."""
        if not conn.closed:
            self.manager.unregister(conn.connection_id, reason)

    def eject(self, conn: Connection, reason: str) -> None:
        """Close a connection whose transport cannot take more output (slow or stuck reader)."""
        self.manager.unregister(conn.connection_id, reason)

    def transport_closed(self, peer: str) -> None:
        """The TCP connection is gone: forget a connection that never opened its stream."""
        conn = self.manager.for_peer(peer)
        if conn is not None and conn.stream is None:
            self.manager.unregister(conn.connection_id, "transport closed")

    def _setup(self, conn: Connection, headers: dict[str, str], client_ip: str, raw: bytes) -> str | None:
        """Apply ConnectionSetupRequest; the reason to refuse it, or None once registered.
        Raises BadRequestBody when the body is not a JSON object."""
        body = codec.parse_body(raw)
        labels = body.get("labels")
        conn.labels = {str(k): _scalar(v, "labels") for k, v in labels.items()} if isinstance(labels, dict) else {}
        conn.client_version = _scalar(body.get("clientVersion") or "", "clientVersion")
        conn.tenant = _scalar(body.get("tenant") or "", "tenant")
        conn.app = conn.labels.get("AppName") or "-"
        conn.source = conn.labels.get("source") or "sdk"
        conn.client_ip = client_ip or conn.remote_ip
        merged = _merge_headers(body.get("headers"), headers)  # a header that is no scalar: BadRequestBody
        if conn.source == "sdk" and not self.is_serving():
            return "server is starting"
        if self.auth is not None:
            try:
                self.auth.check_setup(merged)
            except Forbidden as exc:
                return f"refused: {exc.message}"
        limit = self.manager.check_limit(conn.client_ip, conn.app)
        if limit is not None:
            log.warning("refusing connection %s: %s", conn.describe(), limit)
            return limit
        self.manager.register(conn)
        return None

    @staticmethod
    def _wants_setup_ack(raw: bytes) -> bool:
        # Only clients that sent a (non-null) abilityTable negotiate; pre-2.3 ones get nothing.
        try:
            return codec.parse_body(raw).get("abilityTable") is not None
        except BadRequestBody:
            return False

    # --- server → client requests (pushes and fuzzy-watch notifications: client_requests.py) ----
    async def probe(self, conn: Connection, timeout_ms: int) -> bool:
        """ClientDetectionRequest: True if the client answered success in time."""
        started = time.monotonic()
        try:
            reply = await self.manager.request(conn.connection_id, "ClientDetectionRequest",
                                               {"module": "internal"}, timeout_ms)
        except (ConnectionGone, TimeoutError):
            return False
        log.debug("probe of %s answered in %.1f ms", conn.connection_id, (time.monotonic() - started) * 1000)
        return is_success(reply)

    async def reset(self, conn: Connection, redirect: str) -> None:
        """ConnectResetRequest (optionally naming a server to move to); no answer awaited."""
        fields: dict[str, Any] = {"module": "internal"}
        if redirect:
            ip, _, port = redirect.rpartition(":")
            fields.update(serverIp=ip, serverPort=port)
        with contextlib.suppress(ConnectionGone):
            self.manager.send(conn, encode(
                "ConnectResetRequest", codec.server_request(fields, self.manager.next_request_id())))


def _scalar(value: Any, field: str) -> str:
    """A string field of a request body (Nacos's ``Map<String, String>`` or ``String``); an object
    or array there is a bad body, as Jackson refuses it (and ``str()`` of hostile nesting recurses)."""
    if isinstance(value, dict | list):
        raise BadRequestBody(f"'{field}' must hold strings, not a JSON {type(value).__name__}")
    return str(value)


def _merge_headers(body_headers: Any, metadata_headers: dict[str, str]) -> dict[str, str]:
    """Body headers then metadata headers (which win), case-insensitively (docs/protocol.md §1.3).
    Raises BadRequestBody when a body header is an object or an array."""
    merged: dict[str, str] = {}
    if isinstance(body_headers, dict):
        for key, value in body_headers.items():
            merged[str(key).lower()] = _scalar(value, "headers")
    for key, value in metadata_headers.items():
        merged[key.lower()] = value
    return merged
