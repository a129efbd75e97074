"""The main-port HTTP listener.

For now it answers the console health probes (``/nacos/v1/console/health/liveness`` and
``/readiness``, 200 ``OK`` once the node serves) and ``/nacos/actuator/prometheus``. Unknown
paths answer 404 and an unexpected error 500 with a logged traceback, never a dead listener.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from shoal.config import Config
from shoal.metrics import Metrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class NodeStatus(Protocol):
    def is_serving(self) -> bool: ...

    def readiness_problem(self) -> str | None: ...


class HttpServer:
    def __init__(self, config: Config, status: NodeStatus, metrics: Metrics) -> None:
        self.config = config
        self.status = status
        self.metrics = metrics
        self.app = web.Application(middlewares=[self._errors], client_max_size=config.max_inbound_message_size)
        self.app.router.add_get("/nacos/v1/console/health/liveness", self.liveness)
        self.app.router.add_get("/nacos/v1/console/health/readiness", self.readiness)
        self.app.router.add_get("/nacos/actuator/prometheus", self.prometheus)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        log.info("HTTP listening on %s:%d", self.config.host, self.config.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            self.metrics.request("http", request.path if exc.status != 404 else "unknown", exc.status)
            raise
        except Exception:
            log.exception("unexpected failure answering %s %s", request.method, request.path)
            self.metrics.request("http", request.path, 500)
            return web.Response(status=500, text="server error")
        self.metrics.request("http", request.path, response.status)
        return response

    async def liveness(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def readiness(self, request: web.Request) -> web.Response:
        problem = self.status.readiness_problem()
        if problem is None:
            return web.Response(text="OK")
        return web.Response(status=500, text=problem)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})
