"""``/nacos/v2/core/loader/*`` (Nacos ServerLoaderController shapes), the v3 ``Result`` answers of
``/nacos/v3/admin/core/loader/*`` (ServerLoaderControllerV3: ``current`` and ``cluster`` GET, the
reloads POST), and the peer calls behind them.

* ``GET current``: this node's connections, ``{connectionId: {"metaInfo": {...}, ...}}``.
* ``GET cluster``: every member's loader metrics with max/min/avg/threshold/total.
* ``GET reloadCurrent?count=N[&redirectAddress=ip:port]``: keep N SDK connections, move the rest.
* ``GET smartReloadCluster[?loaderFactor=0.1]``: ``Ok`` or ``Fail``.
* ``GET reloadClient?connectionId=..[&redirectAddress=..]``.

A member's own metrics come from the Shoal-only ``GET /nacos/v1/shoal/loader/metrics``; peers
are called over HTTP with the cluster identity header (which passes them as admins).

A node of workers answers as one node on its public port: ``current`` lists every worker's
connections, ``metrics`` sums the workers' figures, ``reloadCurrent`` and ``reloadClient`` act on
the node's connections. On a worker's private port (where its siblings ask it) each answers for
that worker alone, so a sibling's answer never asks further.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from shoal.config import Config
from shoal.errors import V2_TEXT, V2Code
from shoal.health.rebalance import ServerLoader
from shoal.tls import PortTls
from shoal.transport.http.api import Api, dumps, json_text, ok_text, v2_ok
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

log = logging.getLogger(__name__)

PEER_TIMEOUT_S = 1.0  # ServerLoaderController waits 1 s for the members' metrics
SMART_RELOAD_FAILED = "Smart reload failed, please try again later."


class LoaderRoutes:
    """The loader API over a :class:`ServerLoader` (Nacos ServerLoaderController, and
    ServerLoaderControllerV3 for ``/nacos/v3/admin/core/loader``): one action per operation,
    answered in the v2 generation's shapes (plain text, bare JSON) or in the 3.x ``Result``."""

    def __init__(self, loader: ServerLoader, connections: Any, asks_node: Callable[[web.Request], bool],
                 peers: HttpLoaderPeers | None = None) -> None:
        """``asks_node``: whether a request came to a worker on its node's public port (then it is
        answered for the node, its siblings asked through ``peers``)."""
        self.loader = loader
        self.connections = connections
        self.asks_node = asks_node
        self.peers = peers

    # --- the actions ------------------------------------------------------------------------
    def _current(self) -> dict[str, Any]:
        answer: dict[str, Any] = {}
        for conn in list(self.connections.by_id.values()):
            if not conn.registered or conn.closed:
                continue
            answer[conn.connection_id] = {
                "traced": False, "abilityTable": {},
                "metaInfo": {"connectType": "GRPC", "clientIp": conn.client_ip, "localPort": 0,
                             "version": conn.client_version, "connectionId": conn.connection_id,
                             "createTime": conn.created_ms, "lastActiveTime": self.connections.last_active_ms(conn),
                             "appName": conn.app, "tenant": conn.tenant, "labels": conn.labels,
                             "remoteIp": conn.remote_ip, "remotePort": conn.remote_port}}
        return answer

    async def _node_current(self, request: web.Request) -> dict[str, Any]:
        """This worker's connections, and on the node's port its siblings' too."""
        answer = self._current()
        siblings = self.loader.siblings()
        if self.peers is not None and siblings and self.asks_node(request):
            peers = self.peers
            for part in await asyncio.gather(*(peers.current(a) for _, a in siblings)):
                answer.update(part or {})
        return answer

    async def _reload_count(self, request: web.Request, params: Params) -> None:
        count, redirect = params.integer("count", low=0), params.text("redirectAddress")
        if self.asks_node(request):
            await self.loader.node_reload_count(count, redirect)
        else:
            await self.loader.reload_count(count, redirect)

    async def _reload_client(self, request: web.Request, connection_id: str, redirect: str) -> None:
        if self.asks_node(request):
            await self.loader.node_reload_client(connection_id, redirect)
        else:
            await self.loader.reload_client(connection_id, redirect)

    async def _smart_reload(self, params: Params) -> bool:
        return await self.loader.smart_reload(params.number("loaderFactor", 0.1))

    # --- v2 (ServerLoaderController) -----------------------------------------------------------
    async def current(self, request: web.Request, params: Params) -> web.Response:
        return json_text(dumps(await self._node_current(request)))

    async def cluster(self, request: web.Request, params: Params) -> web.Response:
        return json_text(dumps(await self.loader.cluster_summary()))

    async def reload_current(self, request: web.Request, params: Params) -> web.Response:
        await self._reload_count(request, params)
        return ok_text("success")

    async def smart_reload(self, request: web.Request, params: Params) -> web.Response:
        return ok_text("Ok" if await self._smart_reload(params) else "Fail")

    async def reload_client(self, request: web.Request, params: Params) -> web.Response:
        await self._reload_client(request, params.text("connectionId"), params.text("redirectAddress"))
        return ok_text("success")

    async def metrics(self, request: web.Request, params: Params) -> web.Response:
        """This node's loader metrics (ServerLoaderInfo's ``loaderMetrics``): on a worker's private
        port its own, on the node's port every worker's summed."""
        metric = await self.loader.node_metrics() if self.asks_node(request) else self.loader.local_metrics()
        return json_text(dumps(metric))

    # --- v3 (ServerLoaderControllerV3): Result<...>; the writes answer data null ----------------
    async def v3_current(self, request: web.Request, params: Params) -> web.Response:
        return v2_ok(dumps(await self._node_current(request)))

    async def v3_cluster(self, request: web.Request, params: Params) -> web.Response:
        return v2_ok(dumps(await self.loader.cluster_summary()))

    async def v3_reload_current(self, request: web.Request, params: Params) -> web.Response:
        await self._reload_count(request, params)
        return v2_ok("null")

    async def v3_smart_reload(self, request: web.Request, params: Params) -> web.Response:
        """A refused smart reload is HTTP 200 with code 30000 (``Result.failure``), as 3.x answers it."""
        if await self._smart_reload(params):
            return v2_ok("null")
        return json_text(dumps({"code": V2Code.SERVER_ERROR, "message": V2_TEXT[V2Code.SERVER_ERROR],
                                "data": SMART_RELOAD_FAILED}))

    async def v3_reload_client(self, request: web.Request, params: Params) -> web.Response:
        await self._reload_client(request, params.required("connectionId"), params.text("redirectAddress"))
        return v2_ok("null")

    def routes(self, admin: str) -> list[Route]:
        """The v2 routes (all GET, as Nacos 2.x) and the members' metrics route; the v3 ones are
        in the v3 route table (``transport/http/v3_core.py``)."""
        prefix = "/nacos/v2/core/loader"
        return [
            Route("GET", f"{prefix}/current", self.current, admin, api=Api.CORE),
            Route("GET", f"{prefix}/cluster", self.cluster, admin, api=Api.CORE),
            Route("GET", f"{prefix}/reloadCurrent", self.reload_current, admin, api=Api.CORE),
            Route("GET", f"{prefix}/smartReloadCluster", self.smart_reload, admin, api=Api.CORE),
            Route("GET", f"{prefix}/reloadClient", self.reload_client, admin, api=Api.CORE),
            Route("GET", "/nacos/v1/shoal/loader/metrics", self.metrics, admin, api=Api.CORE),
        ]


