"""N Distro nodes in one process on an in-memory network and one manual clock."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from shoal.clock import ManualClock
from shoal.config import Config
from shoal.distro.members import MemberManager
from shoal.distro.protocol import DistroProtocol
from shoal.distro.transport import InMemoryNetwork
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.service_layer import NamingService

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


@dataclass
class SimNode:
    address: str
    clients: ClientManager
    services: ServiceManager
    storage: ServiceStorage
    naming: NamingService
    members: MemberManager
    distro: DistroProtocol

    def connect(self, client_id: str) -> Client:
        client = Client(client_id, ClientKind.CONNECTION, native=True, created_ms=0)
        self.clients.add(client)
        return client

    def register(self, client_id: str, port: int, service: ServiceKey = SVC, **kw: Any) -> None:
        if self.clients.get(client_id) is None:
            self.connect(client_id)
        self.naming.register_instance(client_id, service, InstanceInfo("10.0.0.1", port, **kw))

    def ports(self, service: ServiceKey = SVC) -> list[int]:
        return sorted(i.port for i in self.storage.view(service).instances)


class SimCluster:
    def __init__(self, size: int, **overrides: Any) -> None:
        self.clock = ManualClock()
        self.network = InMemoryNetwork()
        self.config = dataclasses.replace(Config(), **overrides).validate()
        self.addresses = [f"10.9.0.{i + 1}:8848" for i in range(size)]
        self.nodes: dict[str, SimNode] = {}
        for address in self.addresses:
            self.add_node(address, self.addresses, loaded=True)

    def add_node(self, address: str, member_list: list[str], loaded: bool) -> SimNode:
        bus = EventBus()
        clients = ClientManager(bus)
        services = ServiceManager()
        index = ServiceIndex(bus, self.clock.now_ms)
        storage = ServiceStorage(bus, index, clients.clients, services)
        naming = NamingService(self.config, self.clock, bus, clients, services, index, storage)
        ip, port = address.split(":")
        members = MemberManager(ip, int(port), self.clock.now_ms, self.config.member_fail_access_cnt)
        members.set_members([(a.split(":")[0], int(a.split(":")[1])) for a in member_list])
        distro = DistroProtocol(self.config, self.clock, bus, clients, services, members,
                                self.network.transport(address))
        distro.loaded = loaded
        self.network.attach(address, distro.dispatch)
        node = SimNode(address, clients, services, storage, naming, members, distro)
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

    def calls(self, type_name: str) -> list[tuple[str, str, str, int]]:
        return [c for c in self.network.calls if c[2] == type_name]
