"""The one place that wires the registry: event bus, clients, services, index, storage, the CP
store's views of persistent instances, service documents and operators' instance edits, and the
naming use cases over them.

The node (:mod:`shoal.app`), the unit-test fixtures and the in-memory Distro cluster
(:mod:`shoal.testing`) all build it here, so a new component of the model is added once.
Whoever builds it owns the CP store's lifecycle and starts and stops the three views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.cp.store import CpStore, CpView, Keyspace, json_view
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.overlays import InstanceOverlays
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.service_layer import NamingService
from shoal.service_layer.barrier import WriteBarrier


@dataclass
class ModelStack:
    """The registry's model, the CP views, and the naming use cases on top, sharing one bus and
    one clock."""

    config: Config
    clock: Clock
    bus: EventBus
    clients: ClientManager
    services: ServiceManager
    index: ServiceIndex
    storage: ServiceStorage
    cp_store: CpStore
    instance_view: CpView[Any]  # Keyspace.INSTANCES: persistent instances
    service_view: CpView[Any]  # Keyspace.SERVICES: service documents
    naming: NamingService
    live: LiveConfig
    overlays: InstanceOverlays  # operators' edits of ephemeral instances, laid over their publications
    edit_view: CpView[Any]  # Keyspace.INSTANCE_EDITS: those edits in the CP store

    @classmethod
    def build(cls, config: Config, clock: Clock, cp_store: CpStore, live: LiveConfig | None = None,
              barrier: WriteBarrier | None = None) -> Self:
        """Wire a fresh, empty model for ``config`` reading time from ``clock``, its CP half on
        ``cp_store`` (its views not started yet), and the live settings from ``live`` (the node's
        one :class:`LiveConfig`; a fixed one by default). ``barrier``: what an answered ephemeral
        write waits for (a worker's sibling workers; None: nothing)."""
        live = live if live is not None else LiveConfig(config)
        bus = EventBus()
        clients = ClientManager(bus)
        services = ServiceManager(bus)
        index = ServiceIndex(bus, clock.now_ms)
        overlays = InstanceOverlays(bus)
        storage = ServiceStorage(bus, index, clients.clients, services, overlays)
        instance_view = json_view(cp_store, Keyspace.INSTANCES)
        service_view = json_view(cp_store, Keyspace.SERVICES)
        edit_view = json_view(cp_store, Keyspace.INSTANCE_EDITS)
        naming = NamingService(live, clock, bus, clients, services, index, storage, instance_view, service_view,
                               overlays, edit_view, barrier)
        return cls(config, clock, bus, clients, services, index, storage, cp_store, instance_view, service_view,
                   naming, live, overlays, edit_view)

    @property
    def views(self) -> tuple[CpView[Any], ...]:
        """The model's CP views: persistent instances, service documents, instance edits."""
        return (self.instance_view, self.service_view, self.edit_view)

    def start_views(self) -> None:
        """Start filling the CP views (the store must be started)."""
        for view in self.views:
            view.start()

    async def wait_views_ready(self) -> None:
        for view in self.views:
            await view.wait_ready()

    async def stop_views(self) -> None:
        for view in self.views:
            await view.stop()
