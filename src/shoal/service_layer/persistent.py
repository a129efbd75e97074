"""Persistent instances and cluster-wide service metadata on the CP store (docs/architecture.md §3.5).

Nacos keeps both in JRaft (``PersistentClientOperationServiceImpl``, ``ServiceMetadata`` /
``ClusterMetadata`` in ``NamingMetadataManager``); Shoal keeps them in the CP store
(:mod:`shoal.cp`) under :attr:`Keyspace.INSTANCES` and :attr:`Keyspace.SERVICES`.

There is **one path into the model: the views' watch**. A write here only goes to the store;
every node (the writer's own included) applies it when its view delivers the change:

* every persistent instance of a service is published by one synthetic client per service,
  ``persistent@@<namespace>@@<group>@@<service>`` (:data:`ClientKind.PERSISTENT`, native on every
  node, never replicated by Distro since every node builds it from its own view), whose batch
  publication is rebuilt from the view on each change. So queries, service lists, pushes and
  exports see persistent instances exactly like ephemeral ones, and a health flip written by
  the checker is pushed by the ordinary ``ServiceChanged`` path;
* a service document sets the service record's kind, protection threshold, metadata, selector
  and its clusters' health-checker settings on every node.

Rules (Nacos): a service is ephemeral or persistent; registering the other kind is an
INVALID_PARAM (400) naming the service. A service created through the service API is
persistent unless v2 says ``ephemeral=true``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoal.clock import Clock
from shoal.cp.store import MAX_TXN_OPS, CpView
from shoal.errors import Conflict, InvalidParam, NotFound, ServiceAlreadyExists, ServiceNotEmpty, UnknownService
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus, ServiceChanged
from shoal.model.instance import InstanceInfo
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager
from shoal.service_layer.ephemeral import with_instance_id
from shoal.service_layer.validation import InstanceValidator

log = logging.getLogger(__name__)

PERSISTENT_CLIENT_PREFIX = "persistent@@"

#: Nacos's cluster defaults (``ClusterMetadata``): TCP checker, port 80, the instance's port.
DEFAULT_HEALTH_CHECKER: dict[str, Any] = {"type": "TCP"}
DEFAULT_CHECK_PORT = 80

#: A service document holding only this key (true) marks a service being deleted: every node
#: drops the service when it sees the marker; the deleting node removes the marker at once.
DELETED = "deleted"

#: The most instances one persistent batch may hold: it is one CP store txn, and etcd takes at
#: most ``--max-txn-ops`` (128 by default) writes in one. A larger batch is refused whole (400).
MAX_BATCH = MAX_TXN_OPS
#: How often a persistent batch whose compares failed is worked out again before a 409.
BATCH_ATTEMPTS = 5


def _check_batch_size(count: int, what: str = "instances") -> None:
    if count > MAX_BATCH:
        raise InvalidParam(f"a persistent batch holds at most {MAX_BATCH} instances (one CP store transaction); "
                           f"got {count} {what}: split it into several requests")


def persistent_client_id(service: ServiceKey) -> str:
    """The id of the synthetic client that publishes a service's persistent instances."""
    return f"{PERSISTENT_CLIENT_PREFIX}{service.namespace}@@{service.group}@@{service.name}"


def service_name(service: ServiceKey) -> str:
    """The name of a service's document in Keyspace.SERVICES: ``<namespace>/<group>@@<service>``."""
    return f"{service.namespace}/{service.grouped_name}"


def instance_name(service: ServiceKey, cluster: str, ip: str, port: int) -> str:
    """The name of a persistent instance in Keyspace.INSTANCES."""
    return f"{service_name(service)}/{cluster}/{ip}:{port}"


def instance_doc(service: ServiceKey, inst: InstanceInfo) -> dict[str, Any]:
    """The stored JSON document of a persistent instance."""
    return {"namespace": service.namespace, "group": service.group, "service": service.name,
            "ip": inst.ip, "port": inst.port, "weight": float(inst.weight), "healthy": inst.healthy,
            "enabled": inst.enabled, "cluster": inst.cluster, "instanceId": inst.instance_id,
            "metadata": dict(inst.metadata)}


def doc_service(doc: Mapping[str, Any]) -> ServiceKey:
    return ServiceKey(str(doc["namespace"]), str(doc["group"]), str(doc["service"]))


