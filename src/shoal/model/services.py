"""Services, the client↔service indexes and the materialised per-service instance view.

Mirrors three Nacos singletons: ServiceManager (which services exist, their metadata),
ClientServiceIndexesManager (service → publisher/subscriber client ids, fed by events) and
ServiceStorage (the deduplicated instances of a service, rebuilt after a change). Unlike Nacos,
whose cache is refreshed by the delayed push task (~0.5 s stale reads), the view here is
dropped synchronously on ServiceChanged and rebuilt on the next read, so a read right after a
write sees it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.model.client import Client, ClientKind
from shoal.model.events import (
    ClientDeregisteredService,
    ClientRegisteredService,
    ClientReleased,
    ClientSubscribedService,
    ClientUnsubscribedService,
    EventBus,
    ServiceChanged,
)
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.overlays import InstanceOverlays


@dataclass(slots=True)
class ServiceRecord:
    """A service singleton. ``has_metadata`` is true once created/updated through the service
    API; only then does the protection threshold apply (docs/protocol.md §3.9; a selector is
    checked by the service API but neither kept nor applied)."""

    key: ServiceKey
    created_ms: int
    last_change_ms: int
    ephemeral: bool = True
    protect_threshold: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)
    has_metadata: bool = False


class ServiceManager:
    """Which services exist, by namespace and group, with stable (sorted) listing order — and
    the only writer of a service record's fields (:meth:`update`), which publishes the change."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._services: dict[ServiceKey, ServiceRecord] = {}
        self._by_group: dict[tuple[str, str], dict[str, ServiceRecord]] = {}
        self._sorted: dict[tuple[str, str], list[str]] = {}

    def __len__(self) -> int:
        return len(self._services)

    def __iter__(self) -> Any:
        return iter(self._services.values())

    def get(self, key: ServiceKey) -> ServiceRecord | None:
        return self._services.get(key)

    def get_or_create(self, key: ServiceKey, now_ms: int, ephemeral: bool = True) -> ServiceRecord:
        record = self._services.get(key)
        if record is None:
            record = ServiceRecord(key, created_ms=now_ms, last_change_ms=now_ms, ephemeral=ephemeral)
            self._services[key] = record
            self._by_group.setdefault((key.namespace, key.group), {})[key.name] = record
            self._sorted.pop((key.namespace, key.group), None)
        return record

    def update(self, key: ServiceKey, wall_ms: int, *, ephemeral: bool | None = None,
               protect_threshold: float | None = None, metadata: Mapping[str, str] | None = None,
               has_metadata: bool | None = None) -> bool:
        """Set the given fields of the service's record (None: left as is); False when the
        record is missing or nothing changed.

        Publishes ServiceChanged (views drop, subscribers are pushed: the kind, threshold and
        metadata shape what a reader gets) once per call that changed anything.
        """
        record = self._services.get(key)
        if record is None:
            return False
        changed = False
        if ephemeral is not None and record.ephemeral != ephemeral:
            record.ephemeral = ephemeral
            changed = True
        if protect_threshold is not None and record.protect_threshold != protect_threshold:
            record.protect_threshold = protect_threshold
            changed = True
        if metadata is not None and record.metadata != metadata:
            record.metadata = dict(metadata)
            changed = True
        if has_metadata is not None and record.has_metadata != has_metadata:
            record.has_metadata = has_metadata
            changed = True
        if changed:
            self._bus.publish(ServiceChanged(key, wall_ms))
        return changed

    def remove(self, key: ServiceKey) -> ServiceRecord | None:
        record = self._services.pop(key, None)
        if record is not None:
            group = self._by_group.get((key.namespace, key.group))
            if group is not None:
                group.pop(key.name, None)
                if not group:
                    del self._by_group[(key.namespace, key.group)]
            self._sorted.pop((key.namespace, key.group), None)
        return record

    def names(self, namespace: str, group: str) -> list[str]:
        """Service names of one namespace+group, sorted (so paging is stable)."""
        gk = (namespace, group)
        names = self._sorted.get(gk)
        if names is None:
            names = sorted(self._by_group.get(gk, {}))
            self._sorted[gk] = names
        return names

    def namespaces(self) -> set[str]:
        return {ns for ns, _ in self._by_group}


