"""The cluster gRPC server (main port + 1001; Nacos GrpcClusterServer).

Peers call /Request/request with our own cluster request types; bodies are bytes (binary sync
batches and snapshot pages, JSON for the rest). Only members may call it, and when a cluster
identity is configured every request must carry it (nacos.core.auth.server.identity.*);
anything else is refused with 403. A body without its type's shape is answered 502
(BadRequestBody, checked by the DistroProtocol before the handler runs), bytes that are no
Payload INVALID_ARGUMENT. A handler failure is answered as an ErrorResponse — it never reaches
the transport or the loop. Each kind of failure is logged at most once per interval with a count.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from shoal.config import Config
from shoal.distro.members import NodeLayout, introduced_by
from shoal.distro.transport import MEMBER_HEADER
from shoal.errors import BadRequestBody, Code, Forbidden, NacosError
from shoal.kernels.payload import PayloadDecodeError, decode, encode
from shoal.logutil import RateLimitedLog
from shoal.metrics import Metrics
from shoal.tls import PortTls
from shoal.transport.grpc import codec
from shoal.transport.grpc.transports import GrpcTransport, make_transport
from shoal.transport.sharing import PortSharing

log = logging.getLogger(__name__)

#: (sender, type, body, the sender's node and workers as its headers name them) → (type, body)
Dispatch = Callable[[str, str, bytes, NodeLayout | None], Awaitable[tuple[str, bytes]]]


class ClusterServer:
    """The cluster port's service: checks membership identity, hands each request to ``dispatch``
    (the DistroProtocol) and turns failures into ErrorResponse payloads; its transport is the
    configured one (native or grpcio)."""

    def __init__(self, config: Config, dispatch: Dispatch, metrics: Metrics, tls: PortTls | None = None,
                 sharing: PortSharing | None = None) -> None:
        self.config = config
        self.sharing = sharing  # a worker's: the public port shared, and its private one
        self.tls = tls  # None: plaintext
        self.dispatch = dispatch
        self.metrics = metrics
        self.garbage = RateLimitedLog(log)  # bad input and failures: one line per kind per interval
        self._transports: list[GrpcTransport] = []
        self._tasks: set[asyncio.Task[bytes]] = set()  # requests being handled (see unary)

    async def start(self) -> None:
        """Bind the cluster port (OSError when it is taken) and start serving; a worker binds its
        private cluster port here, and the node's (shared) once it serves (:meth:`share`)."""
        await self._listen(self.config.cluster_port if self.sharing is None else self.sharing.cluster_port, False)

    async def share(self) -> None:
        """A worker's: serve the node's cluster port too, beside its sibling workers (SO_REUSEPORT)."""
        await self._listen(self.config.cluster_port, True)

    async def _listen(self, port: int, shared: bool) -> None:
        transport = make_transport(self.config, port, "cluster gRPC", self, None,
                                   self.config.cluster_max_inbound_message_size, self.tls, shared)
        await transport.start()
        self._transports.append(transport)

    async def stop(self, grace_s: float) -> None:
        """Stop serving, letting in-flight requests finish for ``grace_s`` seconds."""
        transports, self._transports = self._transports, []
        await asyncio.gather(*(t.stop(grace_s) for t in transports))

    def unary(self, data: bytes, peer: str) -> Awaitable[bytes]:
        """One /Request/request from a peer: the answer's bytes, awaitable. Raises PayloadDecodeError
        at once for bytes that are no Payload (the transport answers INVALID_ARGUMENT).

        The request is handled in a task of its own, started here, not in a coroutine handed to
        the transport: a transport that stops waiting before its own task ran (the peer reset the
        stream or its deadline passed in the same batch of events, as when a paused node gets
        SIGCONT and reads everything queued meanwhile) drops a task that finishes by itself, never a
        coroutine nobody awaits ("coroutine 'ClusterServer.unary' was never awaited"). A task
        that is awaited and then cancelled is cancelled with it."""
        started = time.perf_counter()
        try:
            type_name, raw_headers, _client_ip, raw = decode(data)
        except PayloadDecodeError as exc:
            self.garbage.warning("bad-frame", "cluster request from %s is no Payload (answered INVALID_ARGUMENT): %s",
                                 peer, exc)
            raise
        task = asyncio.get_running_loop().create_task(self._handle(type_name, raw_headers, raw, peer, started))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _handle(self, type_name: str, raw_headers: dict[str, str], raw: bytes, peer: str,
                      started: float) -> bytes:
        headers = {k.lower(): v for k, v in raw_headers.items()}
        sender = headers.get(MEMBER_HEADER, "")
        try:
            self._check_identity(headers)
            reply_type, body = await self.dispatch(sender, type_name, raw, introduced_by(sender, headers))
            code = 200
        except NacosError as exc:
            if isinstance(exc, BadRequestBody):
                self.garbage.warning(f"bad-body {type_name[:64]}", "cluster request %s from %s refused: %s",
                                     type_name, sender or peer, exc.message)
            reply_type, code = "ErrorResponse", exc.code
            result = Code.SERVER_ERROR if exc.code in (Code.NO_HANDLER, Code.NO_RIGHT) else exc.code
            body = codec.error(result, exc.code, exc.message)
        except Exception as exc:  # a handler's failure: answer, never crash (a traceback once per interval)
            # A ValueError is a binary part that does not decode (a sync batch's SyncDecodeError):
            # answered 500 as Nacos's DistroDataRequestHandler answers a failed request, logged
            # without a traceback. Anything else is a bug here: logged with its traceback.
            bad_input = isinstance(exc, ValueError)
            self.garbage.log(logging.WARNING if bad_input else logging.ERROR,
                             f"failed {type_name[:64]} {type(exc).__name__}", "cluster request %s from %s failed: %s",
                             type_name, sender or peer, exc, exc_info=not bad_input)
            reply_type, code = "ErrorResponse", Code.SERVER_ERROR
            body = codec.error(code, code, f"handle distro request with exception: {exc}")
        self.metrics.request("cluster", type_name if code != Code.NO_HANDLER else "unknown", code,
                             time.perf_counter() - started)
        return encode(reply_type, body)

    def _check_identity(self, headers: dict[str, str]) -> None:
        key, value = self.config.cluster_identity_key, self.config.cluster_identity_value
        if key and not hmac.compare_digest(headers.get(key.lower(), ""), value):
            raise Forbidden("cluster identity missing or wrong")
