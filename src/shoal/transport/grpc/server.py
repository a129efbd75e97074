"""The SDK gRPC server (Nacos GrpcSdkServer + GrpcRequestAcceptor + GrpcBiStreamRequestAcceptor).

Unary dispatch follows Nacos's order exactly (spec §1.6): cluster-only type → 502; node not
serving → 300; ServerCheck answered without registration; unknown type → 302; unregistered
connection → 301; unparseable body → 502; then the parameter filter (typed response 500/400)
and the handler, whose NacosError becomes an ErrorResponse with resultCode == errorCode. An
unexpected exception is logged once and answered 500: it never reaches grpc, the connection
or the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from shoal.config import Config
from shoal.errors import (
    BadRequestBody,
    Code,
    Forbidden,
    NacosError,
    NoHandler,
    ParamCheckFailed,
    PushGone,
    ServerStarting,
    Unregistered,
)
from shoal.metrics import Metrics
from shoal.transport.grpc import codec
from shoal.transport.grpc._proto import Payload
from shoal.transport.grpc.connections import Connection, ConnectionGone, ConnectionManager, is_success
from shoal.transport.grpc.handlers import CLUSTER_ONLY_TYPES, Handler, RequestContext

log = logging.getLogger(__name__)


class AuthFilter(Protocol):
    """Auth of SDK requests (Nacos RemoteRequestAuthFilter); both raise Forbidden."""

    def check_request(self, ctx: RequestContext, type_name: str, body: dict[str, Any]) -> None: ...

    def check_setup(self, headers: dict[str, str]) -> None: ...


#: Abilities we advertise in SetupAckRequest: only what is implemented (spec §2.3).
SERVER_ABILITIES = {"supportPersistentInstanceByGrpc": False}


class SdkServer:
    """Serves /Request/request and /BiRequestStream/requestBiStream on one port."""

    def __init__(self, config: Config, manager: ConnectionManager, handlers: dict[str, Handler],
                 is_serving: Callable[[], bool], metrics: Metrics, port: int,
                 source: str = "sdk", auth: AuthFilter | None = None) -> None:
        self.config = config
        self.auth = auth  # Nacos RemoteRequestAuthFilter: raises Forbidden
        self.manager = manager
        self.handlers = dict(handlers)
        self.handlers["HealthCheckRequest"] = Handler("HealthCheckResponse", lambda ctx, body: codec.ok())
        self.is_serving = is_serving
        self.metrics = metrics
        self.port = port
        self.source = source
        self._server: Any = None

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        options = [
            ("grpc.max_receive_message_length", self.config.max_inbound_message_size),
            ("grpc.max_send_message_length", -1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", self.config.grpc_permit_keepalive_ms),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=options)
        unary = grpc.unary_unary_rpc_method_handler(
            self._unary, request_deserializer=Payload.FromString, response_serializer=Payload.SerializeToString)
        stream = grpc.stream_stream_rpc_method_handler(
            self._bi_stream, request_deserializer=Payload.FromString, response_serializer=Payload.SerializeToString)
        server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("Request", {"request": unary}),
            grpc.method_handlers_generic_handler("BiRequestStream", {"requestBiStream": stream}),
        ])
        address = f"{self.config.host}:{self.port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {address} for gRPC: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {address} for gRPC (address in use?)")
        await server.start()
        self._server = server
        log.info("%s gRPC server listening on %s", self.source, address)

    async def stop(self, grace_s: float) -> None:
        if self._server is None:
            return
        self.manager.close_all("server shutting down")
        await self._server.stop(grace_s)
        self._server = None

    # --- unary --------------------------------------------------------------------------
    async def _unary(self, payload: Any, context: Any) -> Any:
        type_name = payload.metadata.type
        handler = self.handlers.get(type_name)
        label = type_name if handler is not None or type_name == "ServerCheckRequest" else "unknown"
        try:
            reply_type, body, code = self._dispatch(payload, context, type_name, handler)
        except Exception:  # the last line of defence: never let grpc see an exception
            log.exception("unexpected failure answering %s from %s", type_name, context.peer())
            code = NacosError.code
            reply_type, body = "ErrorResponse", codec.error(code, code, "server error")
        self.metrics.request("grpc", label, code)
        return codec.encode(reply_type, body)

    def _dispatch(self, payload: Any, context: Any, type_name: str,
                  handler: Handler | None) -> tuple[str, str, int]:
        peer = context.peer()
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
            body = codec.decode_body(payload)
        except NacosError as exc:  # refused before any handler ran: resultCode 500
            return "ErrorResponse", codec.error(Code.SERVER_ERROR, exc.code, exc.message), exc.code
        self.manager.touch(conn)
        ctx = RequestContext(conn, _merge_headers(body.get("headers"), payload.metadata.headers))
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
    async def _bi_stream(self, request_iterator: Any, context: Any) -> None:
        peer = context.peer()
        conn = self.manager.ensure(peer)
        if conn.stream is not None:
            self.manager.unregister(conn.connection_id, "replaced by a new stream on the same transport")
            conn = self.manager.ensure(peer)
        conn.stream = context
        conn.stream_task = asyncio.current_task()
        try:
            async for payload in request_iterator:
                type_name = payload.metadata.type
                if type_name == "ConnectionSetupRequest":
                    refusal = self._setup(conn, payload)
                    if refusal is not None:
                        self.manager.unregister(conn.connection_id, refusal)
                        await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
                    if self._wants_setup_ack(payload):
                        await self.manager.write(conn, codec.encode(
                            "SetupAckRequest", codec.dumps(
                                {"headers": {}, "abilityTable": SERVER_ABILITIES, "module": "internal"})))
                elif type_name.endswith("Response"):
                    self.manager.on_response(conn, payload)
                else:
                    log.debug("ignoring %s sent on the stream of %s", type_name, conn.connection_id)
        except asyncio.CancelledError:
            if conn.closed:  # unregistered by us: end the stream with an error so the client reconnects
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection unregistered by server")
            raise
        except ConnectionGone:
            pass
        finally:
            if not conn.closed:
                self.manager.unregister(conn.connection_id, "stream closed by client")

    def _setup(self, conn: Connection, payload: Any) -> str | None:
        """Apply ConnectionSetupRequest; the reason to refuse it, or None once registered."""
        try:
            body = codec.decode_body(payload)
        except BadRequestBody as exc:
            return f"bad ConnectionSetupRequest: {exc.message}"
        labels = body.get("labels")
        conn.labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        conn.client_version = str(body.get("clientVersion") or "")
        conn.tenant = str(body.get("tenant") or "")
        conn.app = conn.labels.get("AppName") or "-"
        conn.source = conn.labels.get("source") or "sdk"
        conn.client_ip = payload.metadata.clientIp or conn.remote_ip
        if conn.source == "sdk" and not self.is_serving():
            return "server is starting"
        if self.auth is not None:
            try:
                self.auth.check_setup(_merge_headers(body.get("headers"), payload.metadata.headers))
            except Forbidden as exc:
                return f"refused: {exc.message}"
        limit = self.manager.check_limit(conn.client_ip, conn.app)
        if limit is not None:
            log.warning("refusing connection %s: %s", conn.describe(), limit)
            return limit
        self.manager.register(conn)
        return None

    @staticmethod
    def _wants_setup_ack(payload: Any) -> bool:
        # Only clients that sent a (non-null) abilityTable negotiate; pre-2.3 ones get nothing.
        try:
            return codec.decode_body(payload).get("abilityTable") is not None
        except BadRequestBody:
            return False

    # --- push sender (PushSender protocol) -------------------------------------------------
    async def send_push(self, client_id: str, service_info_json: str, timeout_ms: int) -> bool:
        try:
            reply = await self.manager.request(client_id, "NotifySubscriberRequest", {"module": "naming"},
                                               timeout_ms, raw={"serviceInfo": service_info_json})
        except ConnectionGone as exc:
            raise PushGone(str(exc)) from None
        return is_success(reply)

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
            await self.manager.write(conn, codec.encode(
                "ConnectResetRequest", codec.server_request(fields, self.manager.next_request_id())))


def _merge_headers(body_headers: Any, metadata_headers: Any) -> dict[str, str]:
    """Body headers then metadata headers (which win), case-insensitively (spec §1.2)."""
    merged: dict[str, str] = {}
    if isinstance(body_headers, dict):
        for key, value in body_headers.items():
            merged[str(key).lower()] = str(value)
    for key, value in metadata_headers.items():
        merged[key.lower()] = value
    return merged
