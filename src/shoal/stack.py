"""The one place that wires the in-memory registry: event bus, clients, services, index, storage
and the naming service over them.

The node (:mod:`shoal.app`), the unit-test fixtures and the in-memory Distro cluster
(:mod:`shoal.testing`) all build it here, so a new component of the model is added once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.service_layer import NamingService


@dataclass
class ModelStack:
    """The registry's model and the naming service on top of it, sharing one bus and one clock."""

    config: Config
    clock: Clock
    bus: EventBus
    clients: ClientManager
    services: ServiceManager
    index: ServiceIndex
    storage: ServiceStorage
    naming: NamingService
    live: LiveConfig

    @classmethod
    def build(cls, config: Config, clock: Clock, live: LiveConfig | None = None) -> Self:
        """Wire a fresh, empty model for ``config`` reading time from ``clock`` (and the live
        settings from ``live``, the node's one :class:`LiveConfig`; a fixed one by default)."""
        live = live if live is not None else LiveConfig(config)
        bus = EventBus()
        clients = ClientManager(bus)
        services = ServiceManager(bus)
        index = ServiceIndex(bus, clock.now_ms)
        storage = ServiceStorage(bus, index, clients.clients, services)
        naming = NamingService(live, clock, bus, clients, services, index, storage)
        return cls(config, clock, bus, clients, services, index, storage, naming, live)
