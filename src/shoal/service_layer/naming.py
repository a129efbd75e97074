"""Transport-neutral naming use cases: register, deregister, batch, query, subscribe, list,
the naming clients of SDK connections, and the Open API reads (service detail, clients,
operator metrics).

Both transports (gRPC SDK and HTTP Open API) parse their wire format into these calls and
shape the answers; all validation (:mod:`shoal.service_layer.validation`) and every error
(:mod:`shoal.errors`) comes from here so the two cannot drift apart.
Mirrors EphemeralClientOperationServiceImpl + the request handlers' checks (docs/protocol.md §3.4–§3.7).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from shoal.clock import Clock
from shoal.config import Config
from shoal.errors import (
    BeatCode,
    ClientDisconnected,
    InvalidParam,
    NotFound,
    ServiceAlreadyExists,
    ServiceNotEmpty,
    UnknownService,
)
from shoal.model.client import Client, ClientKind, Publication, Subscriber
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus, ServiceChanged
from shoal.model.instance import HEART_BEAT_INTERVAL_KEY, InstanceInfo, generate_instance_id, metadata_millis
from shoal.model.ip_port import BeatTable, ip_port_client_id, responsible_tag
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage, parse_clusters
from shoal.service_layer.moved import MovedClients
from shoal.service_layer.validation import PERSISTENT_UNSUPPORTED, InstanceValidator, check_port
from shoal.service_layer.views import ClientDetail, OperatorMetrics, ServiceDetail, ServiceList, load_and_mem
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

# Beat answer codes (NamingResponseCode).
BEAT_OK, BEAT_RESOURCE_NOT_FOUND = BeatCode.OK, BeatCode.RESOURCE_NOT_FOUND


class NamingService:
    """The naming use cases over the in-memory model."""

    def __init__(self, config: Config, clock: Clock, bus: EventBus, clients: ClientManager,
                 services: ServiceManager, index: ServiceIndex, storage: ServiceStorage) -> None:
        self.config = config
        self.clock = clock
        self.bus = bus
        self.clients = clients
        self.services = services
        self.index = index
        self.storage = storage
        self._last_ref_ms = 0
        self.beats = BeatTable(bus, clients, clock.monotonic_ms, clock.now_ms)
        self.validator = InstanceValidator(config)
        #: Clients moved by rebalancing, kept listed for a grace period (beyond Nacos).
        self.moved = MovedClients(config, clients, index, clock.monotonic_ms)

    # --- validation (the one rule set: service_layer.validation) ------------------------
    def check_params(self, service: ServiceKey | None = None, clusters: str | None = None,
                     instances: Sequence[InstanceInfo] = ()) -> None:
        """Nacos's parameter checker (docs/protocol.md §3.7); raises ParamCheckFailed (answered 500/400)."""
        self.validator.check_params(service, clusters, instances)

    @staticmethod
    def check_instance_legal(inst: InstanceInfo) -> None:
        """NamingUtils.checkInstanceIsLegal (single registration only): answered 400/400."""
        InstanceValidator.check_instance_legal(inst)

    @staticmethod
    def check_values(inst: InstanceInfo) -> None:
        """Values no Nacos client sends but a hand-made request might: refuse them cleanly."""
        InstanceValidator.check_values(inst)

    # --- writes -------------------------------------------------------------------------
    def register_instance(self, client_id: str, service: ServiceKey, inst: InstanceInfo) -> None:
        self.check_values(inst)
        self.check_params(service, instances=(inst,))
        self.check_instance_legal(inst)
        self._publish(client_id, service, Publication((self._with_id(service, inst),)))

    def batch_register_instances(self, client_id: str, service: ServiceKey,
                                 instances: Sequence[InstanceInfo]) -> None:
        """Replace this client's whole instance set for the service (batch deregister is a
        batch register of the instances to keep; an empty batch removes the publication)."""
        for inst in instances:
            self.check_values(inst)
        self.check_params(service, instances=instances)
        if not instances:
            self.deregister_instance(client_id, service)
            return
        unique = tuple(dict.fromkeys(self._with_id(service, inst) for inst in instances))
        self._publish(client_id, service, Publication(unique, batch=True))

    def deregister_instance(self, client_id: str, service: ServiceKey) -> None:
        """Remove this client's publication for the service (ip/port are not compared, as in
        Nacos); unknown services and clients are a successful no-op."""
        self.check_params(service)
        if self.services.get(service) is None:
            return
        client = self.clients.get(client_id)
        if client is None:
            return
        self.clients.unpublish(client, service, self.clock.monotonic_ms())

    def _publish(self, client_id: str, service: ServiceKey, publication: Publication) -> None:
        record = self.services.get(service)
        if record is not None and not record.ephemeral:
            raise InvalidParam(
                f"Current service {service.grouped_name} is persistent service, can't register ephemeral instance."
            )
        client = self._require_client(client_id)
        if client.publications.get(service) == publication:
            return  # a redo after reconnect, or a repeated call: nothing changed
        self.services.get_or_create(service, self.clock.now_ms())
        self.clients.publish(client, service, publication, self.clock.monotonic_ms())

    def _require_client(self, client_id: str) -> Client:
        client = self.clients.get(client_id)
        if client is None:
            raise ClientDisconnected(
                f"Client [{client_id}] connection already disconnect, can't register ephemeral instance."
            )
        return client

    @staticmethod
    def _with_id(service: ServiceKey, inst: InstanceInfo) -> InstanceInfo:
        cluster = inst.cluster or DEFAULT_CLUSTER
        instance_id = inst.instance_id or generate_instance_id(inst.ip, inst.port, cluster, service.grouped_name)
        if cluster == inst.cluster and instance_id == inst.instance_id:
            return inst
        return InstanceInfo(inst.ip, inst.port, inst.weight, inst.healthy, inst.enabled, cluster,
                            instance_id, inst.metadata)

    # --- reads --------------------------------------------------------------------------
    def query(self, service: ServiceKey, clusters: str = "", healthy_only: bool = False,
              grouped_name: bool = False) -> str:
        """ServiceInfo JSON for a one-shot read; a missing service answers empty hosts."""
        self.check_params(service, clusters=clusters)
        return self._service_info(service, clusters, healthy_only, grouped_name)

    def query_parts(self, service: ServiceKey, clusters: str = "", healthy_only: bool = False,
                    grouped_name: bool = False) -> tuple[bytes, int, bytes]:
        """:meth:`query` as UTF-8 ``(prefix, lastRefTime, suffix)``: the ServiceInfo is
        ``prefix + str(lastRefTime) + suffix``, for a transport that writes it into a larger answer
        without building it first."""
        self.check_params(service, clusters=clusters)
        return self.service_info_parts(service, clusters, healthy_only, grouped_name)

    def service_info_parts(self, service: ServiceKey, clusters: str, healthy_only: bool,
                           grouped_name: bool = False) -> tuple[bytes, int, bytes]:
        prefix, suffix = self.storage.view(service).service_info(
            clusters, healthy_only, self.services.get(service), self.config.push_cache_millis, grouped_name)
        return prefix, self._ref_time(), suffix

    def _service_info(self, service: ServiceKey, clusters: str, healthy_only: bool,
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
        return self._service_info(service, clusters, healthy_only=False)

    def subscribe(self, client_id: str, service: ServiceKey, clusters: str, subscriber_ip: str,
                  agent: str, app: str) -> str:
        self.check_params(service, clusters=clusters)
        client = self._require_client(client_id)
        subscriber = Subscriber(subscriber_ip, agent, app, service, clusters)
        self.clients.subscribe(client, subscriber, self.clock.monotonic_ms())
        return self._service_info(service, clusters, healthy_only=False)

    def unsubscribe(self, client_id: str, service: ServiceKey, clusters: str) -> str:
        self.check_params(service, clusters=clusters)
        client = self.clients.get(client_id)
        if client is not None:
            self.clients.unsubscribe(client, service, self.clock.monotonic_ms())
        return self._service_info(service, clusters, healthy_only=False)

    def list_services(self, namespace: str, group: str, page_no: int, page_size: int) -> ServiceList:
        """Names of one namespace+group, sorted, paged from 1 (empty services included)."""
        self.check_params(ServiceKey(namespace, group, ""))
        names = self.services.names(namespace, group)
        start = max(page_no - 1, 0) * max(page_size, 0)
        return ServiceList(len(names), names[start:start + max(page_size, 0)])

    # --- ip:port clients: HTTP Open API and 1.x SDKs (Nacos InstanceOperatorClientImpl) ---
    def register_ip_port(self, service: ServiceKey, inst: InstanceInfo, ephemeral: bool = True) -> str:
        """Register an instance owned by the ip:port client ``ip:port#true`` (created on first
        use); a repeated registration also counts as a beat. Returns the client id."""
        if not ephemeral:
            raise InvalidParam(PERSISTENT_UNSUPPORTED)
        self.check_values(inst)
        self.check_params(service, instances=(inst,))
        self.check_instance_legal(inst)
        record = self.services.get(service)
        if record is not None and not record.ephemeral:  # refuse before any client is created
            raise InvalidParam(
                f"Current service {service.grouped_name} is persistent service, can't register ephemeral instance."
            )
        client_id = ip_port_client_id(inst.ip, inst.port)
        now = self.clock.monotonic_ms()
        if self.clients.get(client_id) is None:
            self.clients.add(Client(client_id, ClientKind.IP_PORT, native=True, created_ms=self.clock.now_ms(),
                                    client_ip=inst.ip, last_updated_ms=now, last_renew_ms=now))
        self._publish(client_id, service, Publication((self._with_id(service, inst),)))
        self.beats.renew(client_id, service, now)
        return client_id

    def deregister_ip_port(self, service: ServiceKey, ip: str, port: int, ephemeral: bool = True) -> None:
        """Remove the ip:port client's instance of the service; unknown ones are a no-op."""
        if not ephemeral:
            raise InvalidParam(PERSISTENT_UNSUPPORTED)
        check_port(port)
        self.check_params(service)
        client_id = ip_port_client_id(ip, port)
        if self.clients.get(client_id) is not None:
            self.deregister_instance(client_id, service)

    def beat(self, service: ServiceKey, ip: str, port: int, beat: InstanceInfo | None,
             ephemeral: bool = True) -> tuple[int, int]:
        """A client beat (InstanceController.beat + ClientBeatProcessorV2): ``(code, interval)``.

        Unknown client or service: auto-register from the ``beat`` body when there is one,
        else code 20404 so the client registers again. Otherwise refresh the beat, turn an
        unhealthy instance healthy (pushed), and tell the client its beat interval.
        """
        if not ephemeral:
            raise InvalidParam(PERSISTENT_UNSUPPORTED)
        check_port(port)
        if beat is not None:
            self.check_values(beat)
        self.check_params(service)
        client_id = ip_port_client_id(ip, port)
        client = self.clients.get(client_id)
        if client is None or service not in client.publications:
            if beat is None:
                return BEAT_RESOURCE_NOT_FOUND, self.config.client_beat_interval_ms
            self.register_ip_port(service, beat)
            client = self.clients.get(client_id)
            if client is None or service not in client.publications:  # pragma: no cover - defensive
                return BEAT_RESOURCE_NOT_FOUND, self.config.client_beat_interval_ms
        now = self.clock.monotonic_ms()
        self.beats.renew(client_id, service, now)
        client.last_updated_ms = now
        publication = client.publications[service]
        if not all(i.healthy for i in publication.instances):
            self.beats.set_health(client, service, True)
        metadata = publication.instances[0].metadata if publication.instances else {}
        return BEAT_OK, metadata_millis(metadata, HEART_BEAT_INTERVAL_KEY, self.config.client_beat_interval_ms)

    def find_instance(self, service: ServiceKey, ip: str, port: int, cluster: str) -> InstanceInfo:
        """The instance ``ip:port`` of ``cluster`` in the service, whoever published it."""
        check_port(port)
        self.check_params(service, clusters=cluster)
        if self.services.get(service) is None:
            raise NotFound(f"no service {service.grouped_name} found!")
        for _client, _publication, inst in self._matching(service, ip, port, cluster):
            return inst
        raise NotFound("no matched ip found!")

    def update_instance(self, service: ServiceKey, ip: str, port: int, cluster: str, *,
                        weight: float | None = None, enabled: bool | None = None,
                        metadata: Mapping[str, str] | None = None, ephemeral: bool = True,
                        remove_keys: Collection[str] = ()) -> int:
        """PUT/PATCH ``/instance``: change weight, enabled and metadata (merged) of the matching
        instance of every client. Nacos keeps these as a CP overlay; we apply them to the
        stored instance (a client that registers again replaces them). Returns how many."""
        if not ephemeral:
            raise InvalidParam(PERSISTENT_UNSUPPORTED)
        check_port(port)
        self.check_params(service, clusters=cluster)
        if self.services.get(service) is None:
            raise InvalidParam(f"service not found, namespace: {service.namespace}, service: {service.grouped_name}")
        matches = list(self._matching(service, ip, port, cluster))
        if not matches:
            raise NotFound("no matched ip found!")
        for client, publication, inst in matches:
            new_md = {**inst.metadata, **metadata} if metadata else inst.metadata
            if remove_keys:  # DELETE /instance/metadata/batch
                new_md = {k: v for k, v in new_md.items() if k not in remove_keys}
            updated = InstanceInfo(inst.ip, inst.port, inst.weight if weight is None else weight, inst.healthy,
                                   inst.enabled if enabled is None else enabled, inst.cluster, inst.instance_id,
                                   new_md)
            self.check_values(updated)
            self.check_params(instances=(updated,))
            self.check_instance_legal(updated)
            if updated == inst:
                continue
            instances = tuple(updated if i is inst else i for i in publication.instances)
            self.clients.publish(client, service, Publication(instances, publication.batch), self.clock.monotonic_ms())
        return len(matches)

    def edited_at(self, service: ServiceKey, ip: str, port: int, cluster: str) -> str | None:
        """Where an operator's edit of ``ip:port`` must be applied: the address of the peer
        holding the authoritative copy of the client that publishes it (its connection, or the
        Distro hash, is there), ``""`` when a publisher is native here (apply it here), None when
        no publisher is known here. An edit applied to a synced copy would never be replicated."""
        if self.services.get(service) is None:
            return None
        matches = self._matching(service, ip, port, cluster)
        if not matches:
            return None
        if any(client.native for client, _p, _i in matches):
            return ""
        return min(client.owner for client, _p, _i in matches)

    def _matching(self, service: ServiceKey, ip: str, port: int,
                  cluster: str) -> list[tuple[Client, Publication, InstanceInfo]]:
        out: list[tuple[Client, Publication, InstanceInfo]] = []
        for client_id in sorted(self.index.publishers_of(service)):
            client = self.clients.get(client_id)
            publication = client.publications.get(service) if client is not None else None
            if client is None or publication is None:
                continue
            out.extend((client, publication, inst) for inst in publication.instances
                       if inst.ip == ip and inst.port == port and inst.cluster == cluster)
        return out

    # --- service records (ServiceOperatorV2Impl) -------------------------------------------
    def create_service(self, service: ServiceKey, protect_threshold: float, metadata: Mapping[str, str],
                       ephemeral: bool) -> None:
        """Create a service with metadata (the protection threshold then applies)."""
        self.check_params(service)
        if self.services.get(service) is not None:
            raise ServiceAlreadyExists(f"specified service already exists, serviceName : {service.grouped_name}")
        record = self.services.get_or_create(service, self.clock.now_ms(), ephemeral=ephemeral)
        record.protect_threshold = protect_threshold
        record.metadata = dict(metadata)
        record.has_metadata = True

    def update_service(self, service: ServiceKey, protect_threshold: float | None,
                       metadata: Mapping[str, str] | None) -> None:
        self.check_params(service)
        record = self.services.get(service)
        if record is None:
            raise UnknownService(f"service not found, namespace: {service.namespace}, service: {service.grouped_name}")
        if protect_threshold is not None:
            record.protect_threshold = protect_threshold
        if metadata is not None:
            record.metadata = dict(metadata)
        record.has_metadata = True
        self.bus.publish(ServiceChanged(service, self.clock.now_ms()))  # selection may change: push

    def delete_service(self, service: ServiceKey) -> None:
        self.check_params(service)
        if self.services.get(service) is None:
            raise UnknownService(f"service {service.grouped_name} is not exist!")
        if self.index.publishers_of(service):
            raise ServiceNotEmpty(f"Service {service.grouped_name} is not empty, can't be delete. "
                               "Please unregister instance first")
        self.services.remove(service)

    # --- housekeeping -------------------------------------------------------------------
    def clean_empty_services(self) -> int:
        """EmptyServiceAutoCleanerV2: drop services with no publishers for long enough."""
        now = self.clock.now_ms()
        expired = [
            record.key for record in self.services
            if not record.has_metadata
            and not self.index.publishers_of(record.key)
            and now - record.last_change_ms >= self.config.empty_service_expired_ms
        ]
        for key in expired:
            self.services.remove(key)
            log.info("removed empty service %s", key)
        return len(expired)

    # --- connection-based clients (Nacos ConnectionBasedClientManager) ----------------------
    def connect_client(self, client_id: str, client_ip: str, app: str, agent: str) -> None:
        """Create the naming client of a new SDK connection (clientConnected)."""
        mono = self.clock.monotonic_ms()
        self.clients.add(Client(client_id, ClientKind.CONNECTION, native=True, created_ms=self.clock.now_ms(),
                                client_ip=client_ip, app=app, agent=agent, last_updated_ms=mono,
                                last_renew_ms=mono))

    def release_client(self, client_id: str, reason: str) -> None:
        """Remove the naming client of a closed connection and everything it published
        (clientDisconnected); an unknown id is a no-op. A client whose connection was moved by
        rebalancing is kept for its grace period instead (:class:`MovedClients`)."""
        if self.moved.keep(client_id):
            return
        self.clients.remove(client_id, reason)

    # --- reads for the Open API (ServiceControllerV2, ClientInfoControllerV2, Operator) ----
    def service_exists(self, service: ServiceKey) -> bool:
        """Whether the service record exists (empty services included)."""
        self.check_params(service)
        return self.services.get(service) is not None

    def service_detail(self, service: ServiceKey) -> ServiceDetail | None:
        """The service record with the sorted clusters of its instances; None if it does not exist."""
        self.check_params(service)
        record = self.services.get(service)
        if record is None:
            return None
        clusters = sorted({inst.cluster for inst in self.storage.view(service).instances})
        return ServiceDetail(service, record.protect_threshold, dict(record.metadata), record.ephemeral, clusters)

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
        self.check_params(service, clusters=clusters)
        wanted = parse_clusters(clusters)
        view = self.storage.view(service)
        return [inst.to_nacos(service, view.ephemeral) for inst in view.instances
                if (not wanted or inst.cluster in wanted) and (inst.healthy or not healthy_only)]

    def instance_json(self, service: ServiceKey, ip: str, port: int, cluster: str) -> dict[str, Any]:
        """One instance as a Nacos Instance object; NotFound as :meth:`find_instance`."""
        inst = self.find_instance(service, ip, port, cluster)
        return inst.to_nacos(service, self.storage.view(service).ephemeral)

    def client_ids(self) -> list[str]:
        """Every naming client of this node (own and replicated), sorted."""
        return sorted(c.client_id for c in self.clients)

    def _client(self, client_id: str) -> Client:
        client = self.clients.get(client_id)
        if client is None:
            raise NotFound(f"clientId {client_id} not exist")
        return client

    def client_detail(self, client_id: str) -> ClientDetail:
        """One client: connection-based (ip, port from its id, app, agent) or ip:port."""
        client = self._client(client_id)
        if client.kind is ClientKind.CONNECTION:
            return ClientDetail(client.client_id, True, client.last_updated_ms, client.client_ip,
                                client.client_id.rpartition("_")[2], client.app, client.agent)
        ip, _, port = responsible_tag(client.client_id).rpartition(":")
        return ClientDetail(client.client_id, False, client.last_updated_ms, ip, port, "", "")

    def client_publications(self, client_id: str) -> list[tuple[ServiceKey, InstanceInfo]]:
        """Every instance the client publishes, by service (sorted)."""
        client = self._client(client_id)
        return [(key, inst) for key, publication in sorted(client.publications.items())
                for inst in publication.instances]

    def client_subscriptions(self, client_id: str) -> list[tuple[ServiceKey, Subscriber]]:
        """Every service the client subscribes to, with its subscriber (sorted)."""
        client = self._client(client_id)
        return sorted(client.subscriptions.items())

    async def operator_metrics(self, owner_of: Callable[[str], str | None]) -> OperatorMetrics:
        """OperatorController.metrics; ``owner_of`` says who handles an ``ip:port`` (None: this node)."""
        clients = list(self.clients)
        responsible = [c for c in clients if (c.native if c.kind is ClientKind.CONNECTION
                                              else owner_of(responsible_tag(c.client_id)) is None)]
        load, mem = await run_blocking(load_and_mem)
        return OperatorMetrics(
            service_count=len(self.services),
            instance_count=self.storage.instance_count(),
            subscribe_count=sum(len(s) for s in self.index.subscribers.values()),
            responsible_instance_count=sum(c.instance_count() for c in responsible),
            client_count=len(clients),
            connection_based_client_count=sum(1 for c in clients if c.kind is ClientKind.CONNECTION),
            ephemeral_ip_port_client_count=sum(1 for c in clients if c.kind is ClientKind.IP_PORT),
            responsible_client_count=len(responsible),
            cpu=min(load / (os.cpu_count() or 1), 1.0),
            load=load,
            mem=mem,
        )
