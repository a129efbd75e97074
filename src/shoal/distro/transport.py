"""The network seam between Distro peers: one request/response call.

The gRPC implementation (cluster port = main port + 1001) lives in
:mod:`shoal.transport.grpc.peer_client` and is wired by app.py; the in-memory twin here serves
the cluster tests. Distro code only ever sees the :class:`PeerTransport` Protocol.

Bodies are bytes: sync batches and snapshot pages travel as the syncser binary format inside
``Payload.body.value`` (no JSON or Base64 wrapping between our own nodes); verify and member
reports are small JSON documents.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger(__name__)

#: The request header a peer names itself (its main ip:port) with.
MEMBER_HEADER = "shoal-member"
#: A worker's requests also name its node (``ip:port``) and the node's workers (private ports,
#: comma-separated), as its member report does: a peer that has not had the report yet admits it
#: from any request (docs/protocol.md §6.2).
NODE_HEADER = "shoal-node"
WORKERS_HEADER = "shoal-workers"

#: A cluster request handler: (sender address, body) → (response type, response body).
ClusterHandler = Callable[[str, bytes], Awaitable[tuple[str, bytes]]]


class PeerUnavailable(Exception):
    """The peer could not be reached (refused, unreachable, shutting down)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class PeerError(Exception):
    """The peer answered with an error."""


class PeerTransport(Protocol):
    """One request/response exchange with a peer, named by its main ``ip:port``.

    Raises :class:`PeerUnavailable` when the peer cannot be reached, :class:`PeerError` when
    it answered with an error and ``TimeoutError`` when no answer came within ``timeout_ms``.
    """

    async def call(self, target: str, type_name: str, body: bytes, timeout_ms: int) -> tuple[str, bytes]:
        """Send one request to the peer at ``target`` (its main ip:port) and return its answer."""

    async def close(self) -> None: ...


class InMemoryNetwork:
    """Wires in-process nodes together; links can be cut to model partitions and dead peers."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[[str, str, bytes], Awaitable[tuple[str, bytes]]]] = {}
        self.cut: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self.calls: list[tuple[str, str, str, int]] = []  # (source, target, type, body bytes)

    def attach(self, address: str, dispatch: Callable[[str, str, bytes], Awaitable[tuple[str, bytes]]]) -> None:
        self.handlers[address] = dispatch

    def attach_shared(self, address: str, members: list[str]) -> None:
        """``address`` answered by one of ``members`` in turn (a node's public cluster port, which
        every worker serves): a call to it reaches the next member that is not down."""
        turn = 0

        async def dispatch(source: str, type_name: str, body: bytes) -> tuple[str, bytes]:
            nonlocal turn
            live = [m for m in members if m not in self.down and m in self.handlers]
            if not live:
                raise PeerUnavailable(f"{address}: no worker answers", refused=True)
            target = live[turn % len(live)]
            turn += 1
            if (source, target) in self.cut:
                raise TimeoutError(f"{address} unreachable (partitioned)")
            return await self.handlers[target](source, type_name, body)

        self.handlers[address] = dispatch

    def partition(self, a: str, b: str) -> None:
        """Cut the link between ``a`` and ``b`` both ways (calls time out)."""
        self.cut |= {(a, b), (b, a)}

    def heal(self) -> None:
        self.cut.clear()

    def transport(self, source: str) -> InMemoryTransport:
        """The PeerTransport of the node at ``source``."""
        return InMemoryTransport(self, source)


class InMemoryTransport:
    """A PeerTransport over an :class:`InMemoryNetwork`, as seen from the node at ``source``."""

    def __init__(self, network: InMemoryNetwork, source: str) -> None:
        self.network = network
        self.source = source

    async def call(self, target: str, type_name: str, body: bytes, timeout_ms: int) -> tuple[str, bytes]:
        net = self.network
        net.calls.append((self.source, target, type_name, len(body)))
        handler = net.handlers.get(target)
        if handler is None or target in net.down or self.source in net.down:
            raise PeerUnavailable(f"{target} is down", refused=True)
        if (self.source, target) in net.cut:
            raise TimeoutError(f"{target} unreachable (partitioned)")
        return await handler(self.source, type_name, body)

    async def close(self) -> None:
        return None
