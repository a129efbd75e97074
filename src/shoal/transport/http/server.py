"""The main-port HTTP listener (aiohttp on the node's one event loop).

Its own routes (:meth:`HttpServer.routes`): the console health probes
(``/nacos/v1/console/health/liveness`` and ``/readiness``), ``/nacos/actuator/prometheus``, the
server state and the cluster member list (``/nacos/v1/core/cluster/nodes``,
``/nacos/v2/core/cluster/node/list``); a worker of a node of workers answers the metrics for the
node on the node's port (:meth:`HttpServer.asks_node`, ``node_scrape.py``). Every other route
module's table is installed beside them by the composition root through
:meth:`HttpServer.install` (see ``routes.py``).

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
from collections.abc import Iterable
from typing import Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from shoal import __version__, kernels
from shoal.auth.service import ADMIN_APIS, CLIENT, CONSOLE, READ, AuthService, Identity, naming_resource
from shoal.config import Config
from shoal.errors import HttpStatus, NacosError
from shoal.logutil import RateLimitedLog
from shoal.metrics import Metrics
from shoal.model.keys import DEFAULT_GROUP, GROUP_SEPARATOR
from shoal.tls import PortTls
from shoal.tls import describe as describe_tls
from shoal.transport.http import access_log
from shoal.transport.http.api import Api, core_ok, dumps, error_response, v2_ok
from shoal.transport.http.auth_routes import IDENTITY_KEY
from shoal.transport.http.bad_requests import Runner
from shoal.transport.http.forward import Forwarder, MemberView, Standalone, StandaloneMembers
from shoal.transport.http.naming import distro_tag, persistent_write
from shoal.transport.http.node_scrape import NodeScrape, merge_expositions
from shoal.transport.http.params import Params, read_params
from shoal.transport.http.routes import ADMIN, IDENTITY, Handler, Route
from shoal.transport.selection import transport_name
from shoal.transport.sharing import WORKER_HEADER, PortSharing

log = logging.getLogger(__name__)

#: Who a request carrying the cluster identity header is (it passes every check, as in Nacos).
CLUSTER_IDENTITY = Identity("(cluster identity)", True)


#: Path prefixes of the console's APIs (nacos.core.auth.console.enabled) and of the admin APIs
#: (nacos.core.auth.admin.enabled); an admin-only route elsewhere is an admin API too, every other
#: guarded route a client API (nacos.core.auth.enabled). docs/protocol.md §5.6.
CONSOLE_PREFIXES = ("/nacos/v1/console/", "/nacos/v2/console/", "/nacos/v3/console/", "/nacos/v1/ns/catalog/",
                    "/nacos/v2/ns/catalog/")
ADMIN_PREFIXES = ("/nacos/v3/admin/", "/nacos/v1/auth/", "/nacos/v3/auth/")


def api_family(path: str, requirement: str | None) -> str:
    """Which of Nacos 3.x's switches guards a route."""
    if path.startswith(CONSOLE_PREFIXES):
        return CONSOLE
    if requirement == ADMIN or path.startswith(ADMIN_PREFIXES):
        return ADMIN_APIS
    return CLIENT


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

    def __init__(self, config: Config, status: NodeStatus, metrics: Metrics, auth: AuthService | None = None,
                 forwarder: Forwarder | None = None, members: MemberView | None = None,
                 tls: PortTls | None = None, sharing: PortSharing | None = None,
                 scrape: NodeScrape | None = None) -> None:
        self.config = config
        self.sharing = sharing  # a worker's: the public port shared, its private one, its name on answers
        self.scrape = scrape  # a worker's: its siblings' figures, for a scrape of the node's port
        self.status = status
        self.metrics = metrics
        self.auth = auth
        self.tls = tls  # None: plaintext
        # Peers serve HTTPS when this node does (one cluster, one setting): forward over it too.
        self.forwarder = forwarder if forwarder is not None else Forwarder(
            Standalone(), config.http_forward_timeout_ms, tls.client_context() if tls is not None else None)
        self.members = members
        self.garbage = RateLimitedLog(log)  # unexpected failures: one traceback per kind per interval
        logging.getLogger("aiohttp.server").addFilter(BAD_HTTP_FILTER)  # idempotent: one instance
        self.app = web.Application(client_max_size=config.max_inbound_message_size)
        if sharing is not None:  # which worker answered, on every answer (errors and 404s too)
            worker = str(sharing.worker)

            async def name_worker(request: web.Request, response: web.StreamResponse) -> None:
                response.headers[WORKER_HEADER] = worker

            self.app.on_response_prepare.append(name_worker)
        self._runner: web.AppRunner | None = None

    def routes(self) -> list[Route]:
        """This server's own endpoints: health probes, metrics, server state, cluster members."""
        return [
            Route("GET", "/nacos/v1/console/health/liveness", self.liveness, api=Api.V1),
            Route("GET", "/nacos/v1/console/health/readiness", self.readiness, api=Api.V1),
            Route("GET", "/nacos/actuator/prometheus", self.prometheus, api=Api.V1),
            Route("GET", "/nacos/v1/console/server/state", self.server_state, api=Api.V1),
            Route("GET", "/nacos/v1/core/cluster/nodes", self.cluster_nodes, ADMIN, api=Api.CORE),
            Route("GET", "/nacos/v2/core/cluster/node/list", self.cluster_nodes_v2, ADMIN, api=Api.V2),
        ]

    def install(self, routes: Iterable[Route]) -> list[str]:
        """Serve every route of ``routes`` through the wrapper (the one way routes are added);
        returns the ``METHOD path`` of each."""
        added = []
        for r in routes:
            self._route(r.method, r.path, r.handler, r.api, r.auth, r.distro)
            added.append(f"{r.method} {r.path}")
        return added

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._runner = Runner(self.app, handle_signals=False, **access_log.runner_options(self.config))
        await self._runner.setup()
        # a worker: its private port now, the node's port (shared) once it serves (share())
        await self._listen(self.config.port if self.sharing is None else self.sharing.http_port, shared=False)

    async def share(self) -> None:
        """A worker's: listen on the node's port too, beside its sibling workers (SO_REUSEPORT)."""
        await self._listen(self.config.port, shared=True)

    async def _listen(self, port: int, shared: bool) -> None:
        assert self._runner is not None
        ssl_context = self.tls.server_context() if self.tls is not None else None
        site = web.TCPSite(self._runner, self.config.host, port, reuse_address=True, reuse_port=shared or None,
                           ssl_context=ssl_context)
        await site.start()
        log.info("HTTP listening on %s:%d (%s%s)", self.config.host, port, describe_tls(self.tls),
                 ", shared with the node's workers" if shared else "")

    async def stop(self) -> None:
        await self.forwarder.stop()
        if self.scrape is not None:
            await self.scrape.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the wrapper (Nacos's filter chain) ---------------------------------------------------
    def _route(self, method: str, path: str, handler: Handler, api: Api, auth: str | None = None,
               distro: bool = False) -> None:
        metrics, forwarder = self.metrics, self.forwarder
        guarded = auth is not None and self.auth is not None and self.auth.guards(api_family(path, auth))

        async def serve(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            try:
                params = await read_params(request)
                if guarded and auth is not None:
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
        raise self.auth.refusal()

    # --- small endpoints -----------------------------------------------------------------------
    async def liveness(self, request: web.Request, params: Params) -> web.Response:
        return web.Response(text="OK")

    async def readiness(self, request: web.Request, params: Params) -> web.Response:
        problem = self.status.readiness_problem()
        if problem is None:
            return web.Response(text="OK")
        return web.Response(status=HttpStatus.INTERNAL_SERVER_ERROR, text=problem)

    def asks_node(self, request: web.Request) -> bool:
        """True when a worker was asked on its node's public port, so it answers for the node; False
        on its private port (where its siblings ask it for its own figures) and in a single process."""
        if self.sharing is None or request.transport is None:
            return False
        sockname = request.transport.get_extra_info("sockname")
        return isinstance(sockname, tuple) and len(sockname) >= 2 and sockname[1] != self.sharing.http_port

    async def prometheus(self, request: web.Request, params: Params) -> web.Response:
        """This process's registry; a worker asked on its node's port merges its siblings' in
        (``node_scrape.py``)."""
        body = self.metrics.render()
        if self.scrape is not None and self.asks_node(request):
            index = self.sharing.worker if self.sharing is not None else 0
            body = merge_expositions([(index, body), *await self.scrape.gather()])
        return web.Response(body=body, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def server_state(self, request: web.Request, params: Params) -> web.Response:
        return web.Response(text=dumps(self.state()), content_type="application/json")

    def state(self) -> dict[str, str]:
        """Nacos's ServerStateController answer (strings), and which transport and kernels this node runs."""
        cluster = bool(self.config.members or self.config.cluster_conf)
        return {
            "version": f"shoal-{__version__}",
            "standalone_mode": "cluster" if cluster else "standalone",
            "function_mode": "naming",
            "auth_enabled": str(self.config.auth_enabled).lower(),
            "login_page_enabled": str(self.config.auth_console_enabled).lower(),
            "auth_admin_enabled": str(self.config.auth_admin_enabled).lower(),
            # Nacos's console asks for the first admin's password while this is "true".
            "auth_admin_request": str(self.auth is not None and self.auth.needs_first_admin()).lower(),
            "console_ui_enabled": "true",
            "shoal_transport": transport_name(self.config),
            "shoal_kernels": ",".join(f"{k}={v}" for k, v in sorted(kernels.implementation().items())),
        }

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
