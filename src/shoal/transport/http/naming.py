"""Naming Open API handlers, v1 (``/nacos/v1/ns``) and v2 (``/nacos/v2/ns``).

Mirrors Nacos's InstanceController / InstanceControllerV2, ServiceController /
ServiceControllerV2, OperatorController and ClientInfoControllerV2 (spec §7.2–7.3) on top of
the transport-neutral service layer, so an HTTP registration is an ip:port client of the same
model as the gRPC clients (each sees the other's instances, and both are pushed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal.config import Config
from shoal.errors import InvalidParam
from shoal.model.client import Client, ClientKind
from shoal.model.instance import InstanceInfo
from shoal.model.ip_port import responsible_tag
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.model.services import ServiceRecord
from shoal.service_layer import PERSISTENT_UNSUPPORTED, NamingService, parse_metadata
from shoal.tasks import run_blocking
from shoal.transport.http.api import (
    SERVICE_ALREADY_EXIST,
    SERVICE_DELETE_FAILURE,
    SERVICE_NOT_EXIST,
    ApiError,
    dumps,
    json_text,
    ok_text,
    v2_ok,
)
from shoal.transport.http.params import Params

Handler = Callable[[web.Request, Params], Any]
_SELECTOR_NONE = {"type": "none", "contextType": "NONE"}


class NamingRoutes:
    """The naming endpoints; each handler takes the request and its parsed parameters."""

    def __init__(self, config: Config, naming: NamingService, is_serving: Callable[[], bool],
                 owner_of: Callable[[str], str | None]) -> None:
        self.config = config
        self.naming = naming
        self.is_serving = is_serving
        self.owner_of = owner_of  # Responsibility.owner_of: None = this node handles the ip:port

    # --- instances -------------------------------------------------------------------------
    async def v1_register(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        inst, ephemeral = instance_from(p)
        self.naming.register_ip_port(service, inst, ephemeral)
        return ok_text()

    async def v2_register(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        inst, ephemeral = instance_from(p)
        self.naming.register_ip_port(service, inst, ephemeral)
        return v2_ok('"ok"')

    async def v1_deregister(self, request: web.Request, p: Params) -> web.Response:
        self._deregister(p.v1_service(), p)
        return ok_text()

    async def v2_deregister(self, request: web.Request, p: Params) -> web.Response:
        self._deregister(p.v2_service(), p)
        return v2_ok('"ok"')

    def _deregister(self, service: ServiceKey, p: Params) -> None:
        ip, port = p.required("ip"), p.port()
        self.naming.deregister_ip_port(service, ip, port, p.boolean("ephemeral", True))

    async def v1_update(self, request: web.Request, p: Params) -> web.Response:
        self._update(p.v1_service(), p)
        return ok_text()

    async def v2_update(self, request: web.Request, p: Params) -> web.Response:
        self._update(p.v2_service(), p)
        return v2_ok('"ok"')

    def _update(self, service: ServiceKey, p: Params) -> None:
        """PUT: weight, enabled and metadata as given (defaults 1.0 / true / none)."""
        ip, port = p.required("ip"), p.port()
        if not p.boolean("ephemeral", True):
            raise InvalidParam(PERSISTENT_UNSUPPORTED)
        self.naming.update_instance(service, ip, port, p.cluster(), weight=p.weight(1.0), enabled=p.enabled(True),
                                    metadata=p.metadata())

    async def v1_patch(self, request: web.Request, p: Params) -> web.Response:
        """PATCH: only the given fields change."""
        service = p.v1_service()
        ip, port = p.required("ip"), p.port()
        p.boolean("healthy", True)  # accepted (and checked) like Nacos; health is the beat's business
        self.naming.update_instance(service, ip, port, p.cluster(), weight=p.weight(None), enabled=p.enabled(None),
                                    metadata=p.metadata())
        return ok_text()

    async def v1_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        inst = self.naming.find_instance(service, p.required("ip"), p.port(), p.cluster())
        return json_text(dumps(detail_json(service, inst, "service")))

    async def v2_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        inst = self.naming.find_instance(service, p.required("ip"), p.port(), p.cluster())
        return v2_ok(dumps(detail_json(service, inst, "serviceName")))

    async def v1_list(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        p.integer("udpPort", 0, 0, 65535)  # UDP push to 1.x clients is not offered; the value is checked
        info = self.naming.query(service, p.text("clusters"), p.boolean("healthyOnly", False), grouped_name=True)
        return json_text(info)

    async def v2_list(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        p.integer("udpPort", 0, 0, 65535)
        info = self.naming.query(service, p.text("clusterName"), p.boolean("healthyOnly", False), grouped_name=True)
        return v2_ok(info)

    async def beat(self, request: web.Request, p: Params) -> web.Response:
        """PUT /instance/beat (v1 and v2 alike: a bare object, no envelope)."""
        service = p.v1_service()
        ip, port, beat = beat_target(p)
        code, interval = self.naming.beat(service, ip, port, beat)
        return json_text(f'{{"clientBeatInterval":{interval},"code":{code},"lightBeatEnabled":true}}')

    # --- services ----------------------------------------------------------------------------
    async def v1_service_create(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        check_selector(p)
        # Nacos 1.x/2.x: a service created through this API is persistent (spec §9.17).
        self.naming.create_service(service, p.number("protectThreshold", 0.0), p.metadata() or {}, ephemeral=False)
        return ok_text()

    async def v2_service_create(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        check_selector(p)
        if self.naming.services.get(service) is not None:
            raise ApiError(f"specified service already exists, serviceName : {service.grouped_name}", 400,
                           SERVICE_ALREADY_EXIST)
        self.naming.create_service(service, p.number("protectThreshold", 0.0), p.metadata() or {},
                                   ephemeral=p.boolean("ephemeral", False))
        return v2_ok('"ok"')

    async def v1_service_delete(self, request: web.Request, p: Params) -> web.Response:
        self.naming.delete_service(p.v1_service())
        return ok_text()

    async def v2_service_delete(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        self._require_service(service)
        if self.naming.index.publishers_of(service):
            raise ApiError(f"Service {service.grouped_name} is not empty, can't be delete. "
                           "Please unregister instance first", 400, SERVICE_DELETE_FAILURE)
        self.naming.delete_service(service)
        return v2_ok('"ok"')

    async def v1_service_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        check_selector(p)
        self.naming.update_service(service, p.number("protectThreshold"), p.metadata())
        return ok_text()

    async def v2_service_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        check_selector(p)
        self._require_service(service)
        self.naming.update_service(service, p.number("protectThreshold", 0.0), p.metadata() or {})
        return v2_ok('"ok"')

    async def v1_service_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        self.naming.check_params(service)
        record = self.naming.services.get(service)
        if record is None:
            raise InvalidParam(f"service not found, namespace: {service.namespace}, serviceName: {service.name}")
        clusters = [{"name": c, "healthChecker": {"type": "TCP"}, "metadata": {}} for c in self._clusters(service)]
        return json_text(dumps({
            "namespaceId": service.namespace, "groupName": service.group, "name": service.name,
            "protectThreshold": record.protect_threshold, "metadata": record.metadata,
            "selector": _SELECTOR_NONE, "clusters": clusters,
        }))

    async def v2_service_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        self.naming.check_params(service)
        record = self._require_service(service, status=404)
        cluster_map = {c: {"clusterName": c, "healthChecker": {"type": "TCP"}, "metadata": {},
                           "healthyCheckPort": 80, "useInstancePortForCheck": True}
                       for c in self._clusters(service)}
        return v2_ok(dumps({
            "namespace": service.namespace, "serviceName": service.name, "groupName": service.group,
            "clusterMap": cluster_map, "metadata": record.metadata, "protectThreshold": record.protect_threshold,
            "selector": _SELECTOR_NONE, "ephemeral": record.ephemeral,
        }))

    async def v1_service_list(self, request: web.Request, p: Params) -> web.Response:
        page = self.naming.list_services(p.namespace(), p.text("groupName") or "DEFAULT_GROUP",
                                         p.integer("pageNo", None, 1), p.integer("pageSize", None, 1))
        return json_text(dumps({"count": page.count, "doms": page.names}))

    async def v2_service_list(self, request: web.Request, p: Params) -> web.Response:
        page = self.naming.list_services(p.namespace(), p.text("groupName") or "DEFAULT_GROUP",
                                         p.integer("pageNo", 1, 1), p.integer("pageSize", 20, 1, 500))
        return v2_ok(dumps({"count": page.count, "services": page.names}))

    def _require_service(self, service: ServiceKey, status: int = 400) -> ServiceRecord:
        record = self.naming.services.get(service)
        if record is None:
            raise ApiError(f"service not found, namespace: {service.namespace}, service: {service.grouped_name}",
                           status, SERVICE_NOT_EXIST)
        return record

    def _clusters(self, service: ServiceKey) -> list[str]:
        return sorted({inst.cluster for inst in self.naming.storage.view(service).instances})

    # --- operator ----------------------------------------------------------------------------
    async def v1_metrics(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(await self._metrics(p)))

    async def v2_metrics(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(await self._metrics(p)))

    async def _metrics(self, p: Params) -> dict[str, Any]:
        status = "UP" if self.is_serving() else "STARTING"
        if p.boolean("onlyStatus", True):
            return {"status": status}
        naming = self.naming
        clients = list(naming.clients)
        owner_of = self.owner_of
        responsible = [c for c in clients if (c.native if c.kind is ClientKind.CONNECTION
                                              else owner_of(responsible_tag(c.client_id)) is None)]
        load, mem = await run_blocking(_load_and_mem)
        return {
            "status": status,
            "serviceCount": len(naming.services),
            "instanceCount": naming.storage.instance_count(),
            "subscribeCount": sum(len(s) for s in naming.index.subscribers.values()),
            "responsibleInstanceCount": sum(c.instance_count() for c in responsible),
            "clientCount": len(clients),
            "connectionBasedClientCount": sum(1 for c in clients if c.kind is ClientKind.CONNECTION),
            "ephemeralIpPortClientCount": sum(1 for c in clients if c.kind is ClientKind.IP_PORT),
            "persistentIpPortClientCount": 0,
            "responsibleClientCount": len(responsible),
            "cpu": round(min(load / (os.cpu_count() or 1), 1.0), 4),
            "load": round(load, 4),
            "mem": round(mem, 4),
        }

    async def v1_switches(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(self.switches()))

    async def v2_switches(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(self.switches()))

    def switches(self) -> dict[str, Any]:
        """SwitchDomain as Nacos serialises it, with this node's values (read-only here)."""
        c = self.config
        return {
            "name": "00-00---000-NACOS_SWITCH_DOMAIN-000---00-00", "masters": None, "adWeightMap": {},
            "defaultPushCacheMillis": c.push_cache_millis, "clientBeatInterval": c.client_beat_interval_ms,
            "defaultCacheMillis": 3000, "distroThreshold": 0.7, "healthCheckEnabled": c.health_check_enabled,
            "autoChangeHealthCheckEnabled": True, "distroEnabled": True, "enableStandalone": True,
            "pushEnabled": c.push_enabled, "checkTimes": 3,
            "httpHealthParams": {"max": 5000, "min": 500, "factor": 0.85},
            "tcpHealthParams": {"max": 5000, "min": 1000, "factor": 0.75},
            "mysqlHealthParams": {"max": 3000, "min": 2000, "factor": 0.65},
            "incrementalList": [], "serverStatusSynchronizationPeriodMillis": 2000,
            "serviceStatusSynchronizationPeriodMillis": 5000, "disableAddIP": False, "sendBeatOnly": False,
            "lightBeatEnabled": True, "limitedUrlMap": {}, "distroServerExpiredMillis": 10000,
            "pushGoVersion": "0.1.0", "pushJavaVersion": "0.1.0", "pushPythonVersion": "0.4.3",
            "pushCVersion": "1.0.12", "pushCSharpVersion": "0.9.0", "enableAuthentication": c.auth_enabled,
            "overriddenServerStatus": None, "defaultInstanceEphemeral": True, "healthCheckWhiteList": [],
            "checksum": None,
        }

    # --- clients (v2) -------------------------------------------------------------------------
    async def v2_client_list(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(sorted(c.client_id for c in self.naming.clients)))

    async def v2_client_detail(self, request: web.Request, p: Params) -> web.Response:
        client = self._client(p)
        out: dict[str, Any] = {"clientId": client.client_id, "ephemeral": True,
                               "lastUpdatedTime": client.last_updated_ms}
        if client.kind is ClientKind.CONNECTION:
            out.update(clientType="connection", connectType="GRPC", appName=client.app, version=client.agent,
                       clientIp=client.client_ip, clientPort=client.client_id.rpartition("_")[2])
        else:
            ip, _, port = responsible_tag(client.client_id).rpartition(":")
            out.update(clientType="ipport", clientIp=ip, clientPort=port)
        return v2_ok(dumps(out))

    async def v2_client_publications(self, request: web.Request, p: Params) -> web.Response:
        client = self._client(p)
        out = [{"namespace": key.namespace, "group": key.group, "serviceName": key.name,
                "registeredInstance": {"ip": i.ip, "port": i.port, "cluster": i.cluster}}
               for key, publication in sorted(client.publications.items()) for i in publication.instances]
        return v2_ok(dumps(out))

    async def v2_client_subscriptions(self, request: web.Request, p: Params) -> web.Response:
        client = self._client(p)
        out = [{"namespace": key.namespace, "group": key.group, "serviceName": key.name,
                "subscriberInfo": {"app": s.app, "agent": s.agent, "addr": s.ip}}
               for key, s in sorted(client.subscriptions.items())]
        return v2_ok(dumps(out))

    def _client(self, p: Params) -> Client:
        client_id = p.required("clientId")
        client = self.naming.clients.get(client_id)
        if client is None:
            raise ApiError(f"clientId {client_id} not exist", 404, 20004)
        return client


