"""Console APIs (v1 ``catalog/*``, ``service/subscribers``, ``service/names``; v2
``catalog/instances`` and the per-service publisher and subscriber lists) and the console's
static files at ``/nacos/``.

Mirrors Nacos's CatalogController, ServiceController (``subscribers``, ``names``),
CatalogControllerV2 and ClientInfoControllerV2 (docs/protocol.md §5.2, the spec's §7.2/§7.3):
parameters are parsed here, the reads are :class:`shoal.service_layer.catalog.CatalogService`'s,
and the answers keep Nacos's shapes. Shoal adds, without changing those shapes: a
``subscriberCount`` and ``enabledInstanceCount`` on each service-list row, the
``unhealthyOnly`` filter (services with an instance that is unhealthy or disabled), and
``clusterName`` / ``owner`` on each publisher-list row.

The console itself (``/nacos/``) is plain HTML, CSS and one vanilla JS module shipped as
package data under ``shoal/console/static`` and read once (off the loop) on first request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sized
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from shoal import __version__, kernels
from shoal.auth.service import READ
from shoal.config import Config
from shoal.errors import NacosError, NotFound
from shoal.model.keys import ServiceKey
from shoal.service_layer import NamingService
from shoal.service_layer.catalog import (
    PublisherRow,
    PushFigures,
    ServiceInstances,
    ServiceSummary,
    SubscriberRow,
    check_page,
    page_slice,
)
from shoal.tasks import run_blocking
from shoal.transport.http.api import Api, dumps, json_text, v2_ok
from shoal.transport.http.params import Params
from shoal.transport.http.routes import ADMIN, Route
from shoal.transport.selection import transport_name

if TYPE_CHECKING:
    from shoal.distro.protocol import DistroProtocol, MemberFigures

_SELECTOR_NONE = {"type": "none", "contextType": "NONE"}
_HEALTH_CHECKER = {"type": "TCP"}

#: The console's files: name → content type. Nothing else under /nacos/console/ is served.
STATIC_FILES = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}


def service_view_json(s: ServiceSummary) -> dict[str, Any]:
    """Nacos's ServiceView of a service-list row (the v3 admin list answers exactly this)."""
    return {"name": s.service.name, "groupName": s.service.group, "clusterCount": s.cluster_count,
            "ipCount": s.ip_count, "healthyInstanceCount": s.healthy_count,
            "triggerFlag": "true" if s.threshold_triggered else "false"}


def summary_json(s: ServiceSummary) -> dict[str, Any]:
    """A console service-list row: Nacos's ServiceView, plus Shoal's subscriber and enabled counts."""
    return {**service_view_json(s), "enabledInstanceCount": s.enabled_count, "subscriberCount": s.subscriber_count}


def instances_json(found: ServiceInstances) -> list[dict[str, Any]]:
    return [i.to_nacos(found.service, found.ephemeral) for i in found.instances]


def subscriber_json(row: SubscriberRow) -> dict[str, Any]:
    """Nacos's Subscriber: gRPC subscribers carry the client's ip and port 0 (addrStr = ip);
    Shoal adds ``clientId`` and ``pushLag`` (:func:`push_lag_json`)."""
    s = row.subscriber
    return {"addrStr": s.ip, "agent": s.agent, "app": s.app, "ip": s.ip, "port": 0,
            "namespaceId": s.service.namespace, "serviceName": s.service.grouped_name, "cluster": s.clusters,
            "clientId": row.client_id, "pushLag": push_lag_json(row)}


def push_lag_json(row: SubscriberRow) -> dict[str, Any]:
    """The subscriber's push lag (docs/protocol.md §3.8): change → ack of its last ack and p99
    of its recent ones (ms, null before the first), how many acks that p99 covers, services
    with an unacked change on its connection, and how long this service's change has waited."""
    lag = row.push
    if lag is None:
        return {"lastMs": None, "p99Ms": None, "acks": 0, "pending": 0, "pendingForMs": 0}
    return {"lastMs": lag.last_ms, "p99Ms": lag.p99_ms, "acks": lag.acks, "pending": lag.pending,
            "pendingForMs": lag.pending_for_ms}


