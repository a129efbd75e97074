"""N Distro nodes in one process on an in-memory network and one manual clock.

Each node is a real :class:`~shoal.stack.ModelStack` with a real
:class:`~shoal.distro.protocol.DistroProtocol`; only the peer transport is the in-memory
:class:`~shoal.distro.transport.InMemoryNetwork`, and time moves only when told to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.clock import ManualClock
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import Keyspace
from shoal.distro.barrier import waits_for_siblings
from shoal.distro.members import MemberManager
from shoal.distro.protocol import DistroProtocol
from shoal.distro.transport import InMemoryNetwork
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceManager, ServiceStorage
from shoal.service_layer import NamingService
from shoal.stack import ModelStack
from shoal.testing.model import config_with, scratch_store
from shoal.workers.placement import WorkerPlacement

#: The service the helpers register into unless told otherwise.
SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


@dataclass
class SimNode:
    """One simulated node: its model, its member view and its Distro protocol."""

    address: str
    clients: ClientManager
    services: ServiceManager
    storage: ServiceStorage
    naming: NamingService
    members: MemberManager
    distro: DistroProtocol
    bus: EventBus  #: the node's model events (a test may listen, as the history log does)
    #: its CP store, never started unless a test starts it (the workers of one node share its file)
    cp_store: EmbeddedStore

    def connect(self, client_id: str) -> Client:
        """Add a native connection client."""
        client = Client(client_id, ClientKind.CONNECTION, native=True, created_ms=0)
        self.clients.add(client)
        return client

    def register(self, client_id: str, port: int, service: ServiceKey = SVC, **kw: Any) -> None:
        """Register 10.0.0.1:``port`` for ``client_id`` (connecting it first if needed)."""
        if self.clients.get(client_id) is None:
            self.connect(client_id)
        self.naming.ephemeral.register_instance(client_id, service, InstanceInfo("10.0.0.1", port, **kw))

    def ports(self, service: ServiceKey = SVC) -> list[int]:
        """Ports of the instances this node lists for ``service``, sorted."""
        return sorted(i.port for i in self.storage.view(service).instances)


class SimCluster:
    """``size`` loaded nodes 10.9.0.<i>:8848 sharing one ManualClock and one InMemoryNetwork.

    :meth:`of_workers` builds nodes of several workers instead: each worker is a :class:`SimNode`
    (a Distro member ``ip:private_port``) and the node's address is answered by its workers in
    turn, as a node's public cluster port is."""

    def __init__(self, size: int, **overrides: Any) -> None:
        self.clock = ManualClock()
        self.network = InMemoryNetwork()
        self.config = config_with(**overrides)
        self.addresses = [f"10.9.0.{i + 1}:8848" for i in range(size)]
        #: the configured nodes (``--members``); equal to :attr:`addresses` without workers
        self.node_addresses = list(self.addresses)
        self.nodes: dict[str, SimNode] = {}
        self._cp_files: dict[str, Path] = {}  # node address → the CP file its workers share
        for address in self.addresses:
            self.add_node(address, self.addresses, loaded=True)

    @classmethod
    def of_workers(cls, workers: Sequence[int], **overrides: Any) -> SimCluster:
        """Node ``i`` at 10.9.0.<i+1>:8848 runs ``workers[i]`` workers (private ports 9100, 9102,
        ...), or is one process when it is 0. :attr:`addresses` lists every member (process)."""
        cluster = cls(0, **overrides)
        cluster.node_addresses = [f"10.9.0.{i + 1}:8848" for i in range(len(workers))]
        for node, count in zip(cluster.node_addresses, workers, strict=True):
            if count == 0:
                cluster.addresses.append(node)
                cluster.add_node(node, cluster.node_addresses, loaded=True)
                continue
            ports = tuple(9100 + 2 * j for j in range(count))
            names = [f"{node.split(':')[0]}:{p}" for p in ports]
            for index in range(count):
                cluster.addresses.append(names[index])
                cluster.add_node(node, cluster.node_addresses, loaded=True,
                                 placement=WorkerPlacement(index, ports))
            cluster.network.attach_shared(node, names)
        return cluster

    def add_node(self, address: str, member_list: list[str], loaded: bool,
                 placement: WorkerPlacement | None = None) -> SimNode:
        """Build a node at ``address`` that knows ``member_list`` and attach it to the network;
        with a ``placement``, the worker of node ``address`` it places (at ``ip:private_port``), whose
        ephemeral writes wait for its sibling workers as ``app.py`` wires them."""
        node_address = address
        ip, port = address.split(":")
        listed = [(a.split(":")[0], int(a.split(":")[1])) for a in member_list]
        if placement is None:
            members = MemberManager(ip, int(port), self.clock.now_ms, self.config.member_fail_access_cnt)
            members.set_members(listed)
        else:
            members = MemberManager.from_list(listed, int(port), self.clock.now_ms, self_ip=ip,
                                              fail_access_cnt=self.config.member_fail_access_cnt,
                                              placement=placement)
            address = members.self_address
        built: list[DistroProtocol] = []  # the barrier is Distro's, built after the model, as in app.py

        def barrier(client_id: str) -> Awaitable[None] | None:
            wait = built[0].barrier
            return wait(client_id) if wait is not None else None

        def cp_siblings(keyspace: Keyspace, revision: int) -> Awaitable[None] | None:
            wait = built[0].cp_siblings
            return wait(keyspace, revision) if wait is not None else None

        waits = waits_for_siblings(self.config, members)
        store = scratch_store()
        if placement is not None:  # the workers of a node share its file; CP writes wait for their views
            store = EmbeddedStore(self._cp_files.setdefault(node_address, store.path),
                                  siblings=cp_siblings if waits else None)
        model = ModelStack.build(self.config, self.clock, store,  # CP half never started
                                 barrier=barrier if waits else None)
        distro = DistroProtocol(self.config, self.clock, model.bus, model.clients, model.services, members,
                                self.network.transport(address), cp_store=store)
        built.append(distro)
        distro.loaded = loaded
        self.network.attach(address, distro.dispatch)
        node = SimNode(address, model.clients, model.services, model.storage, model.naming, members, distro,
                       model.bus, store)
        self.nodes[address] = node
        return node

    def __getitem__(self, i: int) -> SimNode:
        return self.nodes[self.addresses[i]]

    async def flush(self, rounds: int = 3) -> None:
        """Advance past the sync delay and let every queue send what is due."""
        for _ in range(rounds):
            self.clock.advance(self.config.sync_delay_ms)
            for node in list(self.nodes.values()):
                for target in list(node.distro.engine.queues):
                    while await node.distro.engine.flush(target):
                        pass

    async def report_rounds(self, rounds: int = 2) -> None:
        """Every node reports to its peers ``rounds`` times (members learn each other's workers)."""
        for _ in range(rounds):
            for node in list(self.nodes.values()):
                await node.distro.report_round()

    def calls(self, type_name: str) -> list[tuple[str, str, str, int]]:
        """The network calls of request type ``type_name``: (sender, target, type, size)."""
        return [c for c in self.network.calls if c[2] == type_name]