def doc_instance(doc: Mapping[str, Any]) -> InstanceInfo:
    return InstanceInfo(str(doc["ip"]), int(doc["port"]), float(doc.get("weight", 1.0)), bool(doc.get("healthy", True)),
                        bool(doc.get("enabled", True)), str(doc.get("cluster") or DEFAULT_CLUSTER),
                        str(doc.get("instanceId") or ""),
                        {str(k): str(v) for k, v in dict(doc.get("metadata") or {}).items()})


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """One cluster's health-check settings (Nacos ``ClusterMetadata``)."""

    health_checker: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_HEALTH_CHECKER))
    check_port: int = DEFAULT_CHECK_PORT
    use_instance_port: bool = True
    metadata: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> ClusterSettings:
        if not doc:
            return cls()
        checker = doc.get("healthChecker")
        return cls(dict(checker) if isinstance(checker, dict) and checker.get("type") else dict(DEFAULT_HEALTH_CHECKER),
                   int(doc.get("checkPort", DEFAULT_CHECK_PORT)), bool(doc.get("useInstancePort4Check", True)),
                   {str(k): str(v) for k, v in dict(doc.get("metadata") or {}).items()})

    def to_doc(self) -> dict[str, Any]:
        return {"healthChecker": dict(self.health_checker), "checkPort": self.check_port,
                "useInstancePort4Check": self.use_instance_port, "metadata": dict(self.metadata)}