def detail_info_json(found: ServiceInstances, metadata: dict[str, str]) -> dict[str, Any]:
    """Nacos's ServiceDetailInfo (``withInstances=true``): instances grouped by cluster."""
    cluster_map: dict[str, dict[str, Any]] = {}
    for inst in found.instances:
        cluster = cluster_map.setdefault(inst.cluster, {
            "serviceName": found.service.name, "clusterName": inst.cluster, "healthChecker": _HEALTH_CHECKER,
            "metadata": {}, "hosts": []})
        cluster["hosts"].append({"ip": inst.ip, "port": inst.port, "weight": float(inst.weight),
                                 "valid": inst.healthy, "healthy": inst.healthy, "enabled": inst.enabled,
                                 "marked": not found.ephemeral, "instanceId": inst.instance_id,
                                 "metadata": dict(inst.metadata)})
    return {"serviceName": found.service.name, "groupName": found.service.group, "metadata": metadata,
            "clusterMap": cluster_map}


class ConsoleRoutes:
    """The console API handlers and the console's static files."""

    def __init__(self, naming: NamingService, push: PushFigures | None = None) -> None:
        self.catalog = naming.catalog
        self.push = push  # the push engine: each subscriber's push lag, services withholding an empty push
        self._files: dict[str, bytes] | None = None
        self._files_lock = asyncio.Lock()

    def routes(self) -> list[Route]:
        """The console's APIs, and its pages: public files (the login happens in the page, as in Nacos)."""
        return [
            Route("GET", "/nacos/v1/ns/catalog/services", self.v1_catalog_services, READ, api=Api.V1),
            Route("GET", "/nacos/v1/ns/catalog/instances", self.v1_catalog_instances, READ, api=Api.V1),
            Route("GET", "/nacos/v1/ns/catalog/service", self.v1_catalog_service, READ, api=Api.V1),
            Route("GET", "/nacos/v1/ns/service/subscribers", self.v1_service_subscribers, READ, api=Api.V1),
            Route("GET", "/nacos/v1/ns/service/names", self.v1_service_names, READ, api=Api.V1),
            Route("GET", "/nacos/v2/ns/catalog/instances", self.v2_catalog_instances, READ, api=Api.V2),
            Route("GET", "/nacos/v2/ns/client/service/publisher/list", self.v2_service_publishers, READ, api=Api.V2),
            Route("GET", "/nacos/v2/ns/client/service/subscriber/list", self.v2_service_subscribers, READ,
                  api=Api.V2),
            Route("GET", "/nacos", self.redirect, api=Api.V1),
            Route("GET", "/nacos/", self.index, api=Api.V1),
            Route("GET", "/nacos/index.html", self.index, api=Api.V1),
            Route("GET", "/nacos/console/{name}", self.static, api=Api.V1),
        ]

    # --- v1 catalog ---------------------------------------------------------------------------
    async def v1_catalog_services(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/ns/catalog/services: a page of ServiceView rows, or with ``withInstances``
        a page of ServiceDetailInfo (a bare list, as Nacos answers it)."""
        namespace = p.namespace()
        name_part, group_part = p.text("serviceNameParam"), p.text("groupNameParam")
        page_no, page_size = p.page_no(), p.integer("pageSize", 10)
        if p.boolean("withInstances", False):
            _count, rows = self.catalog.list_service_details(namespace, name_part, group_part, page_no, page_size)
            return json_text(dumps([detail_info_json(found, dict(record.metadata)) for record, found in rows]))
        page = self.catalog.list_services(namespace, name_part, group_part, page_no, page_size,
                                          has_ip_count=p.boolean("hasIpCount", False),
                                          unhealthy_only=p.boolean("unhealthyOnly", False))
        return json_text(dumps({"count": page.count, "serviceList": [summary_json(s) for s in page.services]}))

    async def v1_catalog_instances(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/ns/catalog/instances: ``{"list":[Instance],"count":N}`` (pageNo, pageSize required)."""
        service = p.v1_service()
        page_no, page_size = p.page_no(default=None), p.integer("pageSize")
        check_page(page_no, page_size)
        found = self.catalog.instances(service, p.text("clusterName"))
        rows = instances_json(found)
        return json_text(dumps({"list": page_slice(rows, page_no, page_size), "count": len(rows)}))

    async def v1_catalog_service(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/ns/catalog/service: the service object and its clusters (404 if missing)."""
        service = p.v1_service()
        record, clusters = self.catalog.service(service)
        out = {
            "service": {"name": service.name, "groupName": service.group,
                        "protectThreshold": float(record.protect_threshold), "selector": _SELECTOR_NONE,
                        "metadata": dict(record.metadata), "ephemeral": record.ephemeral,
                        "emptyPushProtected": self.push is not None and service in self.push.protected_services()},
            "clusters": [{"serviceName": service.grouped_name, "name": c, "healthChecker": _HEALTH_CHECKER,
                          "defaultPort": 80, "defaultCheckPort": 80, "useIPPort4Check": True, "metadata": {}}
                         for c in clusters],
        }
        return json_text(dumps(out))

    # --- v1 service ---------------------------------------------------------------------------
    async def v1_service_subscribers(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/ns/service/subscribers: ``{"subscribers":[...],"count":N}``, paged (1, 1000).
        ``aggregation`` is accepted; subscriptions live on the node the subscriber is connected
        to, and this node answers its own."""
        service = p.v1_service()
        page_no, page_size = p.page_no(), p.integer("pageSize", 1000)
        p.boolean("aggregation", True)
        check_page(page_no, page_size)
        rows = self.catalog.subscribers(service, self.push)
        return json_text(dumps({"subscribers": [subscriber_json(r) for r in page_slice(rows, page_no, page_size)],
                                "count": len(rows)}))

    async def v1_service_names(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/ns/service/names: ``group@@name`` by namespace under Nacos's (odd but real)
        key ``META-INF/services``, and the total count."""
        found = self.catalog.search_names(p.text("namespaceId"), p.text("expr"))
        return json_text(dumps({"META-INF/services": found, "count": sum(len(v) for v in found.values())}))

    # --- v2 -----------------------------------------------------------------------------------
    async def v2_catalog_instances(self, request: web.Request, p: Params) -> web.Response:
        """GET /v2/ns/catalog/instances: every Instance of the service (of ``clusterName`` when given)."""
        found = self.catalog.instances(p.v2_service(), p.text("clusterName"))
        return v2_ok(dumps(instances_json(found)))

    async def v2_service_publishers(self, request: web.Request, p: Params) -> web.Response:
        """GET /v2/ns/client/service/publisher/list: ``[{"clientId","ip","port"}]``, optionally
        filtered by ``ip`` and ``port``. Shoal adds ``clusterName`` and ``owner``: the node that
        replicated the client here, or "" when this node holds it (the console's owner column)."""
        service = self._existing(p.v2_service())
        ip, port = p.text("ip"), p.integer("port", 0)
        rows: list[PublisherRow] = [r for r in self.catalog.publishers(service)
                                    if (not ip or r.instance.ip == ip) and (not port or r.instance.port == port)]
        return v2_ok(dumps([{"clientId": r.client_id, "ip": r.instance.ip, "port": r.instance.port,
                             "clusterName": r.instance.cluster, "owner": r.owner} for r in rows]))

    async def v2_service_subscribers(self, request: web.Request, p: Params) -> web.Response:
        """GET /v2/ns/client/service/subscriber/list: ``[{"clientId","ip","port"}]``, and Shoal's
        ``pushLag``."""
        service = self._existing(p.v2_service())
        ip = p.text("ip")
        rows = [r for r in self.catalog.subscribers(service, self.push) if not ip or r.subscriber.ip == ip]
        return v2_ok(dumps([{"clientId": r.client_id, "ip": r.subscriber.ip, "port": 0,
                             "pushLag": push_lag_json(r)} for r in rows]))

    def _existing(self, service: ServiceKey) -> ServiceKey:
        self.catalog.service(service)  # 404 / 20004 when missing
        return service

    # --- the console's files ---------------------------------------------------------------------
    async def _load_files(self) -> dict[str, bytes]:
        async with self._files_lock:
            if self._files is None:
                self._files = await run_blocking(_read_static)
            return self._files

    async def index(self, request: web.Request, p: Params) -> web.StreamResponse:
        return await self._serve("index.html")

    async def redirect(self, request: web.Request, p: Params) -> web.StreamResponse:
        raise web.HTTPFound("/nacos/")

    async def static(self, request: web.Request, p: Params) -> web.StreamResponse:
        return await self._serve(request.match_info.get("name", ""))

    async def _serve(self, name: str) -> web.StreamResponse:
        if name not in STATIC_FILES:
            raise NotFound(f"no console file {name}")
        files = await self._load_files()
        return web.Response(body=files[name], content_type=STATIC_FILES[name], charset="utf-8",
                            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


#: Settings whose values are secrets: shown as set / not set, never as their value.
_SECRET_PROPERTY = re.compile(r"password|secret|identity\.value|private[-.]key", re.IGNORECASE)
#: Settings the cluster page always lists (Distro and membership), changed or not.
_CLUSTER_PROPERTY = re.compile(r"distro|\.member\.|member\.fail|cluster\.port", re.IGNORECASE)


def settings_in_effect(config: Config) -> list[dict[str, Any]]:
    """The node's settings the cluster page lists: every Distro / membership setting and every
    other setting that differs from its default, as ``{property, value, default, changed}``;
    secrets are masked."""
    defaults = {prop: value for prop, value, _doc in Config().describe()}
    out: list[dict[str, Any]] = []
    for prop, value, doc in config.describe():
        default = defaults.get(prop)
        changed = value != default
        if not changed and not _CLUSTER_PROPERTY.search(prop):
            continue
        if _SECRET_PROPERTY.search(prop):
            value = "(set)" if value else "(not set)"
            default = "(not set)"
        out.append({"property": prop, "value": _plain(value), "default": _plain(default), "changed": changed,
                    "doc": doc})
    return out


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _stamp(pair: tuple[int, str] | None) -> dict[str, Any] | None:
    return None if pair is None else {"time": pair[0], "reason": pair[1]}


def member_figures_json(f: MemberFigures) -> dict[str, Any]:
    """One row of the cluster page's member table (times are wall-clock epoch ms)."""
    verify = f.last_verify
    return {
        "address": f.address, "state": f.state, "self": f.is_self, "failAccessCnt": f.fail_count,
        "lastSeen": f.last_seen_ms or None, "clientsOwned": f.clients_owned, "syncQueue": f.sync_queue,
        "needsFullVerify": f.needs_full_verify, "syncBatchesSent": f.sent_batches,
        "syncBatchesFailed": f.failed_batches, "lastSync": f.last_sync_ms,
        "lastSyncFailure": _stamp(f.last_sync_failure),
        "lastVerify": None if verify is None else {
            "time": verify.time_ms, "result": verify.result, "detail": verify.detail,
            "mismatchedBuckets": verify.mismatched, "resynced": verify.resynced},
        "lastFailure": _stamp(f.last_failure),
    }


class ClusterFiguresRoutes:
    """``GET /nacos/v1/console/cluster/distro``: every member with its Distro figures as this node
    sees it (:meth:`DistroProtocol.member_figures`), this node's verify counters, and the node's
    settings in effect, transport and kernel implementations. A standalone node lists itself."""

    def __init__(self, config: Config, distro: DistroProtocol | None, clients_held: Sized | None = None) -> None:
        self.config = config
        self.distro = distro
        self.clients_held = clients_held  # the node's clients (a standalone node owns them all)

    def routes(self) -> list[Route]:
        return [Route("GET", "/nacos/v1/console/cluster/distro", self.distro_figures, ADMIN, api=Api.V1)]

    async def distro_figures(self, request: web.Request, p: Params) -> web.Response:
        node = {"version": f"shoal-{__version__}", "transport": transport_name(self.config),
                "kernels": dict(sorted(kernels.implementation().items())),
                "settings": settings_in_effect(self.config)}
        distro = self.distro
        if distro is None:
            address = f"{self.config.self_address or self.config.host}:{self.config.port}"
            held = len(self.clients_held) if self.clients_held is not None else 0
            return json_text(dumps({
                "self": address, "standalone": True, "loaded": True, "node": node,
                "members": [{"address": address, "state": "UP", "self": True, "failAccessCnt": 0,
                             "lastSeen": None, "clientsOwned": held, "syncQueue": None,
                             "needsFullVerify": None, "syncBatchesSent": None, "syncBatchesFailed": None,
                             "lastSync": None, "lastSyncFailure": None, "lastVerify": None, "lastFailure": None}],
                "verify": None}))
        stats = distro.verify_stats
        return json_text(dumps({
            "self": distro.members.self_address, "standalone": False, "loaded": distro.loaded, "node": node,
            "members": [member_figures_json(f) for f in distro.member_figures()],
            "verify": {"rounds": stats.rounds, "requests": stats.requests, "bytes": stats.bytes_sent,
                       "repairs": stats.resynced}}))


def _read_static() -> dict[str, bytes]:
    """The console's files from the package data (blocking: reads files)."""
    root = resources.files("shoal.console").joinpath("static")
    out: dict[str, bytes] = {}
    for name in STATIC_FILES:
        try:
            out[name] = root.joinpath(name).read_bytes()
        except OSError as exc:
            raise NacosError(f"console file {name} is missing from the package: {exc}") from None
    return out
