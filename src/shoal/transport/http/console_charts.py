"""``GET /nacos/v1/console/cluster/charts``: the series behind the console's cluster charts
(issue 23 item 6), :class:`~shoal.metrics_history.ChartHistory`'s ring buffer as JSON.

``{"intervalMs","windowMs","capacity","samples":[{"time","requests":{kind: per second},
"pushes","pushP99Ms","connections","instances","sync":{peer:{"pending","failed"}},
"disagreements"}]}``, oldest first; times are wall-clock epoch ms (docs/protocol.md §5.3).
An admin route, as the cluster page's other figures.
"""

from __future__ import annotations

from aiohttp import web

from shoal.metrics_history import ChartHistory
from shoal.transport.http.api import Api, dumps, json_text
from shoal.transport.http.params import Params
from shoal.transport.http.routes import ADMIN, Route


class ChartRoutes:
    """The cluster page's chart series."""

    def __init__(self, history: ChartHistory) -> None:
        self.history = history

    def routes(self) -> list[Route]:
        return [Route("GET", "/nacos/v1/console/cluster/charts", self.charts, ADMIN, api=Api.V1)]

    async def charts(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(self.history.to_json()))
