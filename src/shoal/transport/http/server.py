"""The main-port HTTP listener (aiohttp on the node's one event loop).

Routes: the console health probes (``/nacos/v1/console/health/liveness`` and ``/readiness``),
``/nacos/actuator/prometheus``, the naming Open API v1 (``/nacos/v1/ns``) and v2
(``/nacos/v2/ns``), the cluster member list (``/nacos/v1/core/cluster/nodes``,
``/nacos/v2/core/cluster/node/list``) and the auth endpoints (``/nacos/v1/auth``).

Every route goes through one wrapper, in Nacos's filter order: read the parameters (query or
form), check the token when auth is on (read / write on the service's namespace, or admin),
forward a write for an ``ip:port`` another node is responsible for (DistroFilter), run the
handler; a NacosError becomes the API generation's error shape (400s name the parameter), an
unexpected exception a logged 500. Unknown paths answer 404.

Requests aiohttp cannot parse (a request line or header over its limits, bad framing) are
answered 400 by aiohttp, which logs each at ERROR with a traceback; :class:`BadHttpFilter`
turns those into one WARNING per kind per interval, without the traceback.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from shoal import __version__, kernels
from shoal.auth.service import READ, WRITE, AuthService, Identity, naming_resource
from shoal.config import Config
from shoal.errors import Forbidden, HttpStatus, NacosError
from shoal.logutil import RateLimitedLog
from shoal.metrics import Metrics
from shoal.model.keys import DEFAULT_GROUP, GROUP_SEPARATOR
from shoal.service_layer import NamingService
from shoal.service_layer.persistent import PersistentNaming
from shoal.tls import PortTls
from shoal.tls import describe as describe_tls
from shoal.transport.grpc.transports import transport_name
from shoal.transport.http import access_log
from shoal.transport.http.api import Api, core_ok, dumps, error_response, v2_ok
from shoal.transport.http.auth_routes import IDENTITY_KEY, AuthRoutes
from shoal.transport.http.console_api import ConsoleRoutes
from shoal.transport.http.forward import Forwarder, MemberView, Responsibility, Standalone, StandaloneMembers
from shoal.transport.http.naming import NamingRoutes, distro_tag, persistent_write
from shoal.transport.http.params import Params, read_params
from shoal.transport.http.prometheus_sd import PrometheusSdRoutes

log = logging.getLogger(__name__)

RouteHandler = Callable[[web.Request, Params], Awaitable[web.StreamResponse]]

#: Who a request carrying the cluster identity header is (it passes every check, as in Nacos).
CLUSTER_IDENTITY = Identity("(cluster identity)", True)

#: Auth requirements of a route besides READ / WRITE on a naming resource.
ADMIN = "admin"
IDENTITY = "identity"


class BadHttpFilter(logging.Filter):
    """Filter of the ``aiohttp.server`` logger: a request aiohttp could not parse (it answered
    it 400, e.g. ``LineTooLong``) becomes one rate-limited WARNING line without a traceback;
    anything else aiohttp logs passes unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.garbage = RateLimitedLog(log)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        self.garbage.warning(f"bad-http {type(exc).__name__}", "unparseable HTTP request answered %s (%s): %s",
                             exc.code or 400, type(exc).__name__, str(exc.message)[:200].replace("\n", " "))
        return False


#: One filter for the process (aiohttp logs through one module-level logger).
BAD_HTTP_FILTER = BadHttpFilter()


class NodeStatus(Protocol):
    """What the HTTP layer asks of the node: serving yet, and why not ready."""

    def is_serving(self) -> bool: ...

    def readiness_problem(self) -> str | None: ...