class ServiceIndex:
    """service → publisher / subscriber client ids, maintained from events."""

    def __init__(self, bus: EventBus, now_ms: Callable[[], int]) -> None:
        self._bus = bus
        self._now_ms = now_ms
        self.publishers: dict[ServiceKey, set[str]] = {}
        self.subscribers: dict[ServiceKey, set[str]] = {}
        bus.subscribe(ClientRegisteredService, self._on_register)
        bus.subscribe(ClientDeregisteredService, self._on_deregister)
        bus.subscribe(ClientSubscribedService, self._on_subscribe)
        bus.subscribe(ClientUnsubscribedService, self._on_unsubscribe)
        bus.subscribe(ClientReleased, self._on_release)

    def publishers_of(self, service: ServiceKey) -> set[str]:
        return self.publishers.get(service, set())

    def subscribers_of(self, service: ServiceKey) -> set[str]:
        return self.subscribers.get(service, set())

    def _on_register(self, event: ClientRegisteredService) -> None:
        self.publishers.setdefault(event.service, set()).add(event.client_id)
        self._bus.publish(ServiceChanged(event.service, self._now_ms()))

    def _on_deregister(self, event: ClientDeregisteredService) -> None:
        self._discard(self.publishers, event.service, event.client_id)
        self._bus.publish(ServiceChanged(event.service, self._now_ms()))

    def _on_subscribe(self, event: ClientSubscribedService) -> None:
        self.subscribers.setdefault(event.service, set()).add(event.client_id)

    def _on_unsubscribe(self, event: ClientUnsubscribedService) -> None:
        self._discard(self.subscribers, event.service, event.client_id)

    def _on_release(self, event: ClientReleased) -> None:
        client = event.client
        for service in client.publications:
            self._discard(self.publishers, service, client.client_id)
            self._bus.publish(ServiceChanged(service, self._now_ms()))
        for service in client.subscriptions:
            self._discard(self.subscribers, service, client.client_id)

    @staticmethod
    def _discard(index: dict[ServiceKey, set[str]], service: ServiceKey, client_id: str) -> None:
        ids = index.get(service)
        if ids is not None:
            ids.discard(client_id)
            if not ids:
                del index[service]


@dataclass(frozen=True, slots=True)
class Selection:
    """Hosts chosen for one reader, as pre-encoded Instance JSON strings."""

    hosts: list[str]
    reach_protection_threshold: bool


class ServiceView:
    """The deduplicated instances of one service, each with its Instance JSON pre-encoded so a
    query or push only filters and joins strings."""

    __slots__ = ("_flipped", "_infos", "ephemeral", "instances", "json", "key")

    #: Distinct readers (clusters, healthy-only, name form, protection) whose ServiceInfo is kept.
    MAX_CACHED_INFOS = 32

    def __init__(self, key: ServiceKey, instances: list[InstanceInfo], ephemeral: bool,
                 previous: ServiceView | None = None) -> None:
        self.key = key
        self.ephemeral = ephemeral
        self.instances = instances
        if previous is not None and previous.ephemeral == ephemeral and previous.key == key:
            # After a change most instances are the ones the previous view already encoded
            # (InstanceInfo is immutable and equal instances encode alike): reuse their JSON.
            known: dict[InstanceInfo, str] = dict(zip(previous.instances, previous.json, strict=True))
            self.json: list[str] = [known.get(inst) or inst.to_json(key, ephemeral) for inst in instances]
        else:
            self.json = [inst.to_json(key, ephemeral) for inst in instances]
        self._flipped: dict[int, str] = {}
        self._infos: dict[tuple[str, bool, bool, bool, float, int], tuple[bytes, bytes]] = {}

    def service_info(self, clusters: str, healthy_only: bool, record: ServiceRecord | None, cache_millis: int,
                     grouped_name: bool = False) -> tuple[bytes, bytes]:
        """The ServiceInfo of one reader as :func:`service_info_parts` in UTF-8, selected and encoded
        once per view: the view is dropped on ServiceChanged, and the service record's protection
        settings are part of the key, so a cached answer is always what :meth:`select` would give now.
        Bytes, because the gRPC answer is written from them without another copy."""
        threshold = record.protect_threshold if record is not None and record.has_metadata else None
        key = (clusters, healthy_only, grouped_name, threshold is not None, threshold or 0.0, cache_millis)
        parts = self._infos.get(key)
        if parts is None:
            selection = self.select(parse_clusters(clusters), healthy_only, record)
            prefix, suffix = service_info_parts(self.key, clusters, selection, cache_millis, grouped_name)
            parts = (prefix.encode(), suffix.encode())
            if len(self._infos) >= self.MAX_CACHED_INFOS:
                self._infos.clear()
            self._infos[key] = parts
        return parts

    def select(
        self,
        clusters: frozenset[str],
        healthy_only: bool,
        record: ServiceRecord | None,
    ) -> Selection:
        """Nacos ServiceUtil.selectInstancesWithHealthyProtection for one reader (docs/protocol.md §3.9):
        cluster filter (empty = all), enabled only, healthy-only, then — only for services with
        metadata — the protection threshold, which returns the kept hosts with unhealthy ones
        shown healthy when ``healthy/total <= threshold``."""
        kept: list[int] = []
        healthy_candidates = 0
        for i, inst in enumerate(self.instances):
            if clusters and inst.cluster not in clusters:
                continue
            if not inst.enabled:
                continue
            if inst.healthy:
                healthy_candidates += 1
            elif healthy_only:
                continue
            kept.append(i)
        if record is None or not record.has_metadata or not kept:
            return Selection([self.json[i] for i in kept], False)
        threshold = max(record.protect_threshold, 0.0)
        if healthy_candidates / len(kept) > threshold:
            return Selection([self.json[i] for i in kept], False)
        return Selection([self._healthy_json(i) for i in kept], True)

    def _healthy_json(self, i: int) -> str:
        inst = self.instances[i]
        if inst.healthy:
            return self.json[i]
        cached = self._flipped.get(i)
        if cached is None:
            cached = self._flipped[i] = inst.with_health(True).to_json(self.key, self.ephemeral)
        return cached


