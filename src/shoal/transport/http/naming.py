"""Naming Open API handlers, v1 (``/nacos/v1/ns``) and v2 (``/nacos/v2/ns``).

Mirrors Nacos's InstanceController / InstanceControllerV2, ServiceController /
ServiceControllerV2, OperatorController (metrics; switches are in operator.py) and ClientInfoControllerV2
(docs/protocol.md §5.2) on top of
the transport-neutral service layer, so an HTTP registration is an ip:port client of the same
model as the gRPC clients (each sees the other's instances, and both are pushed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal import jsonfast
from shoal.auth.service import READ, WRITE
from shoal.config import Config
from shoal.errors import InvalidParam, ServiceNotFound, UnknownService
from shoal.model.instance import InstanceInfo
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.service_layer import NamingService, check_port, parse_metadata
from shoal.service_layer.catalog import PushFigures
from shoal.service_layer.persistent import ClusterSettings
from shoal.service_layer.selectors import normalise_selector
from shoal.service_layer.services import ServiceDescription
from shoal.transport.http.api import Api, dumps, json_text, ok_text, v2_ok
from shoal.transport.http.params import Params
from shoal.transport.http.routes import ADMIN, Route

Handler = Callable[[web.Request, Params], Any]
_SELECTOR_NONE = {"type": "none", "contextType": "NONE"}


class NamingRoutes:
    """The naming endpoints; each handler takes the request and its parsed parameters and calls
    the service layer's use cases (the instance and service façades choose AP or CP)."""

    def __init__(self, config: Config, naming: NamingService, is_serving: Callable[[], bool],
                 owner_of: Callable[[str], str | None], push: PushFigures | None = None) -> None:
        self.config = config
        self.push = push  # the push engine's lag figures (the metrics' pushLag, v3 subscriber lists)
        self.instances = naming.instance_ops
        self.services = naming.service_ops
        self.reads = naming.reads
        self.introspection = naming.introspection
        self.is_serving = is_serving
        self.owner_of = owner_of  # Responsibility.owner_of: None = this node handles the ip:port

    def routes(self) -> list[Route]:
        """The naming Open API v1 and v2 (instances, services, health, metrics, clients)."""
        table = []
        for api, base, register, deregister, update, detail, listing in (
            (Api.V1, "/nacos/v1/ns", self.v1_register, self.v1_deregister, self.v1_update, self.v1_detail,
             self.v1_list),
            (Api.V2, "/nacos/v2/ns", self.v2_register, self.v2_deregister, self.v2_update, self.v2_detail,
             self.v2_list),
        ):
            table += [
                Route("POST", f"{base}/instance", register, WRITE, distro=True, api=api),
                Route("DELETE", f"{base}/instance", deregister, WRITE, distro=True, api=api),
                Route("PUT", f"{base}/instance", update, WRITE, api=api),  # an edit: CP, any node takes it
                Route("GET", f"{base}/instance", detail, READ, api=api),
                Route("GET", f"{base}/instance/list", listing, READ, api=api),
                Route("PUT", f"{base}/instance/beat", self.beat, WRITE, distro=True, api=api),
            ]
        table.append(Route("PATCH", "/nacos/v1/ns/instance", self.v1_patch, WRITE, api=Api.V1))  # as PUT
        for api, base, create, delete, update, detail, listing in (
            (Api.V1, "/nacos/v1/ns", self.v1_service_create, self.v1_service_delete, self.v1_service_update,
             self.v1_service_detail, self.v1_service_list),
            (Api.V2, "/nacos/v2/ns", self.v2_service_create, self.v2_service_delete, self.v2_service_update,
             self.v2_service_detail, self.v2_service_list),
        ):
            table += [
                Route("POST", f"{base}/service", create, WRITE, api=api),
                Route("DELETE", f"{base}/service", delete, WRITE, api=api),
                Route("PUT", f"{base}/service", update, WRITE, api=api),
                Route("GET", f"{base}/service", detail, READ, api=api),
                Route("GET", f"{base}/service/list", listing, READ, api=api),
            ]
        return [
            *table,
            Route("PUT", "/nacos/v1/ns/cluster", self.v1_cluster_update, WRITE, api=Api.V1),
            Route("PUT", "/nacos/v1/ns/health", self.v1_health_update, WRITE, api=Api.V1),
            Route("PUT", "/nacos/v1/ns/health/instance", self.v1_health_update, WRITE, api=Api.V1),
            Route("GET", "/nacos/v1/ns/operator/metrics", self.v1_metrics, api=Api.V1),
            Route("GET", "/nacos/v1/ns/ops/metrics", self.v1_metrics, api=Api.V1),
            Route("GET", "/nacos/v2/ns/operator/metrics", self.v2_metrics, api=Api.V2),
            Route("GET", "/nacos/v2/ns/client/list", self.v2_client_list, ADMIN, api=Api.V2),
            Route("GET", "/nacos/v2/ns/client", self.v2_client_detail, ADMIN, api=Api.V2),
            Route("GET", "/nacos/v2/ns/client/publish/list", self.v2_client_publications, ADMIN, api=Api.V2),
            Route("GET", "/nacos/v2/ns/client/subscribe/list", self.v2_client_subscriptions, ADMIN, api=Api.V2),
        ]

    async def _register(self, service: ServiceKey, p: Params) -> None:
        inst, ephemeral = instance_from(p)
        await self.instances.register(service, inst, ephemeral=ephemeral)

    # --- instances -------------------------------------------------------------------------
    async def v1_register(self, request: web.Request, p: Params) -> web.Response:
        await self._register(p.v1_service(), p)
        return ok_text()

    async def v2_register(self, request: web.Request, p: Params) -> web.Response:
        await self._register(p.v2_service(), p)
        return v2_ok('"ok"')

    async def v1_deregister(self, request: web.Request, p: Params) -> web.Response:
        await self._deregister(p.v1_service(), p)
        return ok_text()

    async def v2_deregister(self, request: web.Request, p: Params) -> web.Response:
        await self._deregister(p.v2_service(), p)
        return v2_ok('"ok"')

    async def _deregister(self, service: ServiceKey, p: Params) -> None:
        ip, port, ephemeral = p.required("ip"), p.port(), p.boolean("ephemeral", True)
        await self.instances.deregister(service, ip, port, p.cluster(), ephemeral=ephemeral)

    async def v1_update(self, request: web.Request, p: Params) -> web.Response:
        await self._update(p.v1_service(), p)
        return ok_text()

    async def v2_update(self, request: web.Request, p: Params) -> web.Response:
        await self._update(p.v2_service(), p)
        return v2_ok('"ok"')

    async def _update(self, service: ServiceKey, p: Params) -> None:
        """PUT: weight, enabled and metadata as given (defaults 1.0 / true / none)."""
        ip, port, ephemeral = p.required("ip"), p.port(), p.boolean("ephemeral", True)
        await self.instances.update(service, ip, port, p.cluster(), ephemeral=ephemeral, weight=p.weight(1.0),
                                    enabled=p.enabled(True), metadata=p.metadata())

    async def v1_patch(self, request: web.Request, p: Params) -> web.Response:
        """PATCH: only the given fields change."""
        service = p.v1_service()
        ip, port = p.required("ip"), p.port()
        p.boolean("healthy", True)  # accepted (and checked) like Nacos; health is the beat's business
        await self.instances.patch(service, ip, port, p.cluster(), weight=p.weight(None), enabled=p.enabled(None),
                                   metadata=p.metadata())
        return ok_text()

    async def v1_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        inst = self.reads.find_instance(service, p.required("ip"), p.port(), p.cluster())
        return json_text(dumps(detail_json(service, inst, "service")))

    async def v2_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        inst = self.reads.find_instance(service, p.required("ip"), p.port(), p.cluster())
        return v2_ok(dumps(detail_json(service, inst, "serviceName")))

    async def v1_list(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        check_port(p.integer("udpPort", 0), "udpPort")  # UDP push to 1.x clients is not offered; checked
        info = self.reads.query(service, p.text("clusters"), p.boolean("healthyOnly", False), grouped_name=True)
        return json_text(info)

    async def v2_list(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        check_port(p.integer("udpPort", 0), "udpPort")
        info = self.reads.query(service, p.text("clusterName"), p.boolean("healthyOnly", False), grouped_name=True)
        return v2_ok(info)

    async def beat(self, request: web.Request, p: Params) -> web.Response:
        """PUT /instance/beat (v1 and v2 alike: a bare object, no envelope)."""
        service = p.v1_service()
        ip, port, beat, ephemeral = beat_target(p)
        code, interval = await self.instances.beat(service, ip, port, beat, ephemeral)
        return json_text(f'{{"clientBeatInterval":{interval},"code":{code},"lightBeatEnabled":true}}')

    # --- services ----------------------------------------------------------------------------
    async def v1_service_create(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        selector = check_selector(p)
        # Nacos 1.x/2.x: a service created through this API is persistent (docs/protocol.md §5.2).
        await self.services.create(service, p.number("protectThreshold", 0.0), p.metadata() or {}, False, selector)
        return ok_text()

    async def v2_service_create(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        selector = check_selector(p)
        await self.services.create(service, p.number("protectThreshold", 0.0), p.metadata() or {},
                                   p.boolean("ephemeral", False), selector)
        return v2_ok('"ok"')

    async def v1_service_delete(self, request: web.Request, p: Params) -> web.Response:
        await self.services.delete(p.v1_service())
        return ok_text()

    async def v2_service_delete(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        if not self.services.exists(service):  # v2 words a missing service its own way
            raise UnknownService(_service_not_found(service))
        await self.services.delete(service)
        return v2_ok('"ok"')

    async def v1_service_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        selector = check_selector(p)
        await self.services.update(service, p.number("protectThreshold"), p.metadata(), selector)
        return ok_text()

    async def v2_service_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        selector = check_selector(p)
        await self.services.update(service, p.number("protectThreshold", 0.0), p.metadata() or {}, selector)
        return v2_ok('"ok"')

    async def v1_service_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        found = self.services.describe(service)
        if found is None:
            raise UnknownService(f"service not found, namespace: {service.namespace}, serviceName: {service.name}")
        clusters = [{"name": c, "healthChecker": dict(s.health_checker), "metadata": dict(s.metadata),
                     "defaultCheckPort": s.check_port, "useIPPort4Check": s.use_instance_port}
                    for c, s in found.clusters.items()]
        return json_text(dumps({
            "namespaceId": service.namespace, "groupName": service.group, "name": service.name,
            "protectThreshold": found.detail.protect_threshold, "metadata": found.detail.metadata,
            "selector": selector_json(found), "clusters": clusters,
        }))

    async def v1_health_update(self, request: web.Request, p: Params) -> web.Response:
        """PUT /nacos/v1/ns/health[/instance] (HealthController.update)."""
        await self.health_update(p)
        return ok_text()

    async def health_update(self, p: Params) -> None:
        """Set a persistent instance's health by hand (``healthy``, or the 1.x ``valid``); the next
        server-side check may flip it back unless the cluster's checker is NONE."""
        service = p.v1_service()
        raw = p.text("healthy") or p.text("valid")
        if not raw:
            raise InvalidParam("Param 'healthy' is required.")
        healthy = p.boolean("healthy" if p.text("healthy") else "valid", True)
        await self.instances.set_health(service, p.required("ip"), p.port(), p.cluster(), healthy)

    async def v1_cluster_update(self, request: web.Request, p: Params) -> web.Response:
        """PUT /nacos/v1/ns/cluster (ClusterController.update)."""
        await self.cluster_update(p)
        return ok_text()

    async def cluster_update(self, p: Params) -> None:
        """A cluster's health checker (JSON ``{"type":"TCP"|"HTTP"|"NONE","path":..,"headers":..,
        "expectedResponseCode":..}``), ``checkPort``, ``useInstancePort4Check`` and metadata, kept in
        the service's CP document."""
        service = p.v1_service()
        cluster = p.required("clusterName")
        raw = p.required("healthChecker")
        try:
            checker = jsonfast.loads(raw)
        except ValueError:
            raise InvalidParam("Param 'healthChecker' must be a JSON object.") from None
        if not isinstance(checker, dict) or str(checker.get("type", "")).upper() not in ("TCP", "HTTP", "NONE"):
            raise InvalidParam("Param 'healthChecker' must be a JSON object with type TCP, HTTP or NONE "
                               "(MySQL checks are not offered).")
        checker["type"] = str(checker["type"]).upper()
        check_port(p.integer("checkPort", 80), "checkPort")
        settings = ClusterSettings(checker, p.integer("checkPort", 80) or 80, p.boolean("useInstancePort4Check", True),
                                   p.metadata() or {})
        await self.services.update_cluster(service, cluster, settings)

    async def v2_service_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        return v2_ok(dumps(service_detail_json(service, self.services.describe(service), "namespace")))

    async def v1_service_list(self, request: web.Request, p: Params) -> web.Response:
        page = self.services.list(p.namespace(), p.text("groupName") or "DEFAULT_GROUP",
                                  p.page_no(default=None), p.page_size())
        return json_text(dumps({"count": page.count, "doms": page.names}))

    async def v2_service_list(self, request: web.Request, p: Params) -> web.Response:
        page = self.services.list(p.namespace(), p.text("groupName") or "DEFAULT_GROUP",
                                  p.page_no(), p.page_size(default=20, high=500))
        return v2_ok(dumps({"count": page.count, "services": page.names}))

    # --- operator ----------------------------------------------------------------------------
    async def v1_metrics(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(await self.metrics(p)))

    async def v2_metrics(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(await self.metrics(p)))

    async def metrics(self, p: Params) -> dict[str, Any]:
        """OperatorController.metrics: the status, and with ``onlyStatus=false`` the counts."""
        status = "UP" if self.is_serving() else "STARTING"
        if p.boolean("onlyStatus", True):
            return {"status": status}
        m = await self.introspection.operator_metrics(self.owner_of)
        return {
            "status": status,
            "serviceCount": m.service_count,
            "instanceCount": m.instance_count,
            "subscribeCount": m.subscribe_count,
            "responsibleInstanceCount": m.responsible_instance_count,
            "clientCount": m.client_count,
            "connectionBasedClientCount": m.connection_based_client_count,
            "ephemeralIpPortClientCount": m.ephemeral_ip_port_client_count,
            "persistentIpPortClientCount": 0,
            "responsibleClientCount": m.responsible_client_count,
            "cpu": round(m.cpu, 4),
            "load": round(m.load, 4),
            "mem": round(m.mem, 4),
            "pushLag": self.push.lag_summary() if self.push is not None else None,  # for `shoal status`
        }

    # --- clients (v2) -------------------------------------------------------------------------
    async def v2_client_list(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(self.introspection.client_ids()))

    async def v2_client_detail(self, request: web.Request, p: Params) -> web.Response:
        c = self.introspection.client_detail(p.required("clientId"))
        out: dict[str, Any] = {"clientId": c.client_id, "ephemeral": True, "lastUpdatedTime": c.last_updated_ms}
        if c.connection_based:
            out.update(clientType="connection", connectType="GRPC", appName=c.app, version=c.agent,
                       clientIp=c.client_ip, clientPort=c.client_port)
        else:
            out.update(clientType="ipport", clientIp=c.client_ip, clientPort=c.client_port)
        return v2_ok(dumps(out))

    async def v2_client_publications(self, request: web.Request, p: Params) -> web.Response:
        out = [{"namespace": key.namespace, "group": key.group, "serviceName": key.name,
                "registeredInstance": {"ip": i.ip, "port": i.port, "cluster": i.cluster}}
               for key, i in self.introspection.client_publications(p.required("clientId"))]
        return v2_ok(dumps(out))

    async def v2_client_subscriptions(self, request: web.Request, p: Params) -> web.Response:
        out = [{"namespace": key.namespace, "group": key.group, "serviceName": key.name,
                "subscriberInfo": {"app": s.app, "agent": s.agent, "addr": s.ip}}
               for key, s in self.introspection.client_subscriptions(p.required("clientId"))]
        return v2_ok(dumps(out))


# --- parameter shapes ------------------------------------------------------------------------
def instance_from(p: Params) -> tuple[InstanceInfo, bool]:
    """HttpRequestInstanceBuilder: the instance of a register request, and its ephemeral flag."""
    ip = p.required("ip")
    port = p.port()
    weight = p.number("weight", 1.0)
    inst = InstanceInfo(ip=ip, port=port, weight=weight, healthy=p.boolean("healthy", True),
                        enabled=bool(p.enabled(True)), cluster=p.cluster(), metadata=p.metadata() or {})
    return inst, p.boolean("ephemeral", True)


def beat_target(p: Params) -> tuple[str, int, InstanceInfo | None, bool]:
    """``(ip, port, beat instance or None, ephemeral)``: the ``beat`` JSON wins over ``ip``/``port``
    (InstanceController.beat); without it this is a light beat and both are required."""
    raw = p.text("beat")
    cluster = p.text("clusterName") or DEFAULT_CLUSTER
    if not raw:
        return p.required("ip"), p.port(), None, True
    try:
        beat = jsonfast.loads(raw)
    except ValueError:  # not JSON, or nested too deeply
        raise InvalidParam("Param 'beat' must be a JSON object.") from None
    if not isinstance(beat, dict):
        raise InvalidParam("Param 'beat' must be a JSON object.")
    ip = beat.get("ip")
    if not isinstance(ip, str) or not ip.strip():
        raise InvalidParam("Param 'beat.ip' is required.")
    port = beat.get("port")
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int):
        raise InvalidParam("Param 'beat.port' must be an integer.")
    weight = beat.get("weight", 1.0)
    if weight is None:
        weight = 1.0
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise InvalidParam("Param 'beat.weight' must be a number.")
    beat_cluster = beat.get("cluster")
    if beat_cluster is not None and not isinstance(beat_cluster, str):
        raise InvalidParam("Param 'beat.cluster' must be a string.")
    raw_ephemeral = beat.get("ephemeral", True)
    ephemeral = not (raw_ephemeral is False or (isinstance(raw_ephemeral, str) and raw_ephemeral.lower() == "false"))
    metadata = parse_metadata(beat.get("metadata"), "beat.metadata")
    ip = ip.strip()
    inst = InstanceInfo(ip=ip, port=port, weight=float(weight), cluster=(beat_cluster or "").strip() or cluster,
                        metadata=dict(metadata))
    return ip, port, inst, ephemeral


def persistent_write(p: Params) -> bool:
    """A write of a persistent instance (``ephemeral=false``): it goes to the CP store from
    whichever node takes it, so the DistroFilter does not forward it."""
    return p.text("ephemeral").strip().lower() == "false"


def distro_tag(p: Params) -> str:
    """The ``ip:port`` the DistroFilter routes a write by (the beat JSON's when present)."""
    ip = p.text("ip")
    if not ip and p.text("beat"):
        try:
            beat = jsonfast.loads(p.text("beat"))
        except ValueError:
            beat = None
        if isinstance(beat, dict):  # only scalars are formatted: str() of hostile nesting recurses
            beat_ip, beat_port = beat.get("ip", ""), beat.get("port", 0)
            beat_ip = beat_ip if isinstance(beat_ip, str) else ""
            return f"{beat_ip}:{beat_port if isinstance(beat_port, str | int) else 0}"
    return f"{ip}:{p.text('port') or '0'}"


def check_selector(p: Params) -> dict[str, Any] | None:
    """``selector`` must be JSON ``{"type": "none"|"label", ...}``; it is kept (in the service's
    CP document) and not applied (label selectors need Nacos's CMDB, which does not exist here)."""
    raw = p.text("selector")
    if not raw:
        return None
    try:
        selector = jsonfast.loads(raw)
    except ValueError:
        raise InvalidParam("Param 'selector' must be a JSON object.") from None
    kind = selector.get("type", "") if isinstance(selector, dict) else None
    if not isinstance(kind, str) or kind.lower() not in ("none", "label"):
        raise InvalidParam("Param 'selector' must be a JSON object with type 'none' or 'label'.")
    return normalise_selector(selector)  # a label expression parses as in Nacos (service_layer.selectors)


def detail_json(service: ServiceKey, inst: InstanceInfo, service_key: str) -> dict[str, Any]:
    return {service_key: service.grouped_name, "ip": inst.ip, "port": inst.port, "clusterName": inst.cluster,
            "weight": float(inst.weight), "healthy": inst.healthy, "instanceId": inst.instance_id,
            "metadata": dict(inst.metadata)}


def service_detail_json(service: ServiceKey, found: ServiceDescription | None, namespace_key: str) -> dict[str, Any]:
    """The v2 service detail (ServiceDetailInfo; v3 names the namespace ``namespaceId``);
    ServiceNotFound when the service does not exist."""
    if found is None:
        raise ServiceNotFound(_service_not_found(service))
    cluster_map = {c: {"clusterName": c, "healthChecker": dict(s.health_checker), "metadata": dict(s.metadata),
                       "healthyCheckPort": s.check_port, "useInstancePortForCheck": s.use_instance_port}
                   for c, s in found.clusters.items()}
    return {
        namespace_key: service.namespace, "serviceName": service.name, "groupName": service.group,
        "clusterMap": cluster_map, "metadata": found.detail.metadata,
        "protectThreshold": found.detail.protect_threshold, "selector": selector_json(found),
        "ephemeral": found.detail.ephemeral,
    }


def selector_json(found: ServiceDescription) -> dict[str, Any]:
    """The service's selector as Nacos shows it (type ``none`` when it has none)."""
    return dict(found.selector) if found.selector is not None else dict(_SELECTOR_NONE)


def _service_not_found(service: ServiceKey) -> str:
    return f"service not found, namespace: {service.namespace}, service: {service.grouped_name}"
