"""Transport-neutral naming use cases: register, deregister, batch, query, subscribe, list.

Both transports (gRPC SDK and HTTP Open API) parse their wire format into these calls; all
validation with Nacos's rules and error codes lives here so the two cannot drift apart.
Mirrors EphemeralClientOperationServiceImpl + the request handlers' checks (spec §3.4–3.7).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shoal.clock import Clock
from shoal.config import Config
from shoal.errors import ClientDisconnected, InvalidParam, ParamCheckFailed
from shoal.model.client import Client, Publication, Subscriber
from shoal.model.clients import ClientManager
from shoal.model.events import (
    ClientChanged,
    ClientDeregisteredService,
    ClientRegisteredService,
    ClientSubscribedService,
    ClientUnsubscribedService,
    EventBus,
)
from shoal.model.instance import (
    DEFAULT_HEART_BEAT_INTERVAL,
    DEFAULT_HEART_BEAT_TIMEOUT,
    DEFAULT_IP_DELETE_TIMEOUT,
    HEART_BEAT_INTERVAL_KEY,
    HEART_BEAT_TIMEOUT_KEY,
    IP_DELETE_TIMEOUT_KEY,
    InstanceInfo,
    generate_instance_id,
    metadata_millis,
)
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.model.services import (
    ServiceIndex,
    ServiceManager,
    ServiceStorage,
    parse_clusters,
    service_info_json,
)

log = logging.getLogger(__name__)

# Nacos ParamCheckRule defaults (COMMON/paramcheck); Java's \w is ASCII-only.
_NAMESPACE_RE = re.compile(r"[\w-]+", re.ASCII)
_SERVICE_RE = re.compile(r"(?!@).((?!@@)[^\u4E00-\u9FA5\s])*")
_GROUP_RE = re.compile(r"[a-zA-Z0-9\-_:.]*")
_CLUSTER_PARAM_RE = re.compile(r"[0-9a-zA-Z\-_]+")
_IP_RE = re.compile(r"[^\u4E00-\u9FA5\s]*")
# NamingUtils.checkInstanceIsLegal: no underscore here, unlike the parameter checker.
_CLUSTER_LEGAL_RE = re.compile(r"[0-9a-zA-Z-]+")
MAX_NAMESPACE_LEN, MAX_SERVICE_LEN, MAX_GROUP_LEN, MAX_CLUSTER_LEN, MAX_IP_LEN = 64, 512, 128, 64, 128
MAX_WEIGHT = 10000.0


@dataclass(frozen=True, slots=True)
class ServiceList:
    count: int
    names: list[str]


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

    # --- validation ---------------------------------------------------------------------
    def check_params(self, service: ServiceKey | None = None, clusters: str | None = None,
                     instances: Sequence[InstanceInfo] = ()) -> None:
        """Nacos's parameter checker (spec §3.7); raises ParamCheckFailed (answered 500/400)."""
        if not self.config.param_check_enabled:
            return
        if service is not None:
            _check(service.namespace, MAX_NAMESPACE_LEN, _NAMESPACE_RE, "namespaceId")
            _check(service.name, MAX_SERVICE_LEN, _SERVICE_RE, "serviceName")
            _check(service.group, MAX_GROUP_LEN, _GROUP_RE, "group")
        if clusters:
            for cluster in clusters.split(","):
                _check(cluster, MAX_CLUSTER_LEN, _CLUSTER_PARAM_RE, "cluster")
        for inst in instances:
            _check(inst.ip, MAX_IP_LEN, _IP_RE, "ip")
            if not 0 <= inst.port <= 65535:
                raise ParamCheckFailed("Param 'port' is illegal, the value should be between 0 and 65535.")
            _check(inst.cluster, MAX_CLUSTER_LEN, _CLUSTER_PARAM_RE, "cluster")
            size = sum(len(k) + len(v) for k, v in inst.metadata.items())
            if size > self.config.metadata_max_length:
                raise ParamCheckFailed(
                    f"Param 'Metadata' is illegal, the metadata total length {size} exceeds "
                    f"{self.config.metadata_max_length}."
                )

    @staticmethod
    def check_instance_legal(inst: InstanceInfo) -> None:
        """NamingUtils.checkInstanceIsLegal (single registration only): answered 400/400."""
        md = inst.metadata
        interval = metadata_millis(md, HEART_BEAT_INTERVAL_KEY, DEFAULT_HEART_BEAT_INTERVAL)
        if (metadata_millis(md, HEART_BEAT_TIMEOUT_KEY, DEFAULT_HEART_BEAT_TIMEOUT) < interval
                or metadata_millis(md, IP_DELETE_TIMEOUT_KEY, DEFAULT_IP_DELETE_TIMEOUT) < interval):
            raise InvalidParam(
                "Instance 'heart beat interval' must less than 'heart beat timeout' and 'ip delete timeout'."
            )
        if inst.cluster and not _CLUSTER_LEGAL_RE.fullmatch(inst.cluster):
            raise InvalidParam(
                f"Instance 'clusterName' should be characters with only 0-9a-zA-Z-. (current: {inst.cluster})"
            )

    @staticmethod
    def check_values(inst: InstanceInfo) -> None:
        """Values no Nacos client sends but a hand-made request might: refuse them cleanly."""
        if not inst.ip:
            raise InvalidParam("Instance 'ip' can not be empty.")
        if not 0 <= inst.port <= 65535:
            raise InvalidParam("Instance 'port' must be between 0 and 65535.")
        if not math.isfinite(inst.weight) or not 0.0 <= inst.weight <= MAX_WEIGHT:
            raise InvalidParam(f"Instance 'weight' must be between 0 and {MAX_WEIGHT:g}.")

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
        if client.unpublish(service, self.clock.monotonic_ms()) is not None:
            self.bus.publish(ClientDeregisteredService(service, client_id))
            self.bus.publish(ClientChanged(client))

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
        client.publish(service, publication, self.clock.monotonic_ms())
        self.bus.publish(ClientRegisteredService(service, client_id))
        self.bus.publish(ClientChanged(client))

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

    def _service_info(self, service: ServiceKey, clusters: str, healthy_only: bool,
                      grouped_name: bool = False) -> str:
        record = self.services.get(service)
        view = self.storage.view(service)
        selection = view.select(parse_clusters(clusters), healthy_only, record)
        return service_info_json(service, clusters, selection, self._ref_time(),
                                 self.config.push_cache_millis, grouped_name)

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
        first = client.subscribe(subscriber, self.clock.monotonic_ms())
        self.bus.publish(ClientSubscribedService(service, client_id, subscriber, first))
        return self._service_info(service, clusters, healthy_only=False)

    def unsubscribe(self, client_id: str, service: ServiceKey, clusters: str) -> str:
        self.check_params(service, clusters=clusters)
        client = self.clients.get(client_id)
        if client is not None and client.unsubscribe(service, self.clock.monotonic_ms()):
            self.bus.publish(ClientUnsubscribedService(service, client_id))
        return self._service_info(service, clusters, healthy_only=False)

    def list_services(self, namespace: str, group: str, page_no: int, page_size: int) -> ServiceList:
        """Names of one namespace+group, sorted, paged from 1 (empty services included)."""
        self.check_params(ServiceKey(namespace, group, ""))
        names = self.services.names(namespace, group)
        start = max(page_no - 1, 0) * max(page_size, 0)
        return ServiceList(len(names), names[start:start + max(page_size, 0)])

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


def _check(value: str, max_len: int, pattern: re.Pattern[str], name: str) -> None:
    if not value:
        return
    if len(value) > max_len:
        raise ParamCheckFailed(f"Param '{name}' is illegal, the param length should not exceed {max_len}.")
    if not pattern.fullmatch(value):
        raise ParamCheckFailed(f"Param '{name}' is illegal, illegal characters should not appear in the param.")


def parse_metadata(raw: object, field: str = "metadata") -> Mapping[str, str]:
    """A JSON object of string→string (numbers and booleans are stringified, as Jackson does)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidParam(f"'{field}' must be a JSON object of strings")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            out[key] = value
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (int, float)) and value is not None:
            out[key] = str(value)
        else:
            raise InvalidParam(f"'{field}.{key}' must be a string")
    return out
