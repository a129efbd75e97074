"""The Nacos 3.x HTTP surface, first slice (issue 15 item 1; docs/protocol.md §5.7).

Nacos 3.x refuses the v1/v2 admin APIs by default, so 3.x tools call ``/nacos/v3/...``. Its answers
are the v2 ``Result`` (``{"code":0,"message":"success","data":...}``) and its errors the v2
``ErrorCode``s with the HTTP status of the exception (NacosApiExceptionHandler), so the error
shape is :data:`Api.V2`'s. Every route calls the same handlers and use cases as v1/v2; only the
shapes that 3.x changed are built here:

* ``POST /nacos/v3/auth/user/login`` (UserControllerV3): the v1 login answer; the 3.x Java client
  tries it first and falls back to v1 only on 404.
* ``/nacos/v3/client/ns/instance`` (InstanceOpenApiController, OPEN_API: READ/WRITE on the
  service): register (``heartBeat=true`` renews instead and answers code 21003 when the instance
  is unknown), deregister, and ``/list`` with the hosts only, ``enabled=false`` left out.
* ``/nacos/v3/admin/ns/instance`` and ``/service`` (InstanceControllerV3, ServiceControllerV3),
  ``/nacos/v3/admin/core/namespace`` (NamespaceControllerV3), ``/nacos/v3/admin/core/cluster/node/list``
  (NacosClusterControllerV3): ADMIN_API, which needs a global admin when auth is on.
* ``GET /nacos/v3/admin/core/state`` (ServerStateController): the state map in a Result, open.
* ``/nacos/v3/auth/{user,role,permission}`` (UserControllerV3 and co.): the v1 auth handlers in a Result.
* ``/nacos/v3/admin/ns/{client,ops,health/instance,cluster}``: the v2 (or v1) handlers in a Result.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shoal import jsonfast
from shoal.auth.service import READ, WRITE, AdminExists
from shoal.errors import V2_TEXT, BeatCode, V2Code
from shoal.model.keys import DEFAULT_GROUP, ServiceKey
from shoal.service_layer.namespaces import NamespaceService
from shoal.transport.http.api import Api, dumps, json_text, v2_ok
from shoal.transport.http.auth_routes import AuthRoutes
from shoal.transport.http.namespaces import NamespaceRoutes
from shoal.transport.http.naming import NamingRoutes
from shoal.transport.http.params import Params

Handler = Callable[[web.Request, Params], Awaitable[web.StreamResponse]]
AddRoute = Callable[..., None]

CLIENT_INSTANCE = "/nacos/v3/client/ns/instance"
ADMIN_INSTANCE = "/nacos/v3/admin/ns/instance"
ADMIN_SERVICE = "/nacos/v3/admin/ns/service"
ADMIN_NAMESPACE = "/nacos/v3/admin/core/namespace"
ADMIN_CLIENT = "/nacos/v3/admin/ns/client"
ADMIN_OPS = "/nacos/v3/admin/ns/ops"
ADMIN_HEALTH = "/nacos/v3/admin/ns/health/instance"
ADMIN_CLUSTER = "/nacos/v3/admin/ns/cluster"
ADMIN_NODES = "/nacos/v3/admin/core/cluster/node/list"
ADMIN_STATE = "/nacos/v3/admin/core/state"
LOGIN = "/nacos/v3/auth/user/login"
AUTH_USER = "/nacos/v3/auth/user"
AUTH_ROLE = "/nacos/v3/auth/role"
AUTH_PERMISSION = "/nacos/v3/auth/permission"

#: Every v3 path this node serves (for the report and the tests).
PATHS = (LOGIN, CLIENT_INSTANCE, CLIENT_INSTANCE + "/list", ADMIN_INSTANCE, ADMIN_INSTANCE + "/list", ADMIN_SERVICE,
         ADMIN_SERVICE + "/list", ADMIN_NAMESPACE, ADMIN_NAMESPACE + "/list", ADMIN_NODES, ADMIN_STATE, AUTH_USER,
         AUTH_USER + "/admin", AUTH_USER + "/list", AUTH_ROLE, AUTH_ROLE + "/list", AUTH_PERMISSION,
         AUTH_PERMISSION + "/list", ADMIN_CLIENT, ADMIN_CLIENT + "/list", ADMIN_CLIENT + "/publish/list",
         ADMIN_CLIENT + "/subscribe/list", ADMIN_OPS + "/metrics", ADMIN_OPS + "/switches", ADMIN_HEALTH, ADMIN_CLUSTER)


def _message(handler: Handler) -> Handler:
    """A v1 auth write answered as a Result whose data is the v1 RestResult's message."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        raw = await handler(request, p)
        assert isinstance(raw, web.Response) and raw.text is not None
        return v2_ok(dumps(jsonfast.loads(raw.text).get("message")))

    return wrapped


