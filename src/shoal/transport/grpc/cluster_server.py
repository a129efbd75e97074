"""The cluster gRPC server (main port + 1001; Nacos GrpcClusterServer).

Peers call /Request/request with our own cluster request types; bodies are bytes (binary sync
batches and snapshot pages, JSON for the rest). Only members may call it, and when a cluster
identity is configured every request must carry it (nacos.core.auth.server.identity.*);
anything else is refused with 403. A handler failure is logged and answered as an
ErrorResponse — it never reaches grpc or the loop.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from shoal.config import Config
from shoal.distro.transport import MEMBER_HEADER
from shoal.errors import Code, Forbidden, NacosError
from shoal.metrics import Metrics
from shoal.transport.grpc import codec
from shoal.transport.grpc._proto import Metadata, Payload

log = logging.getLogger(__name__)

Dispatch = Callable[[str, str, bytes], Awaitable[tuple[str, bytes]]]


class ClusterServer:
    """The cluster port's gRPC server: checks membership identity, hands each request to
    ``dispatch`` (the DistroProtocol) and turns failures into ErrorResponse payloads."""

    def __init__(self, config: Config, dispatch: Dispatch, metrics: Metrics) -> None:
        self.config = config
        self.dispatch = dispatch
        self.metrics = metrics
        self._server: Any = None

    async def start(self) -> None:
        """Bind the cluster port (OSError when it is taken) and start serving."""
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ])
        unary = grpc.unary_unary_rpc_method_handler(
            self._unary, request_deserializer=Payload.FromString, response_serializer=Payload.SerializeToString)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("Request", {"request": unary})])
        address = f"{self.config.host}:{self.config.cluster_port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address} for the cluster port: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {address} for the cluster port (address in use?)")
        await server.start()
        self._server = server
        log.info("cluster gRPC server listening on %s", address)

    async def stop(self, grace_s: float) -> None:
        """Stop serving, letting in-flight requests finish for ``grace_s`` seconds."""
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    async def _unary(self, payload: Any, context: Any) -> Any:
        type_name = payload.metadata.type
        headers = {k.lower(): v for k, v in payload.metadata.headers.items()}
        sender = headers.get(MEMBER_HEADER, "")
        try:
            self._check_identity(headers)
            reply_type, body = await self.dispatch(sender, type_name, bytes(payload.body.value))
            code = 200
        except NacosError as exc:
            reply_type, code = "ErrorResponse", exc.code
            result = Code.SERVER_ERROR if exc.code in (Code.NO_HANDLER, Code.NO_RIGHT) else exc.code
            body = codec.error(result, exc.code, exc.message).encode()
        except Exception as exc:  # malformed batches land here too: answer, never crash
            log.warning("cluster request %s from %s failed: %s", type_name, sender or context.peer(), exc,
                        exc_info=not isinstance(exc, ValueError))
            reply_type, code = "ErrorResponse", Code.SERVER_ERROR
            body = codec.error(code, code, f"handle distro request with exception: {exc}").encode()
        self.metrics.request("cluster", type_name if code != Code.NO_HANDLER else "unknown", code)
        return Payload(metadata=Metadata(type=reply_type), body={"value": body})

    def _check_identity(self, headers: dict[str, str]) -> None:
        key, value = self.config.cluster_identity_key, self.config.cluster_identity_value
        if key and not hmac.compare_digest(headers.get(key.lower(), ""), value):
            raise Forbidden("cluster identity missing or wrong")
