"""The gRPC side of the Distro peer seam: one channel per peer to its cluster port
(main port + ``nacos.server.grpc.cluster.port.offset``), requests through /Request/request.

This is the production :class:`shoal.distro.transport.PeerTransport`; app.py builds it and
hands it to the DistroProtocol, which never sees gRPC. Bodies travel as bytes inside
``Payload.body.value``; gRPC status codes become the seam's errors (``TimeoutError``,
:class:`PeerUnavailable`, :class:`PeerError`), with a short reason instead of gRPC's full text.

Logging: one WARNING when a peer stops answering (unavailable or timed out), DEBUG while it
stays so, one INFO when a call to it succeeds again. A channel whose call failed UNAVAILABLE is
replaced, so the next call connects at once instead of failing against a channel still in its
reconnect back-off (which made a restarted peer look refused).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import grpc

from shoal.distro.transport import MEMBER_HEADER, PeerError, PeerUnavailable
from shoal.tls import PortTls
from shoal.transport.grpc._proto import Metadata, Payload

log = logging.getLogger(__name__)

#: Largest message a peer may send or receive (snapshot pages stay far below it).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: gRPC's own reconnect back-off towards a peer that went away.
INITIAL_RECONNECT_BACKOFF_MS = 200
MAX_RECONNECT_BACKOFF_MS = 2000
#: How long a replaced channel's remaining calls may take before it is closed under them.
CHANNEL_CLOSE_GRACE_S = 5.0


class GrpcPeerTransport:
    """A PeerTransport over gRPC: one lazily opened channel per peer, closed by :meth:`close`."""

    def __init__(self, self_address: str, port_offset: int, identity: tuple[str, str] | None = None,
                 max_message: int = MAX_MESSAGE_BYTES, tls: PortTls | None = None,
                 introduction: Mapping[str, str] | None = None) -> None:
        self.self_address = self_address
        self.introduction = dict(introduction or {})  # a worker's node and workers
        # With the peer TLS settings on, peers are called over TLS only: verified against the
        # trust file (or the system's CAs), showing our cluster certificate for mutual auth.
        self._credentials: Any = None
        if tls is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.trust, private_key=tls.unencrypted_key(), certificate_chain=tls.cert_chain)
        self.port_offset = port_offset
        self.identity = identity
        self.max_message = max_message
        self._stubs: dict[str, Any] = {}
        self._channels: dict[str, Any] = {}
        self._closing: set[asyncio.Task[None]] = set()
        #: Peers whose last call failed unavailable or timed out → the reason logged.
        self._unreachable: dict[str, str] = {}

    def _stub(self, target: str) -> Any:
        stub = self._stubs.get(target)
        if stub is None:
            ip, _, port = target.rpartition(":")
            address = f"{ip}:{int(port) + self.port_offset}"
            options = [("grpc.max_receive_message_length", self.max_message),
                       ("grpc.max_send_message_length", self.max_message),
                       ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
                       ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS)]
            channel = (grpc.aio.insecure_channel(address, options=options) if self._credentials is None
                       else grpc.aio.secure_channel(address, self._credentials, options=options))
            stub = channel.unary_unary("/Request/request", request_serializer=Payload.SerializeToString,
                                       response_deserializer=Payload.FromString)
            self._channels[target] = channel
            self._stubs[target] = stub
        return stub

    async def call(self, target: str, type_name: str, body: bytes, timeout_ms: int) -> tuple[str, bytes]:
        """Send one request to the peer at ``target`` (its main ip:port) and return its answer."""
        headers = {MEMBER_HEADER: self.self_address, **self.introduction}
        if self.identity is not None:
            identity_key, identity_value = self.identity
            headers[identity_key] = identity_value
        request = Payload(metadata=Metadata(type=type_name, headers=headers), body={"value": body})
        stub = self._stub(target)
        try:
            reply = await stub(request, timeout=timeout_ms / 1000)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            details = exc.details() or ""
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._not_answering(target, f"no answer within {timeout_ms} ms", details)
                raise TimeoutError(f"{type_name} to {target} timed out after {timeout_ms} ms") from None
            if code != grpc.StatusCode.UNAVAILABLE:  # the peer is there; the call itself failed
                raise PeerError(f"{type_name} to {target}: {code.name} {_short(details)}") from None
            refused = "refused" in details.lower()
            reason = "connection refused" if refused else f"unavailable ({_short(details)})"
            self._not_answering(target, reason, details)
            self._replace_channel(target, stub)
            raise PeerUnavailable(f"{type_name} to {target}: {reason}", refused) from None
        if self._unreachable.pop(target, None) is not None:
            log.info("peer %s answers again", target)
        return reply.metadata.type, bytes(reply.body.value)

    def _not_answering(self, target: str, reason: str, details: str) -> None:
        if target in self._unreachable:
            log.debug("peer %s still not answering: %s (%s)", target, reason, details)
            return
        self._unreachable[target] = reason
        log.warning("peer %s is not answering: %s", target, reason)
        log.debug("peer %s: gRPC said %s", target, details)

    def _replace_channel(self, target: str, failed_stub: Any) -> None:
        """Drop the channel of a failed call (once, even if several calls failed on it): the next
        call opens a fresh one. The old one closes in the background, its other calls given
        time to finish."""
        if self._stubs.get(target) is not failed_stub:
            return
        del self._stubs[target]
        channel = self._channels.pop(target)
        task = asyncio.get_running_loop().create_task(channel.close(CHANNEL_CLOSE_GRACE_S))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every channel (in-flight calls fail with PeerUnavailable)."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        closing = list(self._closing)
        for task in closing:
            task.cancel()
        await asyncio.gather(*(c.close() for c in channels), *closing, return_exceptions=True)


def _short(details: str) -> str:
    """gRPC's error text cut to its cause: 'failed to connect to all addresses; last error:
    UNKNOWN: ipv4:...: Connection timed out' → 'Connection timed out'."""
    head, sep, last = details.partition("last error:")
    text = last.rsplit(":", 1)[-1] if sep else head.split(";", 1)[0]
    return text.strip()[:120] or "no detail"
