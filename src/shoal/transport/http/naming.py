"""Naming Open API handlers, v1 (``/nacos/v1/ns``) and v2 (``/nacos/v2/ns``).

Mirrors Nacos's InstanceController / InstanceControllerV2, ServiceController /
ServiceControllerV2, OperatorController (metrics; switches are in operator.py) and ClientInfoControllerV2
(docs/protocol.md §5.2) on top of
the transport-neutral service layer, so an HTTP registration is an ip:port client of the same
model as the gRPC clients (each sees the other's instances, and both are pushed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shoal import jsonfast
from shoal.config import Config
from shoal.errors import InvalidParam, ServiceNotFound, UnknownService
from shoal.model.instance import InstanceInfo
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.service_layer import PERSISTENT_UNSUPPORTED, NamingService, check_port, parse_metadata
from shoal.service_layer.persistent import ClusterSettings, PersistentNaming, instance_name
from shoal.transport.http.api import dumps, json_text, ok_text, v2_ok
from shoal.transport.http.params import Params

Handler = Callable[[web.Request, Params], Any]
#: Forwarder.forward: the owner's answer, or None when this node is to handle the request itself.
Forward = Callable[[web.Request, str, str], Awaitable[web.Response | None]]
_SELECTOR_NONE = {"type": "none", "contextType": "NONE"}


class NamingRoutes:
    """The naming endpoints; each handler takes the request and its parsed parameters."""

    def __init__(self, config: Config, naming: NamingService, is_serving: Callable[[], bool],
                 owner_of: Callable[[str], str | None], forward: Forward | None = None) -> None:
        self.config = config
        self.naming = naming
        self.is_serving = is_serving
        self.owner_of = owner_of  # Responsibility.owner_of: None = this node handles the ip:port
        self.forward = forward
        self.persistent: PersistentNaming | None = None  # the CP use cases, when the node has a store

    def _cp(self) -> PersistentNaming:
        if self.persistent is None:
            raise InvalidParam(PERSISTENT_UNSUPPORTED)
        return self.persistent

    async def _register(self, service: ServiceKey, p: Params) -> None:
        inst, ephemeral = instance_from(p)
        if ephemeral:
            self.naming.register_ip_port(service, inst, ephemeral)
        else:
            await self._cp().register(service, inst)

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
        if ephemeral:
            self.naming.deregister_ip_port(service, ip, port, ephemeral)
        else:
            await self._cp().deregister(service, ip, port, p.cluster())

    async def _at_publisher(self, request: web.Request, service: ServiceKey, p: Params) -> web.Response | None:
        """An edit of an ephemeral instance goes to the node holding its publisher's authoritative
        copy: a connection client's node, whatever the ip:port hashes to (the routes are not
        forwarded by ip:port up front for that reason), else the node responsible for the
        ip:port. The owner's answer, or None when the edit is to be applied here."""
        if self.forward is None or persistent_write(p):
            return None
        tag = distro_tag(p)
        owner = self.naming.edited_at(service, p.required("ip"), p.port(), p.cluster())
        if owner is None:  # no publisher known here: the ip:port's responsible node, as other writes
            owner = self.owner_of(tag)
        return await self.forward(request, owner, tag) if owner else None

    async def v1_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        if (answer := await self._at_publisher(request, service, p)) is not None:
            return answer
        await self._update(service, p)
        return ok_text()

    async def v2_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        if (answer := await self._at_publisher(request, service, p)) is not None:
            return answer
        await self._update(service, p)
        return v2_ok('"ok"')

    async def _update(self, service: ServiceKey, p: Params) -> None:
        """PUT: weight, enabled and metadata as given (defaults 1.0 / true / none)."""
        ip, port, ephemeral = p.required("ip"), p.port(), p.boolean("ephemeral", True)
        if not ephemeral:
            await self._cp().update(service, ip, port, p.cluster(), weight=p.weight(1.0), enabled=p.enabled(True),
                                    metadata=p.metadata())
            return
        self.naming.update_instance(service, ip, port, p.cluster(), weight=p.weight(1.0), enabled=p.enabled(True),
                                    metadata=p.metadata(), ephemeral=ephemeral)

    async def v1_patch(self, request: web.Request, p: Params) -> web.Response:
        """PATCH: only the given fields change."""
        service = p.v1_service()
        ip, port = p.required("ip"), p.port()
        p.boolean("healthy", True)  # accepted (and checked) like Nacos; health is the beat's business
        if self.persistent is not None and self.persistent.instances.get(
                instance_name(service, p.cluster(), ip, port)) is not None:
            await self.persistent.update(service, ip, port, p.cluster(), weight=p.weight(None),
                                         enabled=p.enabled(None), metadata=p.metadata())
            return ok_text()
        if (answer := await self._at_publisher(request, service, p)) is not None:
            return answer
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
        check_port(p.integer("udpPort", 0), "udpPort")  # UDP push to 1.x clients is not offered; checked
        info = self.naming.query(service, p.text("clusters"), p.boolean("healthyOnly", False), grouped_name=True)
        return json_text(info)

    async def v2_list(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        check_port(p.integer("udpPort", 0), "udpPort")
        info = self.naming.query(service, p.text("clusterName"), p.boolean("healthyOnly", False), grouped_name=True)
        return v2_ok(info)

    async def beat(self, request: web.Request, p: Params) -> web.Response:
        """PUT /instance/beat (v1 and v2 alike: a bare object, no envelope)."""
        service = p.v1_service()
        ip, port, beat, ephemeral = beat_target(p)
        code, interval = self.naming.beat(service, ip, port, beat, ephemeral)
        return json_text(f'{{"clientBeatInterval":{interval},"code":{code},"lightBeatEnabled":true}}')

    # --- services ----------------------------------------------------------------------------
    async def v1_service_create(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        selector = check_selector(p)
        # Nacos 1.x/2.x: a service created through this API is persistent (docs/protocol.md §5.2).
        await self._create_service(service, p.number("protectThreshold", 0.0), p.metadata() or {}, False, selector)
        return ok_text()

    async def _create_service(self, service: ServiceKey, threshold: float, metadata: dict[str, str],
                              ephemeral: bool, selector: dict[str, Any] | None) -> None:
        if self.persistent is not None:
            await self.persistent.create_service(service, threshold, metadata, ephemeral, selector)
        else:
            self.naming.create_service(service, threshold, metadata, ephemeral=ephemeral)

    async def _update_service(self, service: ServiceKey, threshold: float | None, metadata: dict[str, str] | None,
                              selector: dict[str, Any] | None) -> None:
        if self.persistent is not None:
            await self.persistent.update_service(service, threshold, metadata, selector)
        else:
            self.naming.update_service(service, threshold, metadata)

    async def _delete_service(self, service: ServiceKey) -> None:
        if self.persistent is not None:
            await self.persistent.delete_service(service)
        else:
            self.naming.delete_service(service)

    async def v2_service_create(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        selector = check_selector(p)
        await self._create_service(service, p.number("protectThreshold", 0.0), p.metadata() or {},
                                   p.boolean("ephemeral", False), selector)
        return v2_ok('"ok"')

    async def v1_service_delete(self, request: web.Request, p: Params) -> web.Response:
        await self._delete_service(p.v1_service())
        return ok_text()

    async def v2_service_delete(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        if not self.naming.service_exists(service):  # v2 words a missing service its own way
            raise UnknownService(_service_not_found(service))
        await self._delete_service(service)
        return v2_ok('"ok"')

    async def v1_service_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        selector = check_selector(p)
        await self._update_service(service, p.number("protectThreshold"), p.metadata(), selector)
        return ok_text()

    async def v2_service_update(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        selector = check_selector(p)
        await self._update_service(service, p.number("protectThreshold", 0.0), p.metadata() or {}, selector)
        return v2_ok('"ok"')

    async def v1_service_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v1_service()
        detail = self.naming.service_detail(service)
        if detail is None:
            raise UnknownService(f"service not found, namespace: {service.namespace}, serviceName: {service.name}")
        clusters = []
        for c in self._cluster_names(service, detail.clusters):
            settings = self._cluster_settings(service, c)
            clusters.append({"name": c, "healthChecker": dict(settings.health_checker),
                             "metadata": dict(settings.metadata), "defaultCheckPort": settings.check_port,
                             "useIPPort4Check": settings.use_instance_port})
        return json_text(dumps({
            "namespaceId": service.namespace, "groupName": service.group, "name": service.name,
            "protectThreshold": detail.protect_threshold, "metadata": detail.metadata,
            "selector": self._selector(service), "clusters": clusters,
        }))

    def _cluster_names(self, service: ServiceKey, clusters: list[str]) -> list[str]:
        doc = self.persistent.service_doc(service) if self.persistent is not None else None
        configured = doc.get("clusters") if doc is not None else None
        return sorted(set(clusters) | set(configured if isinstance(configured, dict) else ()))

    def _cluster_settings(self, service: ServiceKey, cluster: str) -> ClusterSettings:
        return self.persistent.cluster_settings(service, cluster) if self.persistent is not None else ClusterSettings()

    def _selector(self, service: ServiceKey) -> dict[str, Any]:
        doc = self.persistent.service_doc(service) if self.persistent is not None else None
        selector = doc.get("selector") if doc is not None else None
        return dict(selector) if isinstance(selector, dict) and selector.get("type") not in (None, "none") \
            else dict(_SELECTOR_NONE)

    async def v1_health_update(self, request: web.Request, p: Params) -> web.Response:
        """PUT /nacos/v1/ns/health[/instance] (HealthController.update): set a persistent
        instance's health by hand (``healthy``, or the 1.x ``valid``); the next server-side check
        may flip it back unless the cluster's checker is NONE."""
        service = p.v1_service()
        raw = p.text("healthy") or p.text("valid")
        if not raw:
            raise InvalidParam("Param 'healthy' is required.")
        healthy = p.boolean("healthy" if p.text("healthy") else "valid", True)
        await self._cp().update(service, p.required("ip"), p.port(), p.cluster(), weight=None, enabled=None,
                                metadata=None, healthy=healthy)
        return ok_text()

    async def v1_cluster_update(self, request: web.Request, p: Params) -> web.Response:
        """PUT /nacos/v1/ns/cluster (ClusterController.update): a cluster's health checker
        (JSON ``{"type":"TCP"|"HTTP"|"NONE","path":..,"headers":..,"expectedResponseCode":..}``),
        ``checkPort``, ``useInstancePort4Check`` and metadata, kept in the service's CP document."""
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
        await self._cp().update_cluster(service, cluster, settings)
        return ok_text()

    async def v2_service_detail(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        detail = self.naming.service_detail(service)
        if detail is None:
            raise ServiceNotFound(_service_not_found(service))
        cluster_map = {}
        for c in self._cluster_names(service, detail.clusters):
            settings = self._cluster_settings(service, c)
            cluster_map[c] = {"clusterName": c, "healthChecker": dict(settings.health_checker),
                              "metadata": dict(settings.metadata), "healthyCheckPort": settings.check_port,
                              "useInstancePortForCheck": settings.use_instance_port}
        return v2_ok(dumps({
            "namespace": service.namespace, "serviceName": service.name, "groupName": service.group,
            "clusterMap": cluster_map, "metadata": detail.metadata, "protectThreshold": detail.protect_threshold,
            "selector": self._selector(service), "ephemeral": detail.ephemeral,
        }))

    async def v1_service_list(self, request: web.Request, p: Params) -> web.Response:
        page = self.naming.list_services(p.namespace(), p.text("groupName") or "DEFAULT_GROUP",
                                         p.integer("pageNo", None, 1), p.integer("pageSize", None, 1))
        return json_text(dumps({"count": page.count, "doms": page.names}))

    async def v2_service_list(self, request: web.Request, p: Params) -> web.Response:
        page = self.naming.list_services(p.namespace(), p.text("groupName") or "DEFAULT_GROUP",
                                         p.integer("pageNo", 1, 1), p.integer("pageSize", 20, 1, 500))
        return v2_ok(dumps({"count": page.count, "services": page.names}))

    # --- operator ----------------------------------------------------------------------------
    async def v1_metrics(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(await self._metrics(p)))

    async def v2_metrics(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(await self._metrics(p)))

    async def _metrics(self, p: Params) -> dict[str, Any]:
        status = "UP" if self.is_serving() else "STARTING"
        if p.boolean("onlyStatus", True):
            return {"status": status}
        m = await self.naming.operator_metrics(self.owner_of)
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
        }

    # --- clients (v2) -------------------------------------------------------------------------
    async def v2_client_list(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(self.naming.client_ids()))

    async def v2_client_detail(self, request: web.Request, p: Params) -> web.Response:
        c = self.naming.client_detail(p.required("clientId"))
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
               for key, i in self.naming.client_publications(p.required("clientId"))]
        return v2_ok(dumps(out))

    async def v2_client_subscriptions(self, request: web.Request, p: Params) -> web.Response:
        out = [{"namespace": key.namespace, "group": key.group, "serviceName": key.name,
                "subscriberInfo": {"app": s.app, "agent": s.agent, "addr": s.ip}}
               for key, s in self.naming.client_subscriptions(p.required("clientId"))]
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
    return dict(selector)


def detail_json(service: ServiceKey, inst: InstanceInfo, service_key: str) -> dict[str, Any]:
    return {service_key: service.grouped_name, "ip": inst.ip, "port": inst.port, "clusterName": inst.cluster,
            "weight": float(inst.weight), "healthy": inst.healthy, "instanceId": inst.instance_id,
            "metadata": dict(inst.metadata)}


def _service_not_found(service: ServiceKey) -> str:
    return f"service not found, namespace: {service.namespace}, service: {service.grouped_name}"
