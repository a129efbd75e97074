"""Console reads: the catalog of services with their counts, one service's instances and
subscribers, the publishers of a service, and service-name search.

Mirrors Nacos's CatalogServiceV2Impl (``pageListService``, ``pageListServiceDetail``,
``listInstances``, ``getServiceDetail``), SubscribeManager.getSubscribers and
ServiceOperatorV2Impl.searchServiceName. The transports (``transport/http/console_api.py``)
only parse parameters and shape these plain values; every read goes through the same
``ServiceStorage`` view as queries and pushes, so the console sees what the SDKs see.

Paging is server-side: a page of the service list filters and sorts names (cheap), and builds
instance counts only for the page's services, unless a filter needs counts of every service
(``hasIpCount``, unhealthy only); views are cached by ``ServiceStorage`` until a change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from shoal.errors import InvalidParam, NotFound
from shoal.model.client import Subscriber
from shoal.model.clients import ClientManager
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey, normalise_namespace
from shoal.model.overlays import InstanceOverlays
from shoal.model.services import ServiceIndex, ServiceManager, ServiceRecord, ServiceStorage
from shoal.service_layer.validation import InstanceValidator

#: The largest page a console read hands out (Nacos pages the console at 10..100).
MAX_PAGE_SIZE = 1000

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ServiceSummary:
    """One row of the service list (Nacos ServiceView), with its subscriber count."""

    service: ServiceKey
    cluster_count: int
    ip_count: int
    healthy_count: int
    enabled_count: int
    subscriber_count: int
    #: Nacos's ServiceView.triggerFlag: healthy / ipCount ≤ the service's protection threshold
    #: (CatalogServiceV2Impl.isProtectThreshold; a service without instances is never triggered).
    threshold_triggered: bool = False


@dataclass(frozen=True, slots=True)
class CatalogPage:
    """One page of the service list and how many services matched in all."""

    count: int
    services: list[ServiceSummary]


@dataclass(frozen=True, slots=True)
class ServiceInstances:
    """One service's instances (deduplicated, all of them: disabled and unhealthy included)."""

    service: ServiceKey
    ephemeral: bool
    instances: list[InstanceInfo]


@dataclass(frozen=True, slots=True)
class PushLag:
    """How late a subscriber's connection acks its pushes (filled by the push engine).

    ``last_ms`` / ``p99_ms``: change → ack time of its last ack and the p99 of its recent acks
    (``acks`` of them; None: none yet); ``pending``: services with a change it has not acked;
    ``pending_for_ms``: how long this service's unacked change has waited (0: none)."""

    last_ms: int | None
    p99_ms: int | None
    acks: int
    pending: int
    pending_for_ms: int


class PushFigures(Protocol):
    """What the push engine tells readers (it sits above the service layer; the transports
    get it from the composition root)."""

    def lag_of(self, client_id: str, service: ServiceKey) -> PushLag | None: ...

    def protected_services(self) -> list[ServiceKey]: ...

    def lag_summary(self, slowest: int = 5) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class SubscriberRow:
    """A subscriber of a service and the client holding the subscription, with its push lag."""

    client_id: str
    subscriber: Subscriber
    push: PushLag | None = None


@dataclass(frozen=True, slots=True)
class PublisherRow:
    """An instance of a service and the client publishing it (ClientInfoControllerV2)."""

    client_id: str
    instance: InstanceInfo
    owner: str  # "" when this node holds the client; else the node that replicated it here


def check_page(page_no: int, page_size: int) -> None:
    """Pages count from 1 and hold 1..MAX_PAGE_SIZE items; anything else is a 400."""
    if page_no < 1:
        raise InvalidParam(f"Param 'pageNo' must be 1 or more, got {page_no}.")
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise InvalidParam(f"Param 'pageSize' must be between 1 and {MAX_PAGE_SIZE}, got {page_size}.")


def page_slice(items: list[_T], page_no: int, page_size: int) -> list[_T]:
    """Items of page ``page_no`` (from 1); past the end: empty."""
    start = (page_no - 1) * page_size
    return items[start:start + page_size]


