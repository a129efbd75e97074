"""The Nacos modules Shoal does not have, answered as a Nacos whose module is off (docs/protocol.md
§5.7): HTTP **501** with ``{"code":40001,"message":"API function disabled.","data":<why>}``
(:class:`~shoal.errors.FunctionDisabled`, Nacos's ``NacosApiException(SERVER_NOT_IMPLEMENTED,
API_FUNCTION_DISABLED, ...)`` of its console's no-op handlers), on every method and path below
the module's prefixes, never a plain-text 404.

* the config module: ``/nacos/v1/cs/``, ``/nacos/v2/cs/``, ``/nacos/v3/console/cs/`` (the admin
  and client ``/nacos/v3/{admin,client}/cs/`` are :mod:`~shoal.transport.http.v3_core`'s);
* the AI registries (MCP, A2A, prompts, agents, skills): ``/nacos/v3/admin/ai/``,
  ``/nacos/v3/console/ai/`` and the clients' ``/nacos/v3/client/ai/`` (nacos-sdk-python 3.x reads
  prompts and skills there).

Over gRPC Nacos has no such answer: a request whose handler is not loaded is
``ErrorResponse`` 302 ``RequestHandler Not Found`` (GrpcRequestAcceptor), which Shoal already
answers for every config, lock, AI and other module request (docs/protocol.md §3.12).
"""

from __future__ import annotations

from aiohttp import web

from shoal.errors import FunctionDisabled
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Handler, Route

#: Module prefix → what Nacos says when that module is off.
DISABLED = {
    "/nacos/v1/cs": "Current functionMode is `naming`, config module is disabled.",
    "/nacos/v2/cs": "Current functionMode is `naming`, config module is disabled.",
    "/nacos/v3/console/cs": "Current functionMode is `naming`, config module is disabled.",
    "/nacos/v3/admin/ai": "Nacos AI MCP module and API required both `naming` and `config` module.",
    "/nacos/v3/console/ai": "Nacos AI MCP module and API required both `naming` and `config` module.",
    "/nacos/v3/client/ai": "Nacos AI MCP module and API required both `naming` and `config` module.",
}


def _disabled(reason: str) -> Handler:
    async def handler(request: web.Request, p: Params) -> web.StreamResponse:
        raise FunctionDisabled(f"{reason} ({request.method} {request.path} is not offered by Shoal)")

    return handler


def routes() -> list[Route]:
    """Every method on each prefix and below it, answered 501 / 40001 (open: no module, nothing to guard)."""
    table = []
    for prefix, reason in DISABLED.items():
        handler = _disabled(reason)
        table += [Route("*", prefix, handler), Route("*", prefix + "/{tail:.*}", handler)]
    return table