# --- parameter shapes ------------------------------------------------------------------------
def instance_from(p: Params) -> tuple[InstanceInfo, bool]:
    """HttpRequestInstanceBuilder: the instance of a register request, and its ephemeral flag."""
    ip = p.required("ip")
    port = p.port()
    weight = p.weight(1.0)
    assert weight is not None
    inst = InstanceInfo(ip=ip, port=port, weight=weight, healthy=p.boolean("healthy", True),
                        enabled=bool(p.enabled(True)), cluster=p.cluster(), metadata=p.metadata() or {})
    return inst, p.boolean("ephemeral", True)


def beat_target(p: Params) -> tuple[str, int, InstanceInfo | None]:
    """``(ip, port, beat instance or None)``: the ``beat`` JSON wins over ``ip``/``port``
    (InstanceController.beat); without it this is a light beat and both are required."""
    raw = p.text("beat")
    cluster = p.text("clusterName") or DEFAULT_CLUSTER
    if not raw:
        return p.required("ip"), p.port(), None
    try:
        beat = json.loads(raw)
    except ValueError:
        raise InvalidParam("Param 'beat' must be a JSON object.") from None
    if not isinstance(beat, dict):
        raise InvalidParam("Param 'beat' must be a JSON object.")
    ip = beat.get("ip")
    if not isinstance(ip, str) or not ip.strip():
        raise InvalidParam("Param 'beat.ip' is required.")
    port = beat.get("port")
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidParam("Param 'beat.port' must be an integer between 0 and 65535.")
    weight = beat.get("weight", 1.0)
    if weight is None:
        weight = 1.0
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 10000.0:
        raise InvalidParam("Param 'beat.weight' must be a number between 0 and 10000.")
    beat_cluster = beat.get("cluster")
    if beat_cluster is not None and not isinstance(beat_cluster, str):
        raise InvalidParam("Param 'beat.cluster' must be a string.")
    ephemeral = beat.get("ephemeral", True)
    if ephemeral is False or (isinstance(ephemeral, str) and ephemeral.lower() == "false"):
        raise InvalidParam(PERSISTENT_UNSUPPORTED)
    metadata = parse_metadata(beat.get("metadata"), "beat.metadata")
    ip = ip.strip()
    inst = InstanceInfo(ip=ip, port=port, weight=float(weight), cluster=(beat_cluster or "").strip() or cluster,
                        metadata=dict(metadata))
    return ip, port, inst


