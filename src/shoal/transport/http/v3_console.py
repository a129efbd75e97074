"""The Nacos 3.x console API, ``/nacos/v3/console`` (docs/protocol.md §5.7), and the 3.x form of
the namespace reads.

Nacos 3.x moved its console's backend from ``/v1/console`` and the v1/v2 catalog routes to
``/v3/console/*`` (ConsoleHealthController, ConsoleServerStateController, ConsoleClusterController,
ConsoleNamespaceController, ConsoleServiceController, ConsoleInstanceController). Every answer is
a ``Result`` except ``server/state`` (the bare state map); errors are the v2 ``ErrorCode``s
(:data:`Api.V2`). The console's pages are PageForm-validated: ``pageNo`` and ``pageSize`` below 1
are 400 / 20002 there (unlike the v1/v2 lists, which clamp).

The handlers call the service-layer use cases (NamingService, PersistentNaming, CatalogService,
NamespaceService) or hand the request to the handler that owns the same use case and keep its
answer as is; no answer is parsed again here. The console's config and AI pages are
:mod:`~shoal.transport.http.disabled_modules`'.

:class:`V3Namespaces` answers the namespace list and detail in Nacos 3.x's form (public as
``{"namespace":"public","namespaceShowName":"public","namespaceDesc":"Default Namespace"}``) for
both ``/v3/console/core/namespace`` and ``/v3/admin/core/namespace``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from shoal.auth.service import READ, WRITE
from shoal.errors import InvalidParam, MissingParam, V2Code
from shoal.model.keys import ServiceKey
from shoal.service_layer.namespaces import NamespaceService
from shoal.transport.http.api import dumps, json_text, v2_ok
from shoal.transport.http.naming import NamingRoutes, service_detail_json
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Handler, Route
from shoal.transport.http.v3 import failure
from shoal.transport.http.v3_naming import V3NamingRoutes

BASE = "/nacos/v3/console"
HEALTH = BASE + "/health"
SERVER = BASE + "/server"
NAMESPACE = BASE + "/core/namespace"
SERVICE = BASE + "/ns/service"
INSTANCE = BASE + "/ns/instance"

#: ConsoleServerStateController's SupportedLanguage.
LANGUAGES = ("zh-CN", "en-US")


class V3Namespaces:
    """Namespace reads in Nacos 3.x's form (public is ``public``), and the console's writes."""

    def __init__(self, namespaces: NamespaceService) -> None:
        self.namespaces = namespaces

    async def list(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self.namespaces.list(v3=True)))

    async def get(self, request: web.Request, p: Params) -> web.StreamResponse:
        namespace_id = p.get("namespaceId")
        if namespace_id is None:
            raise MissingParam("namespaceId")
        return v2_ok(dumps(self.namespaces.get(namespace_id, v3=True)))

    async def create(self, request: web.Request, p: Params) -> web.StreamResponse:
        """CreateNamespaceForm: ``customNamespaceId`` (blank: a UUID), ``namespaceName``*, ``namespaceDesc``."""
        await self.namespaces.create(p.get("customNamespaceId"), p.get("namespaceName"), p.get("namespaceDesc"))
        return v2_ok("true")

    async def edit(self, request: web.Request, p: Params) -> web.StreamResponse:
        """NamespaceForm: ``namespaceId``*, ``namespaceName``*, ``namespaceDesc``."""
        await self.namespaces.edit(p.required("namespaceId"), p.get("namespaceName"), p.get("namespaceDesc"))
        return v2_ok("true")

    async def delete(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.namespaces.delete(p.required("namespaceId"))
        return v2_ok("true")

    async def exist(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``Result<Boolean>``: whether ``customNamespaceId`` is taken (blank: false, public: true)."""
        if p.get("customNamespaceId") is None:
            raise MissingParam("customNamespaceId")
        return v2_ok("true" if self.namespaces.exists(p.text("customNamespaceId")) else "false")


@dataclass(frozen=True)
class NodeViews:
    """What the console's health, state and cluster pages read from the node."""

    state: Handler  # the bare server-state map (ServerStateController)
    members: Callable[[], list[dict[str, Any]]]  # every member's Member JSON
    readiness_problem: Callable[[], str | None]  # None when ready


