"""The remaining Nacos 2.x Open API rows (docs/protocol.md §5.2 and §5.3).

* naming, v1 (InstanceController, ServiceController, HealthController, OperatorController and
  its ``/ops`` alias): ``GET instance/statuses`` (``key``: ``[namespace##]group@@service``,
  answering ``{"ips":["ip:port_healthy",..]}``), ``GET service/selector/types`` (RestResult),
  ``GET health/checkers`` (the bare checker map), ``GET operator/distro/client`` (``ip``*,
  ``port``*: ``{"responsibleServer":"ip:port"}``) and ``GET operator/push/state`` (``detail``,
  ``reset``: ``{"succeed","total","ratio"[,"detail":{"avgPushCost","maxPushCost"}],"reset"}``);
* naming, v2: the ``/nacos/v2/ns/ops/*`` aliases of the v2 operator routes
  (OperatorControllerV2 is mapped on both ``/v2/ns/operator`` and ``/v2/ns/ops``);
* core, v1 (NacosClusterController): ``GET /nacos/v1/core/cluster/self`` (this node's Member) and
  ``GET .../cluster/health`` (its state name), both RestResult;
* core, v2 (NacosClusterControllerV2, CoreOpsV2Controller): ``GET
  /nacos/v2/core/cluster/node/self`` and ``.../node/self/health`` (Result), ``GET
  /nacos/v2/core/ops/ids`` (RestResult ``[]``: Shoal runs no id generator Nacos would list) and
  ``PUT /nacos/v2/core/ops/log`` (LogUpdateRequest JSON body; RestResult);
* console, v2 (HealthControllerV2): ``GET /nacos/v2/console/health/liveness`` and ``readiness``
  (Result; not ready: HTTP 200 with ``Result.failure``);
* the rest of Nacos's v1/v2 naming and core controllers: ``GET /nacos/v2/ns/instance/statuses/{key}``,
  ``PUT /nacos/v2/ns/health`` (``health/instance``), ``GET /nacos/v1/ns/health/server``, ``GET
  /nacos/v1/core/cluster/simple/nodes``, ``GET /nacos/v1/core/ops/idInfo`` (``{}``), ``PUT
  /nacos/v1/core/ops/log``, ``GET /nacos/v1/console/server/announcement`` and ``guide`` (null);
  member removal answered as Nacos answers it (RestResult 405 "not allow"), and the Raft, lookup,
  member-list and peer-report writes 501 / 40001 as their v3 twins.

Every route reads through the use cases or hands the request to the handler that owns the same
use case; none parses another handler's answer. The member, state and operator routes need an
admin when auth is on (Shoal's rule for the v1/v2 admin APIs); the health probes are open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal.auth.service import WRITE
from shoal.errors import FunctionDisabled, InvalidParam, V2Code
from shoal.model.keys import DEFAULT_NAMESPACE, GROUP_SEPARATOR, ServiceKey
from shoal.service_layer import NamingService
from shoal.transport.http.api import Api, core_ok, dumps, json_text, v2_ok
from shoal.transport.http.naming import NamingRoutes
from shoal.transport.http.operator import OperatorRoutes, set_log_level
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route
from shoal.transport.http.v3 import failure
from shoal.transport.http.v3_core import CORE_LOG_NAMES, _log_request
from shoal.transport.http.v3_naming import CHECKERS, SELECTOR_TYPES

#: UtilsAndCommons.NAMESPACE_SERVICE_CONNECTOR: ``namespace##group@@service`` in a statuses key.
NAMESPACE_SERVICE_CONNECTOR = "##"


def statuses_service(key: str) -> ServiceKey:
    """The service a ``instance/statuses`` key names: ``[namespace##]group@@service`` (the
    service part must be grouped, as NamingUtils.checkServiceNameFormat requires)."""
    namespace, sep, grouped = key.partition(NAMESPACE_SERVICE_CONNECTOR)
    if not sep:
        namespace, grouped = DEFAULT_NAMESPACE, key
    group, sep, name = grouped.partition(GROUP_SEPARATOR)
    if not sep or not group.strip() or not name.strip() or GROUP_SEPARATOR in name:
        raise InvalidParam(f"Param 'key' is illegal: service name {grouped!r} must be 'groupName@@serviceName'.")
    return ServiceKey(namespace.strip() or DEFAULT_NAMESPACE, group, name)


class OpenApiRows:
    """The rows above. ``self_member`` is this node's Member JSON, ``responsible`` the member
    responsible for an ``ip:port``, ``push_state(reset)`` the push figures ``(total, failed, avg
    ms, max ms)``, ``readiness_problem`` None when ready, ``members`` every member's Member JSON."""

    def __init__(self, naming: NamingService, naming_routes: NamingRoutes, operator: OperatorRoutes,
                 self_member: Callable[[], dict[str, Any]], responsible: Callable[[str], str],
                 push_state: Callable[[bool], tuple[int, int, int, int]],
                 readiness_problem: Callable[[], str | None], members: Callable[[], list[dict[str, Any]]]) -> None:
        self.naming = naming
        self.naming_routes = naming_routes
        self.operator = operator
        self.self_member = self_member
        self.responsible = responsible
        self.push_figures = push_state
        self.readiness_problem = readiness_problem
        self.members = members

    def routes(self, admin: str) -> list[Route]:
        op, n = self.operator, self.naming_routes
        table = [
            Route("GET", "/nacos/v1/ns/instance/statuses", self.statuses, admin, api=Api.V1),
            Route("GET", "/nacos/v1/ns/service/selector/types", self.selector_types, admin, api=Api.CORE),
            Route("GET", "/nacos/v1/ns/health/checkers", self.checkers, admin, api=Api.V1),
            Route("GET", "/nacos/v1/core/cluster/self", self.v1_self, admin, api=Api.CORE),
            Route("GET", "/nacos/v1/core/cluster/health", self.v1_health, admin, api=Api.CORE),
            Route("GET", "/nacos/v2/core/cluster/node/self", self.v2_self, admin),
            Route("GET", "/nacos/v2/core/cluster/node/self/health", self.v2_health, admin),
            Route("GET", "/nacos/v2/core/ops/ids", self.ids, admin, api=Api.CORE),
            Route("PUT", "/nacos/v2/core/ops/log", self.core_log, admin, api=Api.CORE),
            Route("GET", "/nacos/v2/console/health/liveness", self.liveness),
            Route("GET", "/nacos/v2/console/health/readiness", self.readiness),
            Route("GET", "/nacos/v2/ns/ops/switches", op.v2_switches, admin),
            Route("PUT", "/nacos/v2/ns/ops/switches", op.v2_update_switch, admin),
            Route("PUT", "/nacos/v2/ns/ops/log", op.v2_log, admin),
            Route("GET", "/nacos/v2/ns/ops/metrics", n.v2_metrics),
            Route("GET", "/nacos/v2/ns/instance/statuses/{key}", self.v2_statuses, admin),
            Route("PUT", "/nacos/v2/ns/health", op.v2_health, WRITE),
            Route("GET", "/nacos/v1/ns/health/server", self.health_server, api=Api.V1),
            Route("GET", "/nacos/v1/core/cluster/simple/nodes", self.simple_nodes, admin, api=Api.CORE),
            Route("GET", "/nacos/v1/core/ops/idInfo", self.id_info, admin, api=Api.CORE),
            Route("PUT", "/nacos/v1/core/ops/log", self.v1_core_log, admin, api=Api.V1),
            Route("GET", "/nacos/v1/console/server/announcement", self.announcement, api=Api.CORE),
            Route("GET", "/nacos/v1/console/server/guide", self.guide, api=Api.CORE),
            Route("POST", "/nacos/v1/core/cluster/server/leave", self.not_allowed, admin, api=Api.CORE),
            Route("DELETE", "/nacos/v2/core/cluster/nodes", self.not_allowed, admin, api=Api.CORE),
        ]
        # What has no meaning on Shoal (as the v3 routes, docs/protocol.md §5.7): 501 / 40001.
        table += [Route(method, path, self.disabled, admin) for method, path in (
            ("POST", "/nacos/v1/core/ops/raft"), ("POST", "/nacos/v2/core/ops/raft"),
            ("POST", "/nacos/v1/core/cluster/switch/lookup"), ("PUT", "/nacos/v2/core/cluster/lookup"),
            ("PUT", "/nacos/v2/core/cluster/node/list"), ("POST", "/nacos/v1/core/cluster/report"))]
        for base in ("/nacos/v1/ns/operator", "/nacos/v1/ns/ops"):
            table += [Route("GET", f"{base}/distro/client", self.distro_client, admin, api=Api.V1),
                      Route("GET", f"{base}/push/state", self.push_state, admin, api=Api.V1)]
        return table

    # --- naming, v1 ---------------------------------------------------------------------------
    async def statuses(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Every instance of the keyed service (enabled or not) as ``ip:port_healthy``."""
        return self._statuses(p.required("key"))

    async def v2_statuses(self, request: web.Request, p: Params) -> web.StreamResponse:
        """InstanceControllerV2's ``statuses/{key}``: the v1 answer (no Result around it)."""
        return self._statuses(request.match_info["key"])

    async def health_server(self, request: web.Request, p: Params) -> web.StreamResponse:
        """HealthController.server: the greeting with the service count and this node's port."""
        services, port = self.naming.reads.service_count(), self.self_member().get("port")
        return json_text(dumps({"msg": f"Hello! I am Nacos-Naming and healthy! total services: "
                                       f"{services}, local port:{port}"}))

    def _statuses(self, key: str) -> web.Response:
        service = statuses_service(key)
        hosts = self.naming.reads.service_instances(service)
        return json_text(dumps({"ips": [f"{h['ip']}:{h['port']}_{'true' if h['healthy'] else 'false'}"
                                        for h in hosts]}))

    async def selector_types(self, request: web.Request, p: Params) -> web.StreamResponse:
        return core_ok(SELECTOR_TYPES)

    async def checkers(self, request: web.Request, p: Params) -> web.StreamResponse:
        return json_text(dumps(CHECKERS))

    async def distro_client(self, request: web.Request, p: Params) -> web.StreamResponse:
        return json_text(dumps({"responsibleServer": self.responsible(f"{p.required('ip')}:{p.required('port')}")}))

    async def push_state(self, request: web.Request, p: Params) -> web.StreamResponse:
        """OperatorController.pushState: pushes since the start (or the last ``reset``)."""
        detail, reset = p.boolean("detail", False), p.boolean("reset", False)
        total, failed, avg_cost, max_cost = self.push_figures(reset)
        out: dict[str, Any] = {"succeed": total - failed, "total": total,
                               "ratio": (total - failed) / total if total > 0 else 0}
        if detail:
            out["detail"] = {"avgPushCost": avg_cost, "maxPushCost": max_cost}
        out["reset"] = reset
        return json_text(dumps(out))

    # --- core ---------------------------------------------------------------------------------
    def _state(self) -> str:
        return str(self.self_member().get("state", "UP"))

    async def v1_self(self, request: web.Request, p: Params) -> web.StreamResponse:
        return core_ok(self.self_member())

    async def v1_health(self, request: web.Request, p: Params) -> web.StreamResponse:
        return core_ok(self._state())

    async def v2_self(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self.self_member()))

    async def v2_health(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self._state()))

    async def simple_nodes(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Every member's ``ip:port`` (getMemberAddressInfos)."""
        return core_ok([str(m.get("address")) for m in self.members()])

    async def id_info(self, request: web.Request, p: Params) -> web.StreamResponse:
        """v1 ``idInfo``: each id generator's info, by resource; none here (see :meth:`ids`)."""
        return core_ok({})

    async def v1_core_log(self, request: web.Request, p: Params) -> web.StreamResponse:
        """v1 CoreOpsController.setLogLevel: ``logName``*, ``logLevel``*; answers ``200``."""
        set_log_level(CORE_LOG_NAMES, p.required("logName"), p.required("logLevel"))
        return web.Response(text="200")

    async def announcement(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The v1 console announcement (RestResult): Shoal ships none, data null."""
        language = p.text("language", "zh-CN")
        if ".." in language or "/" in language or "\\" in language:
            raise InvalidParam("Invalid filename")
        return core_ok(None)

    async def guide(self, request: web.Request, p: Params) -> web.StreamResponse:
        return core_ok(None)

    async def not_allowed(self, request: web.Request, p: Params) -> web.StreamResponse:
        """What Nacos itself refuses (member removal): RestResult code 405 in an HTTP 200."""
        return json_text(dumps({"code": 405, "message": f"{request.method} {request.path} API not allow to use "
                                                        "temporarily.", "data": None}))

    async def disabled(self, request: web.Request, p: Params) -> web.StreamResponse:
        raise FunctionDisabled(f"{request.method} {request.path} is not offered by this server (Shoal)")

    async def ids(self, request: web.Request, p: Params) -> web.StreamResponse:
        """IdGeneratorInfo per generator Nacos's IdGeneratorManager holds (its config module's):
        none here. The snowflake instance ids have their own generator, as in Nacos, unlisted."""
        return core_ok([])

    async def core_log(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A core logger's level (LogUpdateRequest ``{"logName","logLevel"}``; names as v3's)."""
        name, level = await _log_request(request, p)
        set_log_level(CORE_LOG_NAMES, name, level)
        return core_ok()

    # --- console, v2 --------------------------------------------------------------------------
    async def liveness(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok('"ok"')

    async def readiness(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``"ok"``; not ready: HTTP 200 with ``Result.failure`` (30000, the reason), as HealthControllerV2."""
        problem = self.readiness_problem()
        return v2_ok('"ok"') if problem is None else failure(V2Code.SERVER_ERROR, problem)
