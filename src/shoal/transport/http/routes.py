"""How an HTTP route is declared, the one way: each route module's class exposes
``routes(...) -> list[Route]``, and the composition root (``shoal.app``) installs every table in
one place through :meth:`shoal.transport.http.server.HttpServer.install`, so every route runs
behind the same wrapper (params → auth → DistroFilter when ``distro`` → handler → the ``api``
generation's error shape)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from aiohttp import web

from shoal.transport.http.api import Api
from shoal.transport.http.params import Params

Handler = Callable[[web.Request, Params], Awaitable[web.StreamResponse]]

#: Auth requirements of a route besides READ / WRITE on a naming resource.
ADMIN = "admin"
IDENTITY = "identity"


class Route(NamedTuple):
    """One row of a route table."""

    method: str
    path: str
    handler: Handler
    auth: str | None = None  # READ / WRITE on the request's service, ADMIN or IDENTITY; None: open
    distro: bool = False  # an ephemeral write goes to the node responsible for its ip:port
    api: Api = Api.V2
