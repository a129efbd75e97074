"""The Nacos 3.x core admin API, ``/nacos/v3/admin/core`` (docs/protocol.md §5.7).

NacosClusterControllerV3, NamespaceControllerV3, ServerStateController, ServerLoaderControllerV3
and CoreOpsControllerV3, each answering a ``Result``. The state routes are open; every other one
needs a global admin when auth is on. What has no meaning on Shoal answers HTTP 501 with code
40001 ``API function disabled.`` (:class:`~shoal.errors.FunctionDisabled`, Nacos's answer for a
disabled module): the Raft operations (the CP store is etcd or SQLite, not JRaft), editing the
member list or the lookup mode at run time (members come from ``nacos.member.list`` or
``cluster.conf``), and the config module's ``/v3/admin/cs`` and ``/v3/client/cs`` (a naming-only
registry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal import jsonfast
from shoal.errors import FunctionDisabled, InvalidParam, MissingParam, PayloadTooLarge, V2Code
from shoal.service_layer.namespaces import NamespaceService
from shoal.transport.http.api import dumps, v2_ok
from shoal.transport.http.loader import LoaderRoutes
from shoal.transport.http.namespaces import NamespaceRoutes
from shoal.transport.http.operator import set_log_level
from shoal.transport.http.params import Params, refuse_declared_oversize
from shoal.transport.http.routes import Handler, Route
from shoal.transport.http.v3 import failure
from shoal.transport.http.v3_console import V3Namespaces

BASE = "/nacos/v3/admin/core"
CLUSTER = BASE + "/cluster"
NAMESPACE = BASE + "/namespace"
STATE = BASE + "/state"
LOADER = BASE + "/loader"
OPS = BASE + "/ops"

#: Nacos's core log names (core Loggers.setLogLevel) → this node's loggers.
CORE_LOG_NAMES = {"core": "shoal", "core-auth": "shoal.auth", "core-raft": "shoal.cp",
                  "core-distro": "shoal.distro", "core-cluster": "shoal.distro.members"}

#: Nacos 3.x module paths Shoal has no module for (answered 501 / 40001 on every method).
DISABLED_MODULES = ("/nacos/v3/admin/cs", "/nacos/v3/client/cs")


class V3CoreRoutes:
    """The ``/nacos/v3/admin/core`` endpoints over the node's existing handlers.

    ``state`` is the HTTP server's state map (``/v1/console/server/state``), ``nodes`` its v2
    member-list handler, ``self_member`` this node's Member JSON, ``readiness`` the node's readiness problem
    (None when ready)."""

    def __init__(self, namespaces: NamespaceService, loader: LoaderRoutes, state: Callable[[], dict[str, str]],
                 nodes: Handler, self_member: Callable[[], dict[str, Any]],
                 readiness: Callable[[], str | None]) -> None:
        self.namespaces = namespaces
        self.namespace_routes = NamespaceRoutes(namespaces)
        self.loader = loader
        self.state = state
        self.nodes = nodes
        self.self_member = self_member
        self.readiness_problem = readiness

    def routes(self, admin: str) -> list[Route]:
        """The route table (state open, the rest admin)."""
        ns, ld = self.namespace_routes, self.loader
        table = [
            Route("GET", CLUSTER + "/node/self", self.node_self, admin),
            Route("GET", CLUSTER + "/node/list", self.nodes, admin),
            Route("PUT", CLUSTER + "/node/list", self.disabled, admin),
            Route("PUT", CLUSTER + "/lookup", self.disabled, admin),
            Route("GET", NAMESPACE + "/list", V3Namespaces(self.namespaces).list, admin),  # 3.x ids: public
            Route("GET", NAMESPACE, V3Namespaces(self.namespaces).get, admin),
            Route("POST", NAMESPACE, ns.v2_create, admin),
            Route("PUT", NAMESPACE, ns.v2_edit, admin),
            Route("DELETE", NAMESPACE, ns.v2_delete, admin),
            Route("GET", NAMESPACE + "/check", self.namespace_check, admin),
            Route("GET", STATE, self.server_state),
            Route("GET", STATE + "/liveness", self.liveness),
            Route("GET", STATE + "/readiness", self.readiness),
            Route("GET", LOADER + "/current", ld.v3_current, admin),
            Route("GET", LOADER + "/cluster", ld.v3_cluster, admin),
            Route("POST", LOADER + "/reloadCurrent", ld.v3_reload_current, admin),
            Route("POST", LOADER + "/smartReloadCluster", ld.v3_smart_reload, admin),
            Route("POST", LOADER + "/reloadClient", ld.v3_reload_client, admin),
            Route("GET", OPS + "/ids", self.ids, admin),
            Route("PUT", OPS + "/log", self.log, admin),
            Route("POST", OPS + "/raft", self.disabled, admin),
        ]
        table += [Route("*", f"{prefix}/{{tail:.*}}", self.disabled) for prefix in DISABLED_MODULES]
        return table

    # --- cluster, namespaces, state -----------------------------------------------------------
    async def node_self(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self.self_member()))

    async def namespace_check(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``Result<Integer>``: 1 when ``namespaceId`` exists (public included), else 0."""
        return v2_ok("1" if self.namespaces.exists(p.required("namespaceId")) else "0")

    async def server_state(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self.state()))

    async def liveness(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok('"ok"')

    async def readiness(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``"ok"``, or HTTP 200 with code 30000 and the reason as the message (``Result.failure``)."""
        problem = self.readiness_problem()
        return v2_ok('"ok"') if problem is None else failure(V2Code.SERVER_ERROR, problem)

    # --- ops ----------------------------------------------------------------------------------
    async def ids(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The id generators (IdGeneratorInfo): Shoal has none (Nacos's serve the config module)."""
        return v2_ok("[]")

    async def log(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A core logger's level from a JSON body ``{"logName", "logLevel"}`` (LogUpdateRequest;
        form or query parameters are taken too); ``Result<Void>``."""
        name, level = await _log_request(request, p)
        set_log_level(CORE_LOG_NAMES, name, level)
        return v2_ok("null")

    async def disabled(self, request: web.Request, p: Params) -> web.StreamResponse:
        raise FunctionDisabled(f"{request.method} {request.path} is not offered by this server (Shoal)")


async def _log_request(request: web.Request, p: Params) -> tuple[str, str]:
    if not (request.body_exists and request.content_type == "application/json"):
        return p.required("logName"), p.required("logLevel")
    refuse_declared_oversize(request)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"request body is larger than {request.client_max_size} bytes") from None
    try:
        doc = jsonfast.loads(raw)
    except ValueError:
        raise InvalidParam("request body must be a JSON object with logName and logLevel.") from None
    if not isinstance(doc, dict):
        raise InvalidParam("request body must be a JSON object with logName and logLevel.")
    out = []
    for key in ("logName", "logLevel"):
        value = doc.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise MissingParam(key)
        if not isinstance(value, str):
            raise InvalidParam(f"Param '{key}' must be a string.")
        out.append(value.strip())
    return out[0], out[1]