class ServiceStorage:
    """service → ServiceView, rebuilt on read after a ServiceChanged dropped it.

    A view shows each ephemeral instance with the operator's edit of it laid over
    (:mod:`shoal.model.overlays`); a persistent instance is shown as stored (its edits are in
    its own document)."""

    def __init__(self, bus: EventBus, index: ServiceIndex, clients: Mapping[str, Client],
                 services: ServiceManager, overlays: InstanceOverlays | None = None) -> None:
        self._index = index
        self._clients = clients
        self._services = services
        self._overlays = overlays if overlays is not None else InstanceOverlays(bus)
        self._views: dict[ServiceKey, ServiceView] = {}
        # Views dropped by a change and not rebuilt yet: the next build reuses their encoded instances.
        self._stale: dict[ServiceKey, ServiceView] = {}
        bus.subscribe(ServiceChanged, self._on_change)

    def view(self, service: ServiceKey) -> ServiceView:
        view = self._views.get(service)
        if view is None:
            view = self._build(service, self._stale.pop(service, None))
            self._views[service] = view
        return view

    def instance_count(self) -> int:
        return sum(c.instance_count() for c in self._clients.values())

    def _on_change(self, event: ServiceChanged) -> None:
        dropped = self._views.pop(event.service, None)
        if dropped is not None and dropped.instances and self._index.publishers_of(event.service):
            self._stale[event.service] = dropped
        elif not self._index.publishers_of(event.service):
            self._stale.pop(event.service, None)  # nobody left to publish: nothing to reuse, nothing kept
        record = self._services.get(event.service)
        if record is not None:
            record.last_change_ms = event.changed_at_ms

    def _build(self, service: ServiceKey, previous: ServiceView | None = None) -> ServiceView:
        seen: set[InstanceInfo] = set()
        instances: list[InstanceInfo] = []
        edits = self._overlays.of(service)
        for client_id in sorted(self._index.publishers_of(service)):
            client = self._clients.get(client_id)
            publication = client.publications.get(service) if client is not None else None
            if publication is None:
                continue
            edited = edits is not None and client is not None and client.kind is not ClientKind.PERSISTENT
            for inst in publication.instances:
                if edited:
                    inst = self._overlays.apply(service, inst)
                if inst not in seen:
                    seen.add(inst)
                    instances.append(inst)
        record = self._services.get(service)
        return ServiceView(service, instances, record.ephemeral if record is not None else True, previous)


def service_info_parts(
    service: ServiceKey,
    clusters: str,
    selection: Selection,
    cache_millis: int,
    grouped_name: bool = False,
) -> tuple[str, str]:
    """ServiceInfo JSON around its ``lastRefTime`` value: ``prefix + str(ms) + suffix`` is
    :func:`service_info_json`. Everything but the time is fixed for one view and reader."""
    prefix = (f'{{"name":{_json_str(service.grouped_name if grouped_name else service.name)},'
              f'"groupName":{_json_str(service.group)},"clusters":{_json_str(clusters)},'
              f'"cacheMillis":{int(cache_millis)},"lastRefTime":')
    reach = "true" if selection.reach_protection_threshold else "false"
    suffix = (f',"checksum":"","allIPs":false,"allIps":false,"reachProtectionThreshold":{reach},"valid":true,'
              f'"hosts":[{",".join(selection.hosts)}]}}')
    return prefix, suffix


def service_info_json(
    service: ServiceKey,
    clusters: str,
    selection: Selection,
    now_ms: int,
    cache_millis: int,
    grouped_name: bool = False,
) -> str:
    """ServiceInfo JSON (docs/protocol.md §3.3). ``name`` is bare for gRPC and ``group@@name`` for HTTP;
    both ``allIPs`` (2.x) and ``allIps`` (3.x) are emitted; lastRefTime is always fresh."""
    prefix, suffix = service_info_parts(service, clusters, selection, cache_millis, grouped_name)
    return f"{prefix}{int(now_ms)}{suffix}"


_json_str = json.JSONEncoder(ensure_ascii=False).encode


def parse_clusters(clusters: str | None) -> frozenset[str]:
    return frozenset(c.strip() for c in clusters.split(",") if c.strip()) if clusters else frozenset()


def merge_instances(*groups: Iterable[InstanceInfo]) -> list[InstanceInfo]:
    out: list[InstanceInfo] = []
    seen: set[InstanceInfo] = set()
    for group in groups:
        for inst in group:
            if inst not in seen:
                seen.add(inst)
                out.append(inst)
    return out