class CatalogService:
    """The console's read use cases over the naming model (Nacos CatalogServiceV2Impl)."""

    def __init__(self, clients: ClientManager, services: ServiceManager, index: ServiceIndex,
                 storage: ServiceStorage, validator: InstanceValidator, overlays: InstanceOverlays) -> None:
        self.clients = clients
        self.services = services
        self.index = index
        self.storage = storage
        self.validator = validator
        self.overlays = overlays  # a service with operators' edits is counted from its view (edits on)

    # --- the service list --------------------------------------------------------------
    def _records(self, namespace: str, name_part: str, group_part: str) -> list[ServiceRecord]:
        """Services of a namespace whose name and group contain the given parts (case-insensitive,
        as the Nacos console's fuzzy search), sorted by group then name."""
        ns = normalise_namespace(namespace)
        name_part, group_part = name_part.lower(), group_part.lower()
        records = [r for r in self.services if r.key.namespace == ns
                   and (not name_part or name_part in r.key.name.lower())
                   and (not group_part or group_part in r.key.group.lower())]
        records.sort(key=lambda r: (r.key.group, r.key.name))
        return records

    def summary(self, service: ServiceKey) -> ServiceSummary:
        """Counts of one service from its publishers' instances (deduplicated as the view is) and
        the subscriber index: no Instance JSON is built, so counting every service stays cheap."""
        instances = self._distinct_instances(service)
        clusters = {i.cluster for i in instances}
        healthy = sum(1 for i in instances if i.healthy and i.enabled)
        enabled = sum(1 for i in instances if i.enabled)
        subscribers = len(self.index.subscribers_of(service))
        record = self.services.get(service)
        threshold = record.protect_threshold if record is not None else 0.0
        triggered = bool(instances) and healthy / len(instances) <= threshold
        return ServiceSummary(service, len(clusters), len(instances), healthy, enabled, subscribers, triggered)

    def _distinct_instances(self, service: ServiceKey) -> list[InstanceInfo] | set[InstanceInfo]:
        if self.overlays.of(service) is not None:
            return self.storage.view(service).instances
        clients = self.clients
        publishers = self.index.publishers_of(service)
        if len(publishers) == 1:
            client = clients.get(next(iter(publishers)))
            publication = client.publications.get(service) if client is not None else None
            return list(publication.instances) if publication is not None else []
        seen: set[InstanceInfo] = set()
        for client_id in publishers:
            client = clients.get(client_id)
            publication = client.publications.get(service) if client is not None else None
            if publication is not None:
                seen.update(publication.instances)
        return seen

    def _health_by_service(self, namespace: str) -> tuple[set[ServiceKey], set[ServiceKey]]:
        """One pass over the clients' publications: the namespace's services that have an
        instance, and those that have one unhealthy or disabled (what the filters need, with
        no per-service index lookups)."""
        populated: set[ServiceKey] = set()
        unhealthy: set[ServiceKey] = set()
        for client in self.clients:
            for key, publication in client.publications.items():
                if key.namespace != namespace or not publication.instances:
                    continue
                populated.add(key)
                for inst in publication.instances:
                    if not (inst.healthy and inst.enabled):
                        unhealthy.add(key)
                        break
        for key in populated - unhealthy:  # an operator may have disabled one
            if self.overlays.of(key) is not None and not all(i.enabled for i in self.storage.view(key).instances):
                unhealthy.add(key)
        return populated, unhealthy

    def list_services(self, namespace: str, name_part: str = "", group_part: str = "", page_no: int = 1,
                      page_size: int = 10, has_ip_count: bool = False, unhealthy_only: bool = False) -> CatalogPage:
        """One page of a namespace's services with their counts (CatalogController.listDetail).

        ``has_ip_count`` keeps services with at least one instance; ``unhealthy_only`` keeps
        services with at least one instance that is not healthy (or is disabled)."""
        check_page(page_no, page_size)
        records = self._records(namespace, name_part, group_part)
        if not has_ip_count and not unhealthy_only:
            page = page_slice(records, page_no, page_size)
            return CatalogPage(len(records), [self.summary(r.key) for r in page])
        populated, unhealthy = self._health_by_service(normalise_namespace(namespace))
        wanted = unhealthy if unhealthy_only else populated
        kept = [r for r in records if r.key in wanted]
        return CatalogPage(len(kept), [self.summary(r.key) for r in page_slice(kept, page_no, page_size)])

    def list_service_details(self, namespace: str, name_part: str = "", group_part: str = "", page_no: int = 1,
                             page_size: int = 10) -> tuple[int, list[tuple[ServiceRecord, ServiceInstances]]]:
        """``withInstances=true``: a page of services, each with its record and instances."""
        check_page(page_no, page_size)
        records = self._records(namespace, name_part, group_part)
        page = page_slice(records, page_no, page_size)
        return len(records), [(r, self._instances(r)) for r in page]

    # --- one service ---------------------------------------------------------------------
    def _record(self, service: ServiceKey) -> ServiceRecord:
        self.validator.check_params(service)
        record = self.services.get(service)
        if record is None:
            raise NotFound(f"service {service.grouped_name} is not found!")
        return record

    def _instances(self, record: ServiceRecord) -> ServiceInstances:
        view = self.storage.view(record.key)
        return ServiceInstances(record.key, record.ephemeral, list(view.instances))

    def instances(self, service: ServiceKey, cluster: str = "") -> ServiceInstances:
        """Every instance of the service (of one cluster when given); 404 if it does not exist."""
        found = self._instances(self._record(service))
        if not cluster:
            return found
        return ServiceInstances(found.service, found.ephemeral, [i for i in found.instances if i.cluster == cluster])

    def service(self, service: ServiceKey) -> tuple[ServiceRecord, list[str]]:
        """The service record and the sorted clusters of its instances; 404 if it does not exist."""
        record = self._record(service)
        clusters = sorted({i.cluster for i in self.storage.view(service).instances})
        return record, clusters

    def subscribers(self, service: ServiceKey, push: PushFigures | None = None) -> list[SubscriberRow]:
        """Who subscribes to the service on this node, sorted by address (unknown service: none);
        with ``push`` (the push engine), each with its push lag."""
        self.validator.check_params(service)
        rows: list[SubscriberRow] = []
        for client_id in self.index.subscribers_of(service):
            client = self.clients.get(client_id)
            sub = client.subscriptions.get(service) if client is not None else None
            if sub is not None:
                lag = push.lag_of(client_id, service) if push is not None else None
                rows.append(SubscriberRow(client_id, sub, lag))
        rows.sort(key=lambda r: (r.subscriber.ip, r.client_id))
        return rows

    def publishers(self, service: ServiceKey) -> list[PublisherRow]:
        """Every instance of the service with the client that publishes it (sorted by client)."""
        self.validator.check_params(service)
        rows: list[PublisherRow] = []
        for client_id in sorted(self.index.publishers_of(service)):
            client = self.clients.get(client_id)
            publication = client.publications.get(service) if client is not None else None
            if client is None or publication is None:
                continue
            rows.extend(PublisherRow(client_id, inst, client.owner) for inst in publication.instances)
        return rows

    # --- search --------------------------------------------------------------------------
    def search_names(self, namespace: str, expr: str) -> dict[str, list[str]]:
        """``group@@name`` of services containing ``expr``, by namespace: one namespace when
        given, else every namespace that has services (ServiceController.searchService)."""
        wanted = normalise_namespace(namespace) if namespace else None
        out: dict[str, list[str]] = {}
        for record in self.services:
            key = record.key
            if wanted is not None and key.namespace != wanted:
                continue
            grouped = key.grouped_name
            if not expr or expr in grouped:
                out.setdefault(key.namespace, []).append(grouped)
        if wanted is not None:
            out.setdefault(wanted, [])
        for names in out.values():
            names.sort()
        return out
