"""The naming use cases of one node, by concern, over one model.

Each concern is a class of its own module; :class:`NamingService` only builds them once over the
model (:meth:`shoal.stack.ModelStack.build`) and holds the state they share (the validator, the
beat table, the clients moved by rebalancing). The transports call the two façades, which alone
choose between the AP and the CP path, and the reads:

========================  ============================================  =====================
attribute                 concern                                        module
========================  ============================================  =====================
``instance_ops``          instance writes of either kind (the façade)   ``instances.py``
``service_ops``           service CRUD and description (the façade)     ``services.py``
``ephemeral``             connection clients' ephemeral instances       ``ephemeral.py``
``ip_port``               ip:port clients: registrations, beats         ``ip_port.py``
``persistent``            persistent instances, service documents (CP)  ``persistent.py``
``edits``                 operators' edits of ephemeral instances (CP)  ``overlays.py``
``reads``                 ServiceInfo, service lists, instance lookups  ``reads.py``
``subscriptions``         subscribe / unsubscribe                       ``subscriptions.py``
``connections``           the naming clients of SDK connections         ``connections.py``
``introspection``         client details, operator metrics              ``introspection.py``
``catalog``               the console's reads                           ``catalog.py``
``cleaner``               empty-service housekeeping                    ``housekeeping.py``
========================  ============================================  =====================
"""

from __future__ import annotations

from typing import Any

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.cp.store import CpView
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.ip_port import BeatTable
from shoal.model.overlays import InstanceOverlays
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.service_layer.barrier import WriteBarrier
from shoal.service_layer.catalog import CatalogService
from shoal.service_layer.connections import ConnectionClients
from shoal.service_layer.ephemeral import EphemeralInstances
from shoal.service_layer.housekeeping import EmptyServiceCleaner
from shoal.service_layer.instances import InstanceOperations
from shoal.service_layer.introspection import Introspection
from shoal.service_layer.ip_port import IpPortInstances
from shoal.service_layer.moved import MovedClients
from shoal.service_layer.overlays import InstanceEdits
from shoal.service_layer.persistent import PersistentNaming
from shoal.service_layer.reads import NamingReads
from shoal.service_layer.services import ServiceOperations
from shoal.service_layer.subscriptions import Subscriptions
from shoal.service_layer.validation import InstanceValidator


class NamingService:
    """The naming use cases over the in-memory model and the CP store's views."""

    def __init__(self, live: LiveConfig, clock: Clock, bus: EventBus, clients: ClientManager,
                 services: ServiceManager, index: ServiceIndex, storage: ServiceStorage,
                 instance_view: CpView[Any], service_view: CpView[Any], overlays: InstanceOverlays,
                 edit_view: CpView[Any], barrier: WriteBarrier | None = None) -> None:
        self.live = live  # the switches' settings, read by reference (cacheMillis, beat interval, ...)
        config = live.current
        self.validator = InstanceValidator(config)
        self.beats = BeatTable(bus, clients, clock.monotonic_ms, clock.now_ms)
        #: Clients moved by rebalancing, kept listed for a grace period (beyond Nacos).
        self.moved = MovedClients(config, clients, index, clock.monotonic_ms)
        self.reads = NamingReads(live, clock, clients, services, index, storage, self.validator)
        self.ephemeral = EphemeralInstances(clock, clients, services, self.validator)
        self.ip_port = IpPortInstances(live, clock, clients, services, self.validator, self.ephemeral, self.reads,
                                       self.beats)
        self.persistent = PersistentNaming(clock, bus, clients, services, index, self.validator, instance_view,
                                           service_view)
        self.edits = InstanceEdits(live, clock, services, self.validator, self.reads, overlays, edit_view)
        self.subscriptions = Subscriptions(clock, clients, self.validator, self.ephemeral, self.reads)
        self.connections = ConnectionClients(clock, clients, self.moved)
        self.introspection = Introspection(clients, services, index, storage)
        self.catalog = CatalogService(clients, services, index, storage, self.validator, overlays)
        self.cleaner = EmptyServiceCleaner(live, clock, services, index)
        self.instance_ops = InstanceOperations(self.ephemeral, self.ip_port, self.reads, self.persistent,
                                               self.edits, barrier)
        self.service_ops = ServiceOperations(self.reads, self.persistent)

    @property
    def config(self) -> Config:
        """The live settings (the switches' effective Config), as they are now."""
        return self.live.current