class HttpServer:
    """The main-port aiohttp application: every route behind one Nacos-filter-chain wrapper."""

    def __init__(self, config: Config, status: NodeStatus, metrics: Metrics, naming: NamingService | None = None,
                 auth: AuthService | None = None, responsibility: Responsibility | None = None,
                 members: MemberView | None = None, tls: PortTls | None = None) -> None:
        self.config = config
        self.status = status
        self.metrics = metrics
        self.auth = auth
        self.tls = tls  # None: plaintext
        # Peers serve HTTPS when this node does (one cluster, one setting): forward over it too.
        self.forwarder = Forwarder(responsibility or Standalone(), config.http_forward_timeout_ms,
                                   tls.client_context() if tls is not None else None)
        self.members = members
        self.garbage = RateLimitedLog(log)  # unexpected failures: one traceback per kind per interval
        logging.getLogger("aiohttp.server").addFilter(BAD_HTTP_FILTER)  # idempotent: one instance
        self.app = web.Application(client_max_size=config.max_inbound_message_size)
        self._runner: web.AppRunner | None = None
        self.naming_routes: NamingRoutes | None = None
        route = self._route
        route("GET", "/nacos/v1/console/health/liveness", self.liveness, Api.V1)
        route("GET", "/nacos/v1/console/health/readiness", self.readiness, Api.V1)
        route("GET", "/nacos/actuator/prometheus", self.prometheus, Api.V1)
        route("GET", "/nacos/v1/console/server/state", self.server_state, Api.V1)
        route("GET", "/nacos/v1/core/cluster/nodes", self.cluster_nodes, Api.CORE, ADMIN)
        route("GET", "/nacos/v2/core/cluster/node/list", self.cluster_nodes_v2, Api.V2, ADMIN)
        if naming is not None:
            self.naming_routes = NamingRoutes(config, naming, status.is_serving, self.forwarder.owner_of,
                                              self.forwarder.forward)
            self._naming_routes(self.naming_routes)
            self._console_routes(ConsoleRoutes(naming))
            if config.prometheus_sd_enabled:
                sd = PrometheusSdRoutes(naming, auth)
                route("GET", "/nacos/prometheus", sd.all_targets, Api.V1)
                route("GET", "/nacos/prometheus/namespaceId/{namespaceId}", sd.namespace_targets, Api.V1)
                route("GET", "/nacos/prometheus/namespaceId/{namespaceId}/service/{service}", sd.service_targets,
                      Api.V1)
        if auth is not None:
            self._auth_routes(AuthRoutes(auth))

    def _naming_routes(self, n: NamingRoutes) -> None:
        route = self._route
        for api, base, register, deregister, update, detail, listing in (
            (Api.V1, "/nacos/v1/ns", n.v1_register, n.v1_deregister, n.v1_update, n.v1_detail, n.v1_list),
            (Api.V2, "/nacos/v2/ns", n.v2_register, n.v2_deregister, n.v2_update, n.v2_detail, n.v2_list),
        ):
            route("POST", f"{base}/instance", register, api, WRITE, distro=True)
            route("DELETE", f"{base}/instance", deregister, api, WRITE, distro=True)
            route("PUT", f"{base}/instance", update, api, WRITE)  # routed by the handler, to the publisher
            route("GET", f"{base}/instance", detail, api, READ)
            route("GET", f"{base}/instance/list", listing, api, READ)
            route("PUT", f"{base}/instance/beat", n.beat, api, WRITE, distro=True)
        route("PATCH", "/nacos/v1/ns/instance", n.v1_patch, Api.V1, WRITE)  # routed by the handler, as PUT
        for api, base, create, delete, update, detail, listing in (
            (Api.V1, "/nacos/v1/ns", n.v1_service_create, n.v1_service_delete, n.v1_service_update,
             n.v1_service_detail, n.v1_service_list),
            (Api.V2, "/nacos/v2/ns", n.v2_service_create, n.v2_service_delete, n.v2_service_update,
             n.v2_service_detail, n.v2_service_list),
        ):
            route("POST", f"{base}/service", create, api, WRITE)
            route("DELETE", f"{base}/service", delete, api, WRITE)
            route("PUT", f"{base}/service", update, api, WRITE)
            route("GET", f"{base}/service", detail, api, READ)
            route("GET", f"{base}/service/list", listing, api, READ)
        route("PUT", "/nacos/v1/ns/cluster", n.v1_cluster_update, Api.V1, WRITE)
        route("PUT", "/nacos/v1/ns/health", n.v1_health_update, Api.V1, WRITE)
        route("PUT", "/nacos/v1/ns/health/instance", n.v1_health_update, Api.V1, WRITE)
        route("GET", "/nacos/v1/ns/operator/metrics", n.v1_metrics, Api.V1)
        route("GET", "/nacos/v1/ns/ops/metrics", n.v1_metrics, Api.V1)
        route("GET", "/nacos/v2/ns/operator/metrics", n.v2_metrics, Api.V2)
        route("GET", "/nacos/v2/ns/client/list", n.v2_client_list, Api.V2, ADMIN)
        route("GET", "/nacos/v2/ns/client", n.v2_client_detail, Api.V2, ADMIN)
        route("GET", "/nacos/v2/ns/client/publish/list", n.v2_client_publications, Api.V2, ADMIN)
        route("GET", "/nacos/v2/ns/client/subscribe/list", n.v2_client_subscriptions, Api.V2, ADMIN)

    def _console_routes(self, c: ConsoleRoutes) -> None:
        route = self._route
        route("GET", "/nacos/v1/ns/catalog/services", c.v1_catalog_services, Api.V1, READ)
        route("GET", "/nacos/v1/ns/catalog/instances", c.v1_catalog_instances, Api.V1, READ)
        route("GET", "/nacos/v1/ns/catalog/service", c.v1_catalog_service, Api.V1, READ)
        route("GET", "/nacos/v1/ns/service/subscribers", c.v1_service_subscribers, Api.V1, READ)
        route("GET", "/nacos/v1/ns/service/names", c.v1_service_names, Api.V1, READ)
        route("GET", "/nacos/v2/ns/catalog/instances", c.v2_catalog_instances, Api.V2, READ)
        route("GET", "/nacos/v2/ns/client/service/publisher/list", c.v2_service_publishers, Api.V2, READ)
        route("GET", "/nacos/v2/ns/client/service/subscriber/list", c.v2_service_subscribers, Api.V2, READ)
        # The console's pages: public files (the login happens in the page, as in Nacos).
        route("GET", "/nacos", c.redirect, Api.V1)
        route("GET", "/nacos/", c.index, Api.V1)
        route("GET", "/nacos/index.html", c.index, Api.V1)
        route("GET", "/nacos/console/{name}", c.static, Api.V1)

    def set_persistent(self, persistent: PersistentNaming) -> None:
        """Serve persistent instances and service metadata from the CP store (issue 12)."""
        if self.naming_routes is not None:
            self.naming_routes.persistent = persistent

    def _auth_routes(self, a: AuthRoutes) -> None:
        route = self._route
        route("POST", "/nacos/v1/auth/login", a.login, Api.V1)
        route("POST", "/nacos/v1/auth/users/login", a.login, Api.V1)
        route("POST", "/nacos/v1/auth/users/admin", a.create_admin, Api.CORE)
        route("POST", "/nacos/v1/auth/users", a.create_user, Api.CORE, ADMIN)
        route("DELETE", "/nacos/v1/auth/users", a.delete_user, Api.CORE, ADMIN)
        route("PUT", "/nacos/v1/auth/users", a.update_user, Api.CORE, IDENTITY)
        route("GET", "/nacos/v1/auth/users", a.list_users, Api.CORE, ADMIN)
        route("GET", "/nacos/v1/auth/users/search", a.search_users, Api.CORE, ADMIN)
        route("POST", "/nacos/v1/auth/roles", a.add_role, Api.CORE, ADMIN)
        route("DELETE", "/nacos/v1/auth/roles", a.delete_role, Api.CORE, ADMIN)
        route("GET", "/nacos/v1/auth/roles", a.list_roles, Api.CORE, ADMIN)
        route("GET", "/nacos/v1/auth/roles/search", a.search_roles, Api.CORE, ADMIN)
        route("POST", "/nacos/v1/auth/permissions", a.add_permission, Api.CORE, ADMIN)
        route("DELETE", "/nacos/v1/auth/permissions", a.delete_permission, Api.CORE, ADMIN)
        route("GET", "/nacos/v1/auth/permissions", a.list_permissions, Api.CORE, ADMIN)

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, handle_signals=False, **access_log.runner_options(self.config))
        await self._runner.setup()
        ssl_context = self.tls.server_context() if self.tls is not None else None
        site = web.TCPSite(self._runner, self.config.host, self.config.port, reuse_address=True,
                           ssl_context=ssl_context)
        await site.start()
        log.info("HTTP listening on %s:%d (%s)", self.config.host, self.config.port, describe_tls(self.tls))

    async def stop(self) -> None:
        await self.forwarder.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def add_route(self, method: str, path: str, handler: RouteHandler, api: Api, auth: str | None = None,
                  distro: bool = False) -> None:
        """Add a route from outside (e.g. the node's admin endpoints) through the same wrapper;
        ``distro`` routes an ephemeral write to the node responsible for its ``ip:port``."""
        self._route(method, path, handler, api, auth, distro)

    # --- the wrapper (Nacos's filter chain) ---------------------------------------------------
    def _route(self, method: str, path: str, handler: RouteHandler, api: Api, auth: str | None = None,
               distro: bool = False) -> None:
        metrics, forwarder = self.metrics, self.forwarder

        async def serve(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            try:
                params = await read_params(request)
                if auth is not None and self.auth is not None and self.auth.enabled:
                    await self._authorize(request, params, auth)
                if distro and not persistent_write(params):  # CP writes need no owner: any node writes
                    tag = distro_tag(params)
                    owner = forwarder.owner_of(tag)
                    if owner is not None:
                        forwarded = await forwarder.forward(request, owner, tag)
                        if forwarded is not None:  # None: the owner is not answering, handle it here
                            metrics.request("http", path, forwarded.status, time.perf_counter() - started, method)
                            return forwarded
                response = await handler(request, params)
            except NacosError as exc:
                response = error_response(api, exc)
            except web.HTTPException:
                raise
            except Exception as exc:
                self.garbage.log(logging.ERROR, f"unexpected {type(exc).__name__} {path}", "unexpected failure "
                                 "answering %s %s", request.method, request.path, exc_info=True)
                response = web.Response(status=NacosError.http_status, text="server error")
            metrics.request("http", path, response.status, time.perf_counter() - started, method)
            return response

        self.app.router.add_route(method, path, serve)

    async def _authorize(self, request: web.Request, params: Params, requirement: str) -> None:
        assert self.auth is not None
        identity = await self._identity(request, params)
        request[IDENTITY_KEY] = identity
        if requirement == IDENTITY:
            return
        if requirement == ADMIN:
            self.auth.authorize(identity, None, READ)
            return
        raw = params.text("serviceName")
        group = params.text("groupName") or DEFAULT_GROUP
        if GROUP_SEPARATOR in raw:
            group, _, raw = raw.partition(GROUP_SEPARATOR)
        self.auth.authorize(identity, naming_resource(params.text("namespaceId"), group, raw), requirement)

    async def _identity(self, request: web.Request, params: Params) -> Identity:
        """Token from ``accessToken`` (param or header) or ``Authorization: Bearer``; else
        ``username``/``password`` sent with the request (docs/protocol.md §5.6). A request that
        carries the cluster identity header (``nacos.core.auth.server.identity.key/.value``)
        passes as an admin, as Nacos's AuthFilter lets server-identity requests through."""
        assert self.auth is not None
        identity_key = self.config.cluster_identity_key
        if identity_key and hmac.compare_digest(request.headers.get(identity_key, "").encode(),
                                                self.config.cluster_identity_value.encode()):
            return CLUSTER_IDENTITY
        token = params.text("accessToken") or request.headers.get("accessToken", "")
        if not token:
            bearer = request.headers.get("Authorization", "")
            if bearer[:7].lower() == "bearer ":
                token = bearer[7:].strip()
        if token:
            return self.auth.identity(token)
        username, password = params.text("username"), params.get("password")
        if username and password:
            return await self.auth.identity_from_credentials(username, password, request.remote or "unknown")
        raise Forbidden("user not found!")

    # --- small endpoints -----------------------------------------------------------------------
    async def liveness(self, request: web.Request, params: Params) -> web.Response:
        return web.Response(text="OK")

    async def readiness(self, request: web.Request, params: Params) -> web.Response:
        problem = self.status.readiness_problem()
        if problem is None:
            return web.Response(text="OK")
        return web.Response(status=HttpStatus.INTERNAL_SERVER_ERROR, text=problem)

    async def prometheus(self, request: web.Request, params: Params) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def server_state(self, request: web.Request, params: Params) -> web.Response:
        """Nacos's ServerStateController answer (strings), and which transport and kernels this node runs."""
        cluster = bool(self.config.members or self.config.cluster_conf)
        state = {
            "version": f"shoal-{__version__}",
            "standalone_mode": "cluster" if cluster else "standalone",
            "function_mode": "naming",
            "auth_enabled": str(self.config.auth_enabled).lower(),
            "login_page_enabled": str(self.config.auth_enabled).lower(),
            "console_ui_enabled": "true",
            "shoal_transport": transport_name(self.config),
            "shoal_kernels": ",".join(f"{k}={v}" for k, v in sorted(kernels.implementation().items())),
        }
        return web.Response(text=dumps(state), content_type="application/json")

    def _member_list(self, params: Params, address_key: str) -> list[dict[str, object]]:
        members = self.members.members() if self.members is not None else [self_member_json(self.config)]
        keyword = params.text(address_key)
        state = params.text("state").upper()
        return [m for m in members if (not keyword or keyword in str(m.get("address", "")))
                and (not state or str(m.get("state", "")) == state)]

    async def cluster_nodes(self, request: web.Request, params: Params) -> web.Response:
        return core_ok(self._member_list(params, "keyword"))

    async def cluster_nodes_v2(self, request: web.Request, params: Params) -> web.Response:
        return v2_ok(dumps(self._member_list(params, "address")))


def self_member_json(config: Config) -> dict[str, object]:
    """A standalone node's own Member JSON."""
    host = config.host if config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return StandaloneMembers(host, config.port).members()[0]