def distro_tag(p: Params) -> str:
    """The ``ip:port`` the DistroFilter routes a write by (the beat JSON's when present)."""
    ip = p.text("ip")
    if not ip and p.text("beat"):
        try:
            beat = json.loads(p.text("beat"))
        except ValueError:
            beat = None
        if isinstance(beat, dict):
            return f"{beat.get('ip', '')}:{beat.get('port', 0)}"
    return f"{ip}:{p.text('port') or '0'}"


def check_selector(p: Params) -> None:
    """``selector`` must be JSON ``{"type": "none"|"label", ...}``; it is accepted and not
    applied (label selectors need Nacos's CMDB, which does not exist here)."""
    raw = p.text("selector")
    if not raw:
        return
    try:
        selector = json.loads(raw)
    except ValueError:
        raise InvalidParam("Param 'selector' must be a JSON object.") from None
    if not isinstance(selector, dict) or str(selector.get("type", "")).lower() not in ("none", "label"):
        raise InvalidParam("Param 'selector' must be a JSON object with type 'none' or 'label'.")


def detail_json(service: ServiceKey, inst: InstanceInfo, service_key: str) -> dict[str, Any]:
    return {service_key: service.grouped_name, "ip": inst.ip, "port": inst.port, "clusterName": inst.cluster,
            "weight": float(inst.weight), "healthy": inst.healthy, "instanceId": inst.instance_id,
            "metadata": dict(inst.metadata)}


def _load_and_mem() -> tuple[float, float]:
    """1-minute load average and used-memory ratio (blocking: reads /proc)."""
    load = os.getloadavg()[0]
    total = available = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    total = int(rest.split()[0])
                elif key == "MemAvailable":
                    available = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return load, 0.0
    return load, (1 - available / total) if total else 0.0
