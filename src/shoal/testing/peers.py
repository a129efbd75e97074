"""A real cluster port in the test's own process, for the peer clients (``GrpcPeerTransport``,
``NativePeerTransport``) to call over loopback: the node's :class:`ClusterServer` on either server
transport, in front of a dispatch function the test (or bench) gives instead of a DistroProtocol.

``ClusterPort(dispatch, transport="native").start()`` binds ``127.0.0.1``: peers name it by
:attr:`ClusterPort.address` (its main ip:port; the cluster port is that plus
``nacos.server.grpc.cluster.port.offset``, :data:`CLUSTER_OFFSET`). :meth:`stop` and a later
:meth:`start` on the same object model a peer that restarts on the same port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from shoal.config import Config
from shoal.metrics import Metrics
from shoal.testing.procs import free_port_block
from shoal.tls import NodeTls, PortTls
from shoal.transport.grpc.cluster_server import ClusterServer

#: (sender address, request type, body) → (response type, body), as DistroProtocol.dispatch
Dispatch = Callable[[str, str, bytes], Awaitable[tuple[str, bytes]]]

CLUSTER_OFFSET = 1001
HOST = "127.0.0.1"


class ClusterPort:
    """One cluster port served by this process on ``transport`` (``native`` or ``grpcio``)."""

    def __init__(self, dispatch: Dispatch, transport: str = "native", **settings: Any) -> None:
        self.dispatch = dispatch
        self.main_port = free_port_block((0, CLUSTER_OFFSET))
        self.config = Config(host=HOST, port=self.main_port, remote_transport=transport, **settings)
        self.tls: PortTls | None = NodeTls.load(self.config).peer
        self.server: ClusterServer | None = None

    @property
    def address(self) -> str:
        """The main ip:port peers name this node by."""
        return f"{HOST}:{self.main_port}"

    async def start(self) -> ClusterPort:
        dispatch = self.dispatch  # the sender's introduction (a worker's node and workers) is not passed on
        self.server = ClusterServer(self.config, lambda sender, kind, body, _introduced: dispatch(sender, kind, body),
                                    Metrics(), tls=self.tls)
        await self.server.start()
        return self

    async def stop(self, grace_s: float = 0.5) -> None:
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None
