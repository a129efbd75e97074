"""The naming reads: ServiceInfo for queries, subscriptions and pushes (docs/protocol.md §3.3),
service lists and records, and instances as the Open API shows them.

Every ServiceInfo goes through one function, :meth:`NamingReads.service_info_parts`, over the
service's cached :class:`~shoal.model.services.ServiceView`.
"""

from __future__ import annotations

from typing import Any

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.errors import NotFound
from shoal.model.client import Client, Publication
from shoal.model.clients import ClientManager
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage, parse_clusters
from shoal.service_layer.validation import InstanceValidator, check_port
from shoal.service_layer.views import ServiceDetail, ServiceList


class NamingReads:
    """Queries, service lists and instance lookups over the model (Nacos's ServiceQuery and the
    read half of InstanceOperatorClientImpl / ServiceOperatorV2Impl)."""

    def __init__(self, live: LiveConfig, clock: Clock, clients: ClientManager, services: ServiceManager,
                 index: ServiceIndex, storage: ServiceStorage, validator: InstanceValidator) -> None:
        self.live = live  # ``cacheMillis`` is a switch: read through :attr:`config` each time
        self.clock = clock
        self.clients = clients
        self.services = services
        self.index = index
        self.storage = storage
        self.validator = validator
        self._last_ref_ms = 0

    @property
    def config(self) -> Config:
        """The live settings, read each time (a switch may change them)."""
        return self.live.current

    # --- ServiceInfo ------------------------------------------------------------------------
    def query(self, service: ServiceKey, clusters: str = "", healthy_only: bool = False,
              grouped_name: bool = False) -> str:
        """ServiceInfo JSON for a one-shot read; a missing service answers empty hosts."""
        self.validator.check_params(service, clusters=clusters)
        return self.service_info(service, clusters, healthy_only, grouped_name)

    def query_parts(self, service: ServiceKey, clusters: str = "", healthy_only: bool = False,
                    grouped_name: bool = False) -> tuple[bytes, int, bytes]:
        """:meth:`query` as UTF-8 ``(prefix, lastRefTime, suffix)``: the ServiceInfo is
        ``prefix + str(lastRefTime) + suffix``, for a transport that writes it into a larger answer
        without building it first."""
        self.validator.check_params(service, clusters=clusters)
        return self.service_info_parts(service, clusters, healthy_only, grouped_name)

    def service_info_parts(self, service: ServiceKey, clusters: str, healthy_only: bool,
                           grouped_name: bool = False) -> tuple[bytes, int, bytes]:
        prefix, suffix = self.storage.view(service).service_info(
            clusters, healthy_only, self.services.get(service), self.config.push_cache_millis, grouped_name)
        return prefix, self._ref_time(), suffix

    def service_info(self, service: ServiceKey, clusters: str, healthy_only: bool,
                     grouped_name: bool = False) -> str:
        prefix, ref, suffix = self.service_info_parts(service, clusters, healthy_only, grouped_name)
        return (b"%s%d%s" % (prefix, ref, suffix)).decode()

    def _ref_time(self) -> int:
        """lastRefTime, strictly increasing: SDKs drop a ServiceInfo whose lastRefTime is not
        newer than the one they hold, so two answers built in one millisecond must differ."""
        self._last_ref_ms = max(self.clock.now_ms(), self._last_ref_ms + 1)
        return self._last_ref_ms

    def push_payload(self, service: ServiceKey, clusters: str) -> str:
        """The ServiceInfo a subscriber is pushed (enabled only, protection applied)."""
        return self.service_info(service, clusters, healthy_only=False)

    def selected_hosts(self, service: ServiceKey, clusters: str = "") -> list[str]:
        """The Instance JSON of every host a query of the service answers (enabled only,
        protection applied), each already encoded: for an answer that lists only the hosts."""
        self.validator.check_params(service, clusters=clusters)
        return self.storage.view(service).select(parse_clusters(clusters), False, self.services.get(service)).hosts

    # --- services -----------------------------------------------------------------------------
    def list_services(self, namespace: str, group: str, page_no: int, page_size: int) -> ServiceList:
        """Names of one namespace+group, sorted, paged from 1 (empty services included)."""
        self.validator.check_params(ServiceKey(namespace, group, ""))
        names = self.services.names(namespace, group)
        start = max(page_no - 1, 0) * max(page_size, 0)
        return ServiceList(len(names), names[start:start + max(page_size, 0)])

    def service_count(self) -> int:
        """How many services this node knows (every namespace)."""
        return len(self.services)

    def service_exists(self, service: ServiceKey) -> bool:
        """Whether the service record exists (empty services included)."""
        self.validator.check_params(service)
        return self.services.get(service) is not None

    def service_detail(self, service: ServiceKey) -> ServiceDetail | None:
        """The service record with the sorted clusters of its instances; None if it does not exist."""
        self.validator.check_params(service)
        record = self.services.get(service)
        if record is None:
            return None
        clusters = sorted({inst.cluster for inst in self.storage.view(service).instances})
        return ServiceDetail(service, record.protect_threshold, dict(record.metadata), record.ephemeral, clusters)

    # --- instances ----------------------------------------------------------------------------
    def all_instances(self, namespace: str | None = None,
                      service_name: str | None = None) -> list[tuple[ServiceKey, InstanceInfo]]:
        """Every instance of every service (healthy or not, enabled or not), optionally of one
        namespace and of services with one bare name, sorted by service (PrometheusController)."""
        out: list[tuple[ServiceKey, InstanceInfo]] = []
        for key in sorted(record.key for record in self.services):
            if (namespace is not None and key.namespace != namespace) or (
                    service_name is not None and key.name != service_name):
                continue
            out.extend((key, inst) for inst in self.storage.view(key).instances)
        return out

    def service_instances(self, service: ServiceKey, clusters: str = "",
                          healthy_only: bool = False) -> list[dict[str, Any]]:
        """Every instance of one service as Nacos Instance objects, enabled or not (the admin
        view: no enabled filter and no protection threshold, unlike :meth:`query`)."""
        self.validator.check_params(service, clusters=clusters)
        wanted = parse_clusters(clusters)
        view = self.storage.view(service)
        return [inst.to_nacos(service, view.ephemeral) for inst in view.instances
                if (not wanted or inst.cluster in wanted) and (inst.healthy or not healthy_only)]

    def find_instance(self, service: ServiceKey, ip: str, port: int, cluster: str) -> InstanceInfo:
        """The instance ``ip:port`` of ``cluster`` in the service, whoever published it."""
        check_port(port)
        self.validator.check_params(service, clusters=cluster)
        if self.services.get(service) is None:
            raise NotFound(f"no service {service.grouped_name} found!")
        for inst in self.storage.view(service).instances:  # as read: an operator's edit on it
            if inst.ip == ip and inst.port == port and inst.cluster == cluster:
                return inst
        raise NotFound("no matched ip found!")

    def instance_json(self, service: ServiceKey, ip: str, port: int, cluster: str) -> dict[str, Any]:
        """One instance as a Nacos Instance object; NotFound as :meth:`find_instance`."""
        inst = self.find_instance(service, ip, port, cluster)
        return inst.to_nacos(service, self.storage.view(service).ephemeral)

    def matching(self, service: ServiceKey, ip: str, port: int,
                 cluster: str) -> list[tuple[Client, Publication, InstanceInfo]]:
        """Every publication of ``ip:port`` in ``cluster`` of the service, by client (sorted), as its
        client published it (without an operator's edit)."""
        out: list[tuple[Client, Publication, InstanceInfo]] = []
        for client_id in sorted(self.index.publishers_of(service)):
            client = self.clients.get(client_id)
            publication = client.publications.get(service) if client is not None else None
            if client is None or publication is None:
                continue
            out.extend((client, publication, inst) for inst in publication.instances
                       if inst.ip == ip and inst.port == port and inst.cluster == cluster)
        return out