class HttpLoaderPeers:
    """:class:`shoal.health.rebalance.LoaderPeers` over the members' HTTP ports."""

    def __init__(self, config: Config, tls: PortTls | None) -> None:
        self.config = config
        self.scheme = "https" if tls is not None else "http"
        self.ssl = tls.client_context() if tls is not None else None
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": "Nacos-Server"}
        if self.config.cluster_identity_key:
            headers[self.config.cluster_identity_key] = self.config.cluster_identity_value
        return headers

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl) if self.ssl is not None else None
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S),
                                                  connector=connector)
        return self._session

    async def _get(self, address: str, path: str, params: dict[str, str]) -> tuple[int, str] | None:
        try:
            async with self._client().get(f"{self.scheme}://{address}{path}", params=params,
                                          headers=self._headers()) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("loader call %s to %s failed: %s", path, address, exc)
            return None

    async def _get_object(self, address: str, path: str) -> dict[str, Any] | None:
        """A JSON object answered 200 at ``path`` (None: no answer, another status, or no object)."""
        answer = await self._get(address, path, {})
        if answer is None or answer[0] != 200:
            return None
        try:
            data = json.loads(answer[1])
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def current(self, address: str) -> dict[str, Any] | None:
        """A sibling worker's own connections (the loader's ``current`` on its private port)."""
        return await self._get_object(address, "/nacos/v2/core/loader/current")

    async def metrics(self, address: str) -> dict[str, str] | None:
        data = await self._get_object(address, "/nacos/v1/shoal/loader/metrics")
        return None if data is None else {str(k): str(v) for k, v in data.items()}

    async def reload(self, address: str, count: int, redirect: str) -> bool:
        answer = await self._get(address, "/nacos/v2/core/loader/reloadCurrent",
                                 {"count": str(count), "redirectAddress": redirect})
        return answer is not None and answer[0] == 200

    async def reload_client(self, address: str, connection_id: str, redirect: str) -> bool:
        answer = await self._get(address, "/nacos/v2/core/loader/reloadClient",
                                 {"connectionId": connection_id, "redirectAddress": redirect})
        return answer is not None and answer[0] == 200

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
