"""The Nacos 3.x HTTP surface (issue 15 item 1; docs/protocol.md §5.7): the route table, the
shared wrappers, and the client (OPEN_API) and auth routes. The admin routes are in
:mod:`shoal.transport.http.v3_naming` (``/nacos/v3/admin/ns``) and
:mod:`shoal.transport.http.v3_core` (``/nacos/v3/admin/core``).

Nacos 3.x refuses the v1/v2 admin APIs by default, so 3.x tools call ``/nacos/v3/...``. Its answers
are the v2 ``Result`` (``{"code":0,"message":"success","data":...}``) and its errors the v2
``ErrorCode``s with the HTTP status of the exception (NacosApiExceptionHandler), so the error
shape is :data:`Api.V2`'s. Every route calls the same handlers and use cases as v1/v2; only the
shapes that 3.x changed are built here:

* ``POST /nacos/v3/auth/user/login`` (UserControllerV3): the v1 login answer; the 3.x Java client
  tries it first and falls back to v1 only on 404.
* ``/nacos/v3/client/ns/instance`` (InstanceOpenApiController, OPEN_API: READ/WRITE on the
  service): register (``heartBeat=true`` renews instead and answers code 21003 when the instance
  is unknown), deregister, and ``/list`` with the hosts only, ``enabled=false`` left out.
* ``/nacos/v3/auth/{user,role,permission}`` (UserControllerV3 and co.): the v1 auth handlers in a
  Result, ``GET /nacos/v3/auth/permission``, the console's duplicate check, and ``user/search`` and
  ``role/search``: the matching names as ``Result<List<String>>``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from shoal import jsonfast
from shoal.auth.service import READ, WRITE, AdminExists
from shoal.errors import V2_TEXT, BeatCode, V2Code
from shoal.transport.http.api import Api, dumps, json_text, v2_ok
from shoal.transport.http.auth_routes import AuthRoutes
from shoal.transport.http.naming import NamingRoutes
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Handler, Route

CLIENT_INSTANCE = "/nacos/v3/client/ns/instance"
LOGIN = "/nacos/v3/auth/user/login"
AUTH_USER = "/nacos/v3/auth/user"
AUTH_ROLE = "/nacos/v3/auth/role"
AUTH_PERMISSION = "/nacos/v3/auth/permission"


# --- shared wrappers: an older generation's answer as a Result -----------------------------------
def text_of(raw: web.StreamResponse) -> str:
    """The text of a handler's answer (every handler wrapped here answers a text Response)."""
    assert isinstance(raw, web.Response) and raw.text is not None
    return raw.text


def message(handler: Handler) -> Handler:
    """A v1 auth write answered as a Result whose data is the v1 RestResult's message."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(jsonfast.loads(text_of(await handler(request, p))).get("message")))

    return wrapped


def ok(handler: Handler) -> Handler:
    """A v1 write (plain ``ok``) answered as ``Result<String>`` ``"ok"``."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        await handler(request, p)
        return v2_ok('"ok"')

    return wrapped


def body(handler: Handler) -> Handler:
    """A bare JSON answer (a v1 Page, the state map) answered as a Result around it."""

    async def wrapped(request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(text_of(await handler(request, p)))

    return wrapped


def failure(code: V2Code, message_text: str | None, data: Any = None) -> web.Response:
    """``Result.failure``: HTTP 200 with a non-zero code (a refusal 3.x answers without an exception)."""
    return json_text(dumps({"code": int(code), "message": message_text, "data": data}))


def _hosts(info_json: str) -> list[dict[str, Any]]:
    hosts = jsonfast.loads(info_json).get("hosts")
    return list(hosts) if isinstance(hosts, list) else []


class V3Routes:
    """The v3 client (OPEN_API) and auth endpoints, as thin shapes over the v1/v2 handlers (no
    rule lives here). ``auth`` is None when the node has no auth service."""

    def __init__(self, naming: NamingRoutes, auth: AuthRoutes | None) -> None:
        self.naming = naming
        self.auth = auth

    def routes(self, admin: str, identity: str) -> list[Route]:
        """The route table of the client and auth APIs."""
        n, table = self.naming, []
        if self.auth is not None:
            a = self.auth
            table += [
                Route("POST", LOGIN, a.login, api=Api.V1),
                Route("POST", AUTH_USER + "/admin", self.create_admin),
                Route("POST", AUTH_USER, message(a.create_user), admin),
                Route("DELETE", AUTH_USER, message(a.delete_user), admin),
                Route("PUT", AUTH_USER, message(a.update_user), identity),
                Route("GET", AUTH_USER + "/list", body(a.list_users), admin),
                Route("GET", AUTH_USER + "/search", body(a.search_users), admin),
                Route("POST", AUTH_ROLE, message(a.add_role), admin),
                Route("DELETE", AUTH_ROLE, message(a.delete_role), admin),
                Route("GET", AUTH_ROLE + "/list", body(a.list_roles), admin),
                Route("GET", AUTH_ROLE + "/search", body(a.search_roles), admin),
                Route("POST", AUTH_PERMISSION, message(a.add_permission), admin),
                Route("DELETE", AUTH_PERMISSION, message(a.delete_permission), admin),
                Route("GET", AUTH_PERMISSION + "/list", body(a.list_permissions), admin),
                Route("GET", AUTH_PERMISSION, self.duplicate_permission, admin),
            ]
        table += [
            Route("POST", CLIENT_INSTANCE, self.client_register, WRITE, distro=True),
            Route("DELETE", CLIENT_INSTANCE, n.v2_deregister, WRITE, distro=True),
            Route("GET", CLIENT_INSTANCE + "/list", self.client_list, READ),
        ]
        return table

    # --- client (OPEN_API) ------------------------------------------------------------------
    async def client_register(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Register, or with ``heartBeat=true`` renew: an unknown instance answers HTTP 200 with
        code 21003 (INSTANCE_NOT_FOUND) so the caller registers again."""
        if not p.boolean("heartBeat", False):
            return await self.naming.v2_register(request, p)
        code, _interval = self.naming.naming.beat(p.v2_service(), p.required("ip"), p.port(), None, True)
        if code != BeatCode.OK:
            return failure(V2Code.INSTANCE_NOT_FOUND, V2_TEXT[V2Code.INSTANCE_NOT_FOUND])
        return v2_ok('"ok"')

    async def client_list(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The instances a custom client may call: the hosts only, ``enabled=false`` left out."""
        info = self.naming.naming.query(p.v2_service(), p.text("clusterName"), False, grouped_name=True)
        return v2_ok(dumps([h for h in _hosts(info) if h.get("enabled", True)]))

    # --- auth -------------------------------------------------------------------------------
    async def create_admin(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The first admin as a ``Result<User>``; once one exists, HTTP 200 with code 409 (as
        UserControllerV3 answers it)."""
        assert self.auth is not None
        try:
            user = await self.auth.auth.create_admin(p.get("password") or "")
        except AdminExists as exc:
            return json_text(dumps({"code": exc.http_status, "message": exc.message, "data": None}))
        return v2_ok(dumps(user))

    async def duplicate_permission(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``Result<Boolean>``: whether ``role`` already holds ``resource`` for ``action``
        (an ``rw`` grant covers either action), as the console asks before adding one."""
        assert self.auth is not None
        role, resource, action = p.required("role"), p.required("resource"), p.required("action")
        found = any(x.role == role and x.resource == resource and x.action in (action, "rw")
                    for x in self.auth.auth.data.permissions())
        return v2_ok("true" if found else "false")
