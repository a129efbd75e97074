"""The cluster gRPC server (main port + 1001; Nacos GrpcClusterServer).

Peers call /Request/request with our own cluster request types; bodies are bytes (binary sync
batches and snapshot pages, JSON for the rest). Only members may call it, and when a cluster
identity is configured every request must carry it (nacos.core.auth.server.identity.*);
anything else is refused with 403. A handler failure is logged and answered as an
ErrorResponse — it never reaches the transport or the loop.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from shoal.config import Config
from shoal.distro.transport import MEMBER_HEADER
from shoal.errors import Code, Forbidden, NacosError
from shoal.kernels.payload import decode, encode
from shoal.metrics import Metrics
from shoal.tls import PortTls
from shoal.transport.grpc import codec
from shoal.transport.grpc.transports import GrpcTransport, make_transport

log = logging.getLogger(__name__)

Dispatch = Callable[[str, str, bytes], Awaitable[tuple[str, bytes]]]


class ClusterServer:
    """The cluster port's service: checks membership identity, hands each request to ``dispatch``
    (the DistroProtocol) and turns failures into ErrorResponse payloads; its transport is the
    configured one (native or grpcio)."""

    def __init__(self, config: Config, dispatch: Dispatch, metrics: Metrics, tls: PortTls | None = None) -> None:
        self.config = config
        self.tls = tls  # None: plaintext
        self.dispatch = dispatch
        self.metrics = metrics
        self._transport: GrpcTransport | None = None

    async def start(self) -> None:
        """Bind the cluster port (OSError when it is taken) and start serving."""
        transport = make_transport(self.config, self.config.cluster_port, "cluster gRPC", self, None,
                                   self.config.cluster_max_inbound_message_size, self.tls)
        await transport.start()
        self._transport = transport

    async def stop(self, grace_s: float) -> None:
        """Stop serving, letting in-flight requests finish for ``grace_s`` seconds."""
        if self._transport is not None:
            await self._transport.stop(grace_s)
            self._transport = None

    async def unary(self, data: bytes, peer: str) -> bytes:
        """One /Request/request from a peer; raises PayloadDecodeError for bytes that are no Payload."""
        started = time.perf_counter()
        type_name, raw_headers, _client_ip, raw = decode(data)
        headers = {k.lower(): v for k, v in raw_headers.items()}
        sender = headers.get(MEMBER_HEADER, "")
        try:
            self._check_identity(headers)
            reply_type, body = await self.dispatch(sender, type_name, raw)
            code = 200
        except NacosError as exc:
            reply_type, code = "ErrorResponse", exc.code
            result = Code.SERVER_ERROR if exc.code in (Code.NO_HANDLER, Code.NO_RIGHT) else exc.code
            body = codec.error(result, exc.code, exc.message)
        except Exception as exc:  # malformed batches land here too: answer, never crash
            log.warning("cluster request %s from %s failed: %s", type_name, sender or peer, exc,
                        exc_info=not isinstance(exc, ValueError))
            reply_type, code = "ErrorResponse", Code.SERVER_ERROR
            body = codec.error(code, code, f"handle distro request with exception: {exc}")
        self.metrics.request("cluster", type_name if code != Code.NO_HANDLER else "unknown", code,
                             time.perf_counter() - started)
        return encode(reply_type, body)

    def _check_identity(self, headers: dict[str, str]) -> None:
        key, value = self.config.cluster_identity_key, self.config.cluster_identity_value
        if key and not hmac.compare_digest(headers.get(key.lower(), ""), value):
            raise Forbidden("cluster identity missing or wrong")
