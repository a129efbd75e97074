"""The instance history of this node, over HTTP (issue 23 item 5; docs/protocol.md, "Instance history").

- ``GET /nacos/v1/shoal/history?service=NAME[&ip=IP][&since=MS][&limit=N]``: the instance rows
  of the service (``name``, ``group@@name`` or ``namespace/group@@name``), oldest first;
- ``GET /nacos/v1/shoal/history/subscriber?clientId=ID&at=MS[&service=NAME]``: per service, the
  list the subscriber held at ``at`` (its last push acked at or before it).

Both need an admin. With ``shoal.history.enabled=false`` they answer 501 (the function is off).
"""

from __future__ import annotations

from aiohttp import web

from shoal.errors import FunctionDisabled, InvalidParam
from shoal.export.history import HistoryLog
from shoal.export.history_rows import parse_service
from shoal.transport.http.api import Api, dumps, json_text
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

HISTORY_PATH = "/nacos/v1/shoal/history"
SUBSCRIBER_PATH = "/nacos/v1/shoal/history/subscriber"
#: Rows one answer holds at most (the newest).
MAX_ROWS = 100_000


class HistoryRoutes:
    """The history log's two reads."""

    def __init__(self, history: HistoryLog | None, node: str) -> None:
        self.history = history
        self.node = node

    def routes(self, admin: str) -> list[Route]:
        return [
            Route("GET", HISTORY_PATH, self.instances, admin, api=Api.V1),
            Route("GET", SUBSCRIBER_PATH, self.subscriber, admin, api=Api.V1),
        ]

    def _log(self) -> HistoryLog:
        if self.history is None:
            raise FunctionDisabled("the instance history is off on this node (shoal.history.enabled=false)")
        return self.history

    async def instances(self, request: web.Request, p: Params) -> web.Response:
        history = self._log()
        service = _service(p.required("service"))
        rows = await history.instance_rows(service, p.text("ip"), p.integer("since", 0, low=0),
                                           p.integer("limit", 10_000, low=1, high=MAX_ROWS))
        return json_text(dumps({"node": self.node, "rows": rows, "log": history.figures()}))

    async def subscriber(self, request: web.Request, p: Params) -> web.Response:
        history = self._log()
        client_id = p.required("clientId")
        at = p.integer("at", low=0)
        service = _service(p.text("service")) if p.text("service") else None
        held = await history.held(client_id, at, service)
        return json_text(dumps({"node": self.node, "subscriber": client_id, "at": at, "services": held}))


def _service(text: str) -> tuple[str, str, str]:
    try:
        return parse_service(text)
    except ValueError as exc:
        raise InvalidParam(str(exc)) from None
