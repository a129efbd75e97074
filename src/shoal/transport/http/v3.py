"""The Nacos 3.x HTTP surface (docs/protocol.md §5.7): the route table, the
shared wrappers, and the client (OPEN_API) and auth routes. The admin routes are in
:mod:`shoal.transport.http.v3_naming` (``/nacos/v3/admin/ns``) and
:mod:`shoal.transport.http.v3_core` (``/nacos/v3/admin/core``).

Nacos 3.x refuses the v1/v2 admin APIs by default, so 3.x tools call ``/nacos/v3/...``. Its answers
are the v2 ``Result`` (``{"code":0,"message":"success","data":...}``) and its errors the v2
``ErrorCode``s with the HTTP status of the exception (NacosApiExceptionHandler), so the error
shape is :data:`Api.V2`'s. Every route calls the same use cases as v1/v2; a route whose 3.x answer
is the v2 one is the v2 handler, every other handler here calls the use cases and builds its 3.x
answer itself:

* ``POST /nacos/v3/auth/user/login`` (UserControllerV3): the v1 login answer; the 3.x Java client
  tries it first and falls back to v1 only on 404.
* ``/nacos/v3/client/ns/instance`` (InstanceOpenApiController, OPEN_API: READ/WRITE on the
  service): register (``heartBeat=true`` renews instead and answers code 21003 when the instance
  is unknown), deregister, and ``/list`` with the hosts only, ``enabled=false`` left out.
* ``/nacos/v3/auth/{user,role,permission}`` (UserControllerV3 and co.): the v1 auth operations
  answered in a Result (a write's data is the v1 message, a list the v1 page),
  ``GET /nacos/v3/auth/permission``, the console's duplicate check, and ``user/search`` and
  ``role/search``: the matching names as ``Result<List<String>>``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from shoal.auth.service import READ, WRITE, AdminExists, AuthService
from shoal.errors import V2_TEXT, BeatCode, Forbidden, V2Code
from shoal.service_layer import NamingService
from shoal.transport.http.api import Api, dumps, json_text, v2_ok
from shoal.transport.http.auth_routes import IDENTITY_KEY, AuthRoutes, auth_page, search_param
from shoal.transport.http.naming import NamingRoutes, instance_from
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

CLIENT_INSTANCE = "/nacos/v3/client/ns/instance"
LOGIN = "/nacos/v3/auth/user/login"
AUTH_USER = "/nacos/v3/auth/user"
AUTH_ROLE = "/nacos/v3/auth/role"
AUTH_PERMISSION = "/nacos/v3/auth/permission"




def failure(code: V2Code, message_text: str | None, data: Any = None) -> web.Response:
    """``Result.failure``: HTTP 200 with a non-zero code (a refusal 3.x answers without an exception)."""
    return json_text(dumps({"code": int(code), "message": message_text, "data": data}))


def message(text: str) -> web.Response:
    """A write answered as ``Result<String>`` holding the message v1 answers it with."""
    return v2_ok(dumps(text))


class V3Routes:
    """The v3 client (OPEN_API) and auth endpoints over the use cases (no rule lives here)."""

    def __init__(self, naming: NamingService, v2: NamingRoutes, auth: AuthService) -> None:
        self.instances = naming.instance_ops
        self.reads = naming.reads
        self.v2 = v2
        self.auth = auth

    def routes(self, admin: str, identity: str) -> list[Route]:
        """The route table of the client and auth APIs."""
        return [
            Route("POST", LOGIN, AuthRoutes(self.auth).login, api=Api.V1),
            Route("POST", AUTH_USER + "/admin", self.create_admin),
            Route("POST", AUTH_USER, self.create_user, admin),
            Route("DELETE", AUTH_USER, self.delete_user, admin),
            Route("PUT", AUTH_USER, self.update_user, identity),
            Route("GET", AUTH_USER + "/list", self.list_users, admin),
            Route("GET", AUTH_USER + "/search", self.search_users, admin),
            Route("POST", AUTH_ROLE, self.add_role, admin),
            Route("DELETE", AUTH_ROLE, self.delete_role, admin),
            Route("GET", AUTH_ROLE + "/list", self.list_roles, admin),
            Route("GET", AUTH_ROLE + "/search", self.search_roles, admin),
            Route("POST", AUTH_PERMISSION, self.add_permission, admin),
            Route("DELETE", AUTH_PERMISSION, self.delete_permission, admin),
            Route("GET", AUTH_PERMISSION + "/list", self.list_permissions, admin),
            Route("GET", AUTH_PERMISSION, self.duplicate_permission, admin),
            Route("POST", CLIENT_INSTANCE, self.client_register, WRITE, distro=True),
            Route("DELETE", CLIENT_INSTANCE, self.v2.v2_deregister, WRITE, distro=True),
            Route("GET", CLIENT_INSTANCE + "/list", self.client_list, READ),
        ]

    # --- client (OPEN_API) ------------------------------------------------------------------
    async def client_register(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Register, or with ``heartBeat=true`` renew: an unknown instance answers HTTP 200 with
        code 21003 (INSTANCE_NOT_FOUND) so the caller registers again."""
        service = p.v2_service()
        if not p.boolean("heartBeat", False):
            inst, ephemeral = instance_from(p)
            await self.instances.register(service, inst, ephemeral=ephemeral)
            return v2_ok('"ok"')
        code, _interval = await self.instances.beat(service, p.required("ip"), p.port(), None)
        if code != BeatCode.OK:
            return failure(V2Code.INSTANCE_NOT_FOUND, V2_TEXT[V2Code.INSTANCE_NOT_FOUND])
        return v2_ok('"ok"')

    async def client_list(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The instances a custom client may call: the hosts a query answers (enabled only)."""
        hosts = self.reads.selected_hosts(p.v2_service(), p.text("clusterName"))
        return v2_ok(f"[{','.join(hosts)}]")

    # --- auth -------------------------------------------------------------------------------
    async def create_admin(self, request: web.Request, p: Params) -> web.StreamResponse:
        """The first admin as a ``Result<User>``; once one exists, HTTP 200 with code 409 (as
        UserControllerV3 answers it)."""
        try:
            user = await self.auth.create_admin(p.get("password") or "")
        except AdminExists as exc:
            return json_text(dumps({"code": exc.http_status, "message": exc.message, "data": None}))
        return v2_ok(dumps(user))

    async def create_user(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.auth.create_user(p.text("username"), p.get("password") or "")
        return message("create user ok!")

    async def delete_user(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.auth.delete_user(p.text("username"))
        return message("delete user ok!")

    async def update_user(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A user's password: the user's own, or anyone's for a global admin."""
        username = p.required("username")
        identity = request.get(IDENTITY_KEY)
        if identity is not None and not identity.global_admin and identity.username != username:
            raise Forbidden("authorization failed!")
        await self.auth.update_password(username, p.get("newPassword") or "")
        return message("update user ok!")

    async def list_users(self, request: web.Request, p: Params) -> web.StreamResponse:
        users = self.auth.list_users(p.text("username"), p.text("search", "accurate").lower() == "blur")
        return v2_ok(dumps(auth_page(users, p)))

    async def search_users(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self.auth.search_users(search_param(p, "username"))))

    async def add_role(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.auth.add_role(p.text("role"), p.text("username"))
        return message("add role ok!")

    async def delete_role(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.auth.delete_role(p.text("role"), p.text("username"))
        return message("delete role of user " + (p.text("username") or "*") + " ok!")

    async def list_roles(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(auth_page(self.auth.list_roles(p.text("username"), p.text("role")), p)))

    async def search_roles(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(self.auth.search_roles(search_param(p, "role"))))

    async def add_permission(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.auth.add_permission(p.text("role"), p.text("resource"), p.text("action"))
        return message("add permission ok!")

    async def delete_permission(self, request: web.Request, p: Params) -> web.StreamResponse:
        await self.auth.delete_permission(p.text("role"), p.text("resource"), p.text("action"))
        return message("delete permission ok!")

    async def list_permissions(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(auth_page(self.auth.list_permissions(p.text("role")), p)))

    async def duplicate_permission(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``Result<Boolean>``: whether ``role`` already holds ``resource`` for ``action``
        (an ``rw`` grant covers either action), as the console asks before adding one."""
        role, resource, action = p.required("role"), p.required("resource"), p.required("action")
        found = any(x.role == role and x.resource == resource and x.action in (action, "rw")
                    for x in self.auth.data.permissions())
        return v2_ok("true" if found else "false")