class V3ConsoleRoutes:
    """The ``/nacos/v3/console`` naming, namespace, core and health routes."""

    def __init__(self, naming: NamingRoutes, v3_naming: V3NamingRoutes, namespaces: NamespaceService,
                 node: NodeViews) -> None:
        self.naming = naming
        self.v3_naming = v3_naming
        self.namespaces = V3Namespaces(namespaces)
        self.node = node

    def routes(self, admin: str, identity: str) -> list[Route]:
        """The route table: health and state open; namespace reads need a login, writes and the
        member list an admin; naming reads and writes READ / WRITE on the service (CONSOLE_API)."""
        n, v, ns = self.naming, self.v3_naming, self.namespaces
        return [
            Route("GET", HEALTH + "/liveness", self.liveness),
            Route("GET", HEALTH + "/readiness", self.readiness),
            Route("GET", SERVER + "/state", self.node.state),
            Route("GET", SERVER + "/announcement", self.announcement),
            Route("GET", SERVER + "/guide", self.guide),
            Route("GET", BASE + "/core/cluster/nodes", self.nodes, admin),
            Route("GET", NAMESPACE + "/list", ns.list, identity),
            Route("GET", NAMESPACE, ns.get, identity),
            Route("POST", NAMESPACE, ns.create, admin),
            Route("PUT", NAMESPACE, ns.edit, admin),
            Route("DELETE", NAMESPACE, ns.delete, admin),
            Route("GET", NAMESPACE + "/exist", ns.exist, identity),
            Route("POST", SERVICE, n.v2_service_create, WRITE),
            Route("DELETE", SERVICE, n.v2_service_delete, WRITE),
            Route("PUT", SERVICE, n.v2_service_update, WRITE),
            Route("GET", SERVICE, self.service_detail, READ),
            Route("GET", SERVICE + "/list", v.services, READ),
            Route("GET", SERVICE + "/subscribers", v.service_subscribers, READ),
            Route("GET", SERVICE + "/selector/types", v.selector_types, identity),
            Route("PUT", SERVICE + "/cluster", answered_ok(n.v1_cluster_update), WRITE),
            Route("GET", INSTANCE + "/list", self.instances, READ),
            Route("PUT", INSTANCE, self.update_instance, WRITE, distro=True),
        ]

    # --- health, state, cluster ---------------------------------------------------------------
    async def liveness(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok('"ok"')

    async def readiness(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``"ok"``; not ready: HTTP 500 with ``Result.failure`` (code 30000, the reason)."""
        problem = self.node.readiness_problem()
        if problem is None:
            return v2_ok('"ok"')
        return json_text(dumps({"code": int(V2Code.SERVER_ERROR), "message": problem, "data": None}), 500)

    async def announcement(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The console's announcement in ``language`` (zh-CN): Shoal ships none (data null);
        another language is ``Result.failure`` as in Nacos."""
        language = p.text("language", "zh-CN")
        if language not in LANGUAGES:
            return failure(V2Code.SERVER_ERROR, f"Unsupported language: {language}")
        return v2_ok("null")

    async def guide(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The console's UI guide (Nacos fetches it from its website): none here, data null."""
        return v2_ok("null")

    async def nodes(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Every member (Nacos's ClusterInnerHandler lists all of them; ``keyword`` is accepted
        and, as there, not applied)."""
        return v2_ok(dumps(self.node.members()))

    # --- naming -------------------------------------------------------------------------------
    async def service_detail(self, request: web.Request, p: Params) -> web.StreamResponse:
        """ServiceDetailInfo; an unknown service is 404 / 21008."""
        service = p.v2_service()
        return v2_ok(dumps(service_detail_info(self.naming, service)))

    async def instances(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A Page of every Instance of the service (enabled or not, ``clusterName`` filter),
        paged as PageUtil.subPage pages it."""
        service = p.v2_service()
        page_no, page_size = p.integer("pageNo", 1, 1), p.integer("pageSize", 100, 1)
        hosts = self.naming.reads.service_instances(service, p.text("clusterName"))
        return v2_ok(dumps(sub_page(hosts, page_no, page_size)))

    async def update_instance(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The v2 update with the console's default: ``ephemeral`` absent is a persistent
        instance (ConsoleInstanceController.buildInstance)."""
        if not p.text("ephemeral"):
            p = Params({**p.query, "ephemeral": "false"}, p.form)
        await self.naming.v2_update(request, p)
        return v2_ok('"ok"')


def answered_ok(handler: Handler) -> Handler:
    """A v1 write (its own answer a plain ``ok``) answered as the 3.x ``Result<String>`` ``"ok"``."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        await handler(request, p)
        return v2_ok('"ok"')

    return wrapped


def service_detail_info(naming: NamingRoutes, service: ServiceKey) -> dict[str, Any]:
    """Nacos 3.x's ServiceDetailInfo of a service, from the use cases (ServiceNotFound if absent)."""
    return service_detail_json(service, naming.services.describe(service), "namespaceId")


def sub_page(items: list[Any], page_no: int, page_size: int) -> dict[str, Any]:
    """Nacos's PageUtil.subPage: an empty source has ``totalCount`` and ``pagesAvailable`` 0;
    otherwise ``pagesAvailable`` is ``total / size + 1`` (integer division, as Nacos counts it)."""
    if page_no < 1 or page_size < 1:
        raise InvalidParam("Param 'pageNo' and 'pageSize' must be at least 1.")
    if not items:
        return {"totalCount": 0, "pageNumber": page_no, "pagesAvailable": 0, "pageItems": []}
    start = min((page_no - 1) * page_size, len(items))
    return {"totalCount": len(items), "pageNumber": page_no, "pagesAvailable": len(items) // page_size + 1,
            "pageItems": items[start:start + page_size]}