class PersistentNaming:
    """The CP use cases (persistent instances, service metadata) and the feed of their views
    into the model. Mirrors PersistentClientOperationServiceImpl and ServiceOperatorV2Impl."""

    def __init__(self, clock: Clock, bus: EventBus, clients: ClientManager, services: ServiceManager,
                 index: ServiceIndex, validator: InstanceValidator, instances: CpView[Any],
                 service_docs: CpView[Any]) -> None:
        self.clock = clock
        self.bus = bus
        self.clients = clients
        self.services = services
        self.index = index
        self.validator = validator
        self.instances = instances
        self.service_docs = service_docs
        # service → {instance name → instance}, mirrored from the INSTANCES view
        self._by_service: dict[ServiceKey, dict[str, InstanceInfo]] = {}
        # services deleted cluster-wide that this node still saw instances of (see _drop_record)
        self._deleted: set[ServiceKey] = set()
        instances.subscribe(self._on_instance)
        service_docs.subscribe(self._on_service)
        self.bus.subscribe(ServiceChanged, self._on_service_changed)

    # --- reads ------------------------------------------------------------------------------
    def persistent_instances(self, service: ServiceKey) -> Mapping[str, InstanceInfo]:
        """The persistent instances of a service by their store name (from the local view; live,
        not a copy: iterate it without awaiting in between)."""
        return self._by_service.get(service, {})

    def persistent_services(self) -> list[ServiceKey]:
        return list(self._by_service)

    def cluster_settings(self, service: ServiceKey, cluster: str) -> ClusterSettings:
        doc = self.service_doc(service)
        clusters = doc.get("clusters") if doc is not None else None
        return ClusterSettings.from_doc(clusters.get(cluster) if isinstance(clusters, dict) else None)

    def service_doc(self, service: ServiceKey) -> dict[str, Any] | None:
        """The service's document, or None (also while a deletion marker stands in for it)."""
        doc = self.service_docs.get(service_name(service))
        return dict(doc) if isinstance(doc, dict) and not doc.get(DELETED) else None

    # --- persistent instances ---------------------------------------------------------------
    def _check_kind(self, service: ServiceKey) -> None:
        record = self.services.get(service)
        doc = self.service_doc(service)
        if record is not None:
            ephemeral = record.ephemeral
        elif doc is not None:
            ephemeral = bool(doc.get("ephemeral"))
        else:
            return  # a new service: the first persistent instance makes it persistent
        if ephemeral:
            raise InvalidParam(f"Current service {service.grouped_name} is ephemeral service, "
                               "can't register persistent instance.")

    def check_register(self, service: ServiceKey, inst: InstanceInfo) -> None:
        """Every rule a persistent registration must meet (raises before any write)."""
        self._validated(service, inst, legal=True)
        self._check_kind(service)

    def check_deregister(self, service: ServiceKey, cluster: str) -> None:
        """The rules a persistent deregistration must meet (raises before any write)."""
        self.validator.check_params(service, clusters=cluster)

    def holds(self, service: ServiceKey, ip: str, port: int, cluster: str) -> bool:
        """Whether the store holds the persistent instance ``ip:port`` of ``cluster`` (this node's view)."""
        return self.instances.get(instance_name(service, cluster or DEFAULT_CLUSTER, ip, port)) is not None

    async def register(self, service: ServiceKey, inst: InstanceInfo) -> None:
        """Register (or replace) one persistent instance."""
        self.check_register(service, inst)
        full = with_instance_id(service, inst)
        name, doc = instance_name(service, full.cluster, full.ip, full.port), instance_doc(service, full)
        if self.instances.get(name) == doc:  # as stored (as this node sees it): no write, so no push anywhere
            return
        await self.instances.put(name, doc)

    def check_batch_register(self, service: ServiceKey, instances: Sequence[InstanceInfo]) -> None:
        """Every rule a persistent batch must meet: at most :data:`MAX_BATCH` instances, and each
        instance's rules as a single registration."""
        _check_batch_size(len(instances))
        for inst in instances:
            self._validated(service, inst, legal=True)
        self._check_kind(service)

    async def batch_register(self, service: ServiceKey, instances: Sequence[InstanceInfo]) -> None:
        """Shoal's persistent batch (``PersistentInstanceRequest`` type ``batchRegisterInstance``,
        docs/protocol.md §3.5): register or replace each instance, every one checked as a single
        registration before anything is written, all or nothing: one store txn whose compares
        hold each instance's key at the mod revision it was read at, and whose puts are the
        instances whose stored document would change. When a compare fails (another writer got
        there first, or this node's view lags), nothing was written; the batch is worked out
        again from the keys as the store reported them, up to :data:`BATCH_ATTEMPTS` times."""
        self.check_batch_register(service, instances)
        docs: dict[str, dict[str, Any]] = {}
        for inst in instances:
            full = with_instance_id(service, inst)
            docs[instance_name(service, full.cluster, full.ip, full.port)] = instance_doc(service, full)
        known: Mapping[str, tuple[int, Any]] = {
            name: (self.instances.mod_revision(name), self.instances.get(name)) for name in docs}
        for _ in range(BATCH_ATTEMPTS):
            writes = {name: doc for name, doc in docs.items() if known[name][1] != doc}
            if not writes:
                return
            outcome = await self.instances.transact({name: mod for name, (mod, _) in known.items()}, writes)
            if outcome.succeeded:
                return
            known = outcome.current
        raise Conflict(f"persistent batch of {service.grouped_name}: its instances changed under it "
                       f"{BATCH_ATTEMPTS} times in a row; nothing was written, retry")

    async def batch_deregister(self, service: ServiceKey, instances: Sequence[InstanceInfo]) -> None:
        """Shoal's persistent batch removal (type ``batchDeregisterInstance``): every ``ip:port``
        listed goes, whatever its cluster, as :meth:`deregister` does; unknown ones are no-ops.
        All or nothing: one store txn of deletes."""
        _check_batch_size(len(instances))
        for inst in instances:
            self.validator.check_params(service, clusters=inst.cluster)
        wanted = {(inst.ip, inst.port) for inst in instances}
        names = [name for name, inst in self._by_service.get(service, {}).items() if (inst.ip, inst.port) in wanted]
        if not names:
            return
        _check_batch_size(len(names), "stored instances to remove")
        await self.instances.transact({}, dict.fromkeys(names))

    async def deregister(self, service: ServiceKey, ip: str, port: int, cluster: str = DEFAULT_CLUSTER) -> None:
        """Remove the persistent instance ``ip:port`` of the service, whatever its cluster (Nacos
        removes the ``ip:port#false`` client's publication; the cluster is not compared); an
        unknown one is a successful no-op."""
        self.check_deregister(service, cluster)
        names = [name for name, inst in self._by_service.get(service, {}).items()
                 if inst.ip == ip and inst.port == port]
        for name in names or [instance_name(service, cluster or DEFAULT_CLUSTER, ip, port)]:
            await self.instances.delete(name)

    async def update(self, service: ServiceKey, ip: str, port: int, cluster: str, *, weight: float | None,
                     enabled: bool | None, metadata: Mapping[str, str] | None, healthy: bool | None = None,
                     remove_keys: Collection[str] = ()) -> None:
        """PUT/PATCH a persistent instance: weight, enabled, metadata (merged), health."""
        self.validator.check_params(service, clusters=cluster)
        name = instance_name(service, cluster, ip, port)
        doc = self.instances.get(name)
        if doc is None:
            if self.services.get(service) is None and self.service_doc(service) is None:
                raise InvalidParam(f"service not found, namespace: {service.namespace}, "
                                   f"service: {service.grouped_name}")
            raise NotFound("no matched ip found!")
        inst = doc_instance(doc)
        updated = InstanceInfo(inst.ip, inst.port, inst.weight if weight is None else weight,
                               inst.healthy if healthy is None else healthy,
                               inst.enabled if enabled is None else enabled, inst.cluster, inst.instance_id,
                               {k: v for k, v in ({**inst.metadata, **metadata} if metadata else inst.metadata).items()
                                if k not in remove_keys})
        self.validator.check_values(updated)
        self.validator.check_params(instances=(updated,))
        if updated != inst:
            await self.instances.compare_and_put(name, instance_doc(service, updated),
                                                 self.instances.mod_revision(name))

    async def set_health(self, name: str, healthy: bool) -> bool:
        """The health checker's write: flip one instance's health if nobody changed it since
        it was read (a CAS on its mod revision). True when written."""
        doc = self.instances.get(name)
        if doc is None or bool(doc.get("healthy", True)) == healthy:
            return False
        return await self.instances.compare_and_put(name, {**doc, "healthy": healthy},
                                                    self.instances.mod_revision(name))

    def _validated(self, service: ServiceKey, inst: InstanceInfo, legal: bool) -> None:
        self.validator.check_values(inst)
        self.validator.check_params(service, instances=(inst,))
        if legal:
            self.validator.check_instance_legal(inst)

    # --- services (ServiceOperatorV2Impl on the store) ---------------------------------------
    async def create_service(self, service: ServiceKey, protect_threshold: float, metadata: Mapping[str, str],
                             ephemeral: bool, selector: Mapping[str, Any] | None = None) -> None:
        self.validator.check_params(service)
        if self.services.get(service) is not None or self.service_doc(service) is not None:
            raise ServiceAlreadyExists(f"specified service already exists, serviceName : {service.grouped_name}")
        doc = {"namespace": service.namespace, "group": service.group, "service": service.name,
               "ephemeral": ephemeral, "protectThreshold": protect_threshold, "metadata": dict(metadata),
               "selector": dict(selector or {"type": "none"}), "clusters": {}}
        if not await self.service_docs.create(service_name(service), doc):
            raise ServiceAlreadyExists(f"specified service already exists, serviceName : {service.grouped_name}")

    async def update_service(self, service: ServiceKey, protect_threshold: float | None,
                             metadata: Mapping[str, str] | None, selector: Mapping[str, Any] | None = None) -> None:
        self.validator.check_params(service)
        record = self.services.get(service)
        name = service_name(service)
        doc = self.service_doc(service)
        if doc is None:
            if record is None:
                raise UnknownService(f"service not found, namespace: {service.namespace}, "
                                     f"service: {service.grouped_name}")
            doc = {"namespace": service.namespace, "group": service.group, "service": service.name,
                   "ephemeral": record.ephemeral, "protectThreshold": record.protect_threshold,
                   "metadata": dict(record.metadata), "selector": {"type": "none"}, "clusters": {}}
        if protect_threshold is not None:
            doc["protectThreshold"] = protect_threshold
        if metadata is not None:
            doc["metadata"] = dict(metadata)
        if selector is not None:
            doc["selector"] = dict(selector)
        if doc == self.service_docs.get(name):  # an edit that changes nothing writes nothing
            return
        await self.service_docs.compare_and_put(name, doc, self.service_docs.mod_revision(name))

    async def update_cluster(self, service: ServiceKey, cluster: str, settings: ClusterSettings) -> None:
        """PUT /v1/ns/cluster: one cluster's health checker, check port and metadata."""
        self.validator.check_params(service, clusters=cluster)
        record = self.services.get(service)
        doc = self.service_doc(service)
        if doc is None:
            if record is None:
                raise UnknownService(f"service not found:{service.grouped_name}")
            doc = {"namespace": service.namespace, "group": service.group, "service": service.name,
                   "ephemeral": record.ephemeral, "protectThreshold": record.protect_threshold,
                   "metadata": dict(record.metadata), "selector": {"type": "none"}, "clusters": {},
                   "implicit": True}
        clusters = dict(doc.get("clusters") or {})
        clusters[cluster] = settings.to_doc()
        doc["clusters"] = clusters
        name = service_name(service)
        await self.service_docs.compare_and_put(name, doc, self.service_docs.mod_revision(name))

    async def delete_service(self, service: ServiceKey) -> None:
        """Delete a service on every node (ServiceOperatorV2Impl.delete, whose metadata delete goes
        through Raft and removes the service everywhere). A service with a document loses it; one
        without (made by registrations) gets a deletion marker written and then removed, so every
        node's watch drops its record too. A service with instances is a 400 (v2: 21009)."""
        self.validator.check_params(service)
        if self.services.get(service) is None and self.service_doc(service) is None:
            raise UnknownService(f"service {service.grouped_name} is not exist!")
        if self.index.publishers_of(service) or self._by_service.get(service):
            raise ServiceNotEmpty(f"Service {service.grouped_name} is not empty, can't be delete. "
                                  "Please unregister instance first")
        name = service_name(service)
        if self.service_doc(service) is None:
            await self.service_docs.put(name, {"namespace": service.namespace, "group": service.group,
                                               "service": service.name, DELETED: True})
        await self.service_docs.delete(name)
        self._drop_record(service)  # also when the view lags behind the store

    def _drop_record(self, service: ServiceKey) -> None:
        """A deleted service leaves this node's model. If this node still sees instances of it
        (the deleting node saw none: this node's instance view or Distro copy lags behind, or
        instances arrived since), it loses its metadata flag and goes once its last publisher
        does (:meth:`_on_service_changed`)."""
        record = self.services.get(service)
        if record is None:
            self._deleted.discard(service)
        elif self.index.publishers_of(service):
            self.services.update(service, self.clock.now_ms(), has_metadata=False)
            self._deleted.add(service)
        else:
            self.services.remove(service)
            self._deleted.discard(service)

    def _on_service_changed(self, event: ServiceChanged) -> None:
        if self._deleted and event.service in self._deleted and not self.index.publishers_of(event.service):
            self._drop_record(event.service)

    # --- the feed: views → model (every node, the writer's own included) ---------------------
    def _on_instance(self, name: str, old: Any, new: Any) -> None:
        doc = new if new is not None else old
        try:
            service = doc_service(doc)
        except (KeyError, TypeError, ValueError):
            log.error("persistent instance %s: malformed document ignored", name)
            return
        current = self._by_service.setdefault(service, {})
        if new is None:
            current.pop(name, None)
        else:
            try:
                current[name] = doc_instance(new)
            except (KeyError, TypeError, ValueError):
                log.error("persistent instance %s: malformed document ignored", name)
                return
        if not current:
            del self._by_service[service]
        self._sync_client(service)

    def _sync_client(self, service: ServiceKey) -> None:
        client_id = persistent_client_id(service)
        client = self.clients.get(client_id)
        instances = tuple(inst for _, inst in sorted(self._by_service.get(service, {}).items()))
        now_mono = self.clock.monotonic_ms()
        if not instances:
            if client is not None:
                self.clients.remove(client_id, "persistent instances removed")
            return
        self.services.get_or_create(service, self.clock.now_ms(), ephemeral=False)
        self.services.update(service, self.clock.now_ms(), ephemeral=False)
        if client is None:
            client = Client(client_id, ClientKind.PERSISTENT, native=True, created_ms=self.clock.now_ms(),
                            last_updated_ms=now_mono, last_renew_ms=now_mono)
            self.clients.add(client)
        self.clients.replace(client, {service: Publication(instances, batch=True)}, now_mono)

    def _on_service(self, name: str, old: Any, new: Any) -> None:
        doc = new if new is not None else old
        try:
            service = doc_service(doc)
        except (KeyError, TypeError, ValueError):
            log.error("service document %s: malformed, ignored", name)
            return
        now = self.clock.now_ms()
        if new is None or new.get(DELETED):
            self._drop_record(service)
            self.bus.publish(ServiceChanged(service, now))
            return
        self._deleted.discard(service)
        self.services.get_or_create(service, now, ephemeral=bool(new.get("ephemeral", False)))
        if not self.index.publishers_of(service):  # a service with instances keeps the kind they gave it
            self.services.update(service, now, ephemeral=bool(new.get("ephemeral", False)))
        if not new.get("implicit"):
            self.services.update(service, now, has_metadata=True)
        try:
            self.services.update(service, now, protect_threshold=float(new.get("protectThreshold", 0.0)))
        except (TypeError, ValueError):
            self.services.update(service, now, protect_threshold=0.0)
        self.services.update(service, now,
                             metadata={str(k): str(v) for k, v in dict(new.get("metadata") or {}).items()})
        self.bus.publish(ServiceChanged(service, now))