def _ok(handler: Handler) -> Handler:
    """A v1 naming write (plain ``ok``) answered as ``Result<String>`` ``"ok"``."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        await handler(request, p)
        return v2_ok('"ok"')

    return wrapped


def _body(handler: Handler) -> Handler:
    """A v1 auth list (a bare Page) answered as a Result around it."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        raw = await handler(request, p)
        assert isinstance(raw, web.Response) and raw.text is not None
        return v2_ok(raw.text)

    return wrapped


def _hosts(info_json: str) -> list[dict[str, Any]]:
    hosts = jsonfast.loads(info_json).get("hosts")
    return list(hosts) if isinstance(hosts, list) else []


class V3Routes:
    """The v3 endpoints, as thin shapes over the v1/v2 route handlers (no rule lives here).

    ``state`` and ``nodes`` are the HTTP server's ``/v1/console/server/state`` and v2 member list
    handlers; ``auth`` is None when the node has no auth service."""

    def __init__(self, naming: NamingRoutes, namespaces: NamespaceService, auth: AuthRoutes | None,
                 state: Handler, nodes: Handler, switches: Handler) -> None:
        self.naming = naming
        self.switches = switches  # the operator routes' v2 switches answer
        self.namespaces = NamespaceRoutes(namespaces)
        self.auth = auth
        self.state_handler = state
        self.nodes = nodes

    def register(self, add_route: AddRoute, admin: str, identity: str) -> None:
        """Add every v3 route through the server's wrapper (auth, DistroFilter, error shapes)."""
        n, ns, v2 = self.naming, self.namespaces, Api.V2
        if self.auth is not None:
            a = self.auth
            add_route("POST", LOGIN, a.login, Api.V1)
            add_route("POST", AUTH_USER + "/admin", self.create_admin, v2)
            add_route("POST", AUTH_USER, _message(a.create_user), v2, admin)
            add_route("DELETE", AUTH_USER, _message(a.delete_user), v2, admin)
            add_route("PUT", AUTH_USER, _message(a.update_user), v2, identity)
            add_route("GET", AUTH_USER + "/list", _body(a.list_users), v2, admin)
            add_route("POST", AUTH_ROLE, _message(a.add_role), v2, admin)
            add_route("DELETE", AUTH_ROLE, _message(a.delete_role), v2, admin)
            add_route("GET", AUTH_ROLE + "/list", _body(a.list_roles), v2, admin)
            add_route("POST", AUTH_PERMISSION, _message(a.add_permission), v2, admin)
            add_route("DELETE", AUTH_PERMISSION, _message(a.delete_permission), v2, admin)
            add_route("GET", AUTH_PERMISSION + "/list", _body(a.list_permissions), v2, admin)
        add_route("POST", CLIENT_INSTANCE, self.client_register, v2, WRITE, distro=True)
        add_route("DELETE", CLIENT_INSTANCE, n.v2_deregister, v2, WRITE, distro=True)
        add_route("GET", CLIENT_INSTANCE + "/list", self.client_list, v2, READ)
        add_route("POST", ADMIN_INSTANCE, n.v2_register, v2, admin, distro=True)
        add_route("DELETE", ADMIN_INSTANCE, n.v2_deregister, v2, admin, distro=True)
        add_route("PUT", ADMIN_INSTANCE, n.v2_update, v2, admin, distro=True)
        add_route("GET", ADMIN_INSTANCE, self.admin_instance, v2, admin)
        add_route("GET", ADMIN_INSTANCE + "/list", self.admin_instances, v2, admin)
        add_route("POST", ADMIN_SERVICE, n.v2_service_create, v2, admin)
        add_route("DELETE", ADMIN_SERVICE, n.v2_service_delete, v2, admin)
        add_route("PUT", ADMIN_SERVICE, n.v2_service_update, v2, admin)
        add_route("GET", ADMIN_SERVICE, n.v2_service_detail, v2, admin)
        add_route("GET", ADMIN_SERVICE + "/list", self.admin_services, v2, admin)
        add_route("GET", ADMIN_NAMESPACE + "/list", ns.v2_list, v2, admin)
        add_route("GET", ADMIN_NAMESPACE, ns.v2_get, v2, admin)
        add_route("POST", ADMIN_NAMESPACE, ns.v2_create, v2, admin)
        add_route("PUT", ADMIN_NAMESPACE, ns.v2_edit, v2, admin)
        add_route("DELETE", ADMIN_NAMESPACE, ns.v2_delete, v2, admin)
        add_route("GET", ADMIN_CLIENT + "/list", n.v2_client_list, v2, admin)
        add_route("GET", ADMIN_CLIENT, n.v2_client_detail, v2, admin)
        add_route("GET", ADMIN_CLIENT + "/publish/list", n.v2_client_publications, v2, admin)
        add_route("GET", ADMIN_CLIENT + "/subscribe/list", n.v2_client_subscriptions, v2, admin)
        add_route("GET", ADMIN_OPS + "/metrics", n.v2_metrics, v2, admin)
        add_route("GET", ADMIN_OPS + "/switches", self.switches, v2, admin)
        add_route("PUT", ADMIN_HEALTH, _ok(n.v1_health_update), v2, admin)
        add_route("PUT", ADMIN_CLUSTER, _ok(n.v1_cluster_update), v2, admin)
        add_route("GET", ADMIN_NODES, self.nodes, v2, admin)
        add_route("GET", ADMIN_STATE, self.state, v2)

    # --- client (OPEN_API) ------------------------------------------------------------------
    async def client_register(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Register, or with ``heartBeat=true`` renew: an unknown instance answers HTTP 200 with
        code 21003 (INSTANCE_NOT_FOUND) so the caller registers again."""
        if not p.boolean("heartBeat", False):
            return await self.naming.v2_register(request, p)
        code, _interval = self.naming.naming.beat(p.v2_service(), p.required("ip"), p.port(), None, True)
        if code != BeatCode.OK:
            return json_text(dumps({"code": V2Code.INSTANCE_NOT_FOUND, "message": V2_TEXT[V2Code.INSTANCE_NOT_FOUND],
                                    "data": None}))
        return v2_ok('"ok"')

    async def client_list(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The instances a custom client may call: the hosts only, ``enabled=false`` left out."""
        info = self.naming.naming.query(p.v2_service(), p.text("clusterName"), False, grouped_name=True)
        return v2_ok(dumps([h for h in _hosts(info) if h.get("enabled", True)]))

    # --- admin ----------------------------------------------------------------------------
    async def admin_instances(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Every instance of the service (enabled or not), optionally healthy only."""
        hosts = self.naming.naming.service_instances(p.v2_service(), p.text("clusterName"),
                                                     p.boolean("healthyOnly", False))
        return v2_ok(dumps(hosts))

    async def admin_instance(self, request: web.Request, p: Params) -> web.StreamResponse:
        """One instance in the Instance shape; NotFound (404, 20004) when absent."""
        return v2_ok(dumps(self.naming.naming.instance_json(p.v2_service(), p.required("ip"), p.port(), p.cluster())))

    async def admin_services(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A Page of ServiceView (name, groupName, counts) of one namespace and group."""
        page_no = p.integer("pageNo", 1, 1)
        page_size = p.integer("pageSize", 20, 1, 500)
        assert page_no is not None and page_size is not None
        group = p.text("groupName") or DEFAULT_GROUP
        namespace = p.namespace()
        page = self.naming.naming.list_services(namespace, group, page_no, page_size)
        items = []
        for name in page.names:
            service = ServiceKey(namespace, group, name)
            hosts = self.naming.naming.service_instances(service)
            items.append({"name": name, "groupName": group,
                          "clusterCount": len({h.get("clusterName") for h in hosts}),
                          "ipCount": len(hosts), "healthyInstanceCount": sum(1 for h in hosts if h.get("healthy")),
                          "triggerFlag": "false"})
        return v2_ok(dumps({"totalCount": page.count, "pageNumber": page_no,
                            "pagesAvailable": math.ceil(page.count / page_size), "pageItems": items}))

    async def create_admin(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The first admin as a ``Result<User>``; once one exists, HTTP 200 with code 409 (as
        UserControllerV3 answers it)."""
        assert self.auth is not None
        try:
            user = await self.auth.auth.create_admin(p.get("password") or "")
        except AdminExists as exc:
            return json_text(dumps({"code": exc.http_status, "message": exc.message, "data": None}))
        return v2_ok(dumps(user))

    async def state(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The server state map (ServerStateController) inside a Result."""
        raw = await self.state_handler(request, p)
        assert isinstance(raw, web.Response) and raw.text is not None
        return v2_ok(raw.text)
