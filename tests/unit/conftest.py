"""In-process fixtures: the model stack on a ManualClock, with in-memory push and probe twins."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from shoal.clock import ManualClock
from shoal.config import Config
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.service_layer import NamingService


@dataclass
class Registry:
    config: Config
    clock: ManualClock
    bus: EventBus
    clients: ClientManager
    services: ServiceManager
    index: ServiceIndex
    storage: ServiceStorage
    naming: NamingService
    events: list[Any] = field(default_factory=list)

    def connect(self, client_id: str, ip: str = "10.0.0.1") -> Client:
        client = Client(client_id, ClientKind.CONNECTION, native=True, created_ms=self.clock.now_ms(), client_ip=ip)
        self.clients.add(client)
        return client


def make_registry(**overrides: Any) -> Registry:
    config = dataclasses.replace(Config(), **overrides).validate()
    clock = ManualClock()
    bus = EventBus()
    clients = ClientManager(bus)
    services = ServiceManager()
    index = ServiceIndex(bus, clock.now_ms)
    storage = ServiceStorage(bus, index, clients.clients, services)
    naming = NamingService(config, clock, bus, clients, services, index, storage)
    return Registry(config, clock, bus, clients, services, index, storage, naming)


@pytest.fixture
def registry() -> Registry:
    return make_registry()
