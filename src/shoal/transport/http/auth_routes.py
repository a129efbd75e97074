"""Auth endpoints of the Nacos default plugin (UserController, RoleController,
PermissionController) under ``/nacos/v1/auth`` (docs/protocol.md §5.6)."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from shoal.auth.service import AuthService, Identity
from shoal.errors import Forbidden, MissingParam
from shoal.transport.http.api import Api, core_ok, dumps, json_text
from shoal.transport.http.params import Params
from shoal.transport.http.routes import ADMIN, IDENTITY, Route

# A typed request key where aiohttp has them (3.12+), else the plain string it used to take.
IDENTITY_KEY: Any = (web.RequestKey("shoal.identity", Identity) if hasattr(web, "RequestKey")
                     else "shoal.identity")


def auth_page(items: list[dict[str, str]], p: Params) -> dict[str, Any]:
    """The auth lists' Page (``pageNo`` from 1, ``pageSize`` 1..10000, default 100), v1 and v3 alike."""
    page_no = p.integer("pageNo", 1, 1)
    page_size = p.integer("pageSize", 100, 1, 10_000)
    start = (page_no - 1) * page_size
    return {"totalCount": len(items), "pageNumber": page_no,
            "pagesAvailable": math.ceil(len(items) / page_size), "pageItems": items[start:start + page_size]}


def search_param(p: Params, name: str) -> str:
    """A search fragment: required as a parameter (Spring's ``@RequestParam``), blank allowed."""
    value = p.get(name)
    if value is None:
        raise MissingParam(name)
    return value.strip()


class AuthRoutes:
    """The auth endpoints over :class:`AuthService`; errors are its typed NacosErrors."""

    def __init__(self, auth: AuthService) -> None:
        self.auth = auth

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/nacos/v1/auth/login", self.login, api=Api.V1),
            Route("POST", "/nacos/v1/auth/users/login", self.login, api=Api.V1),
            Route("POST", "/nacos/v1/auth/users/admin", self.create_admin, api=Api.CORE),
            Route("POST", "/nacos/v1/auth/users", self.create_user, ADMIN, api=Api.CORE),
            Route("DELETE", "/nacos/v1/auth/users", self.delete_user, ADMIN, api=Api.CORE),
            Route("PUT", "/nacos/v1/auth/users", self.update_user, IDENTITY, api=Api.CORE),
            Route("GET", "/nacos/v1/auth/users", self.list_users, ADMIN, api=Api.CORE),
            Route("GET", "/nacos/v1/auth/users/search", self.search_users, ADMIN, api=Api.CORE),
            Route("POST", "/nacos/v1/auth/roles", self.add_role, ADMIN, api=Api.CORE),
            Route("DELETE", "/nacos/v1/auth/roles", self.delete_role, ADMIN, api=Api.CORE),
            Route("GET", "/nacos/v1/auth/roles", self.list_roles, ADMIN, api=Api.CORE),
            Route("GET", "/nacos/v1/auth/roles/search", self.search_roles, ADMIN, api=Api.CORE),
            Route("POST", "/nacos/v1/auth/permissions", self.add_permission, ADMIN, api=Api.CORE),
            Route("DELETE", "/nacos/v1/auth/permissions", self.delete_permission, ADMIN, api=Api.CORE),
            Route("GET", "/nacos/v1/auth/permissions", self.list_permissions, ADMIN, api=Api.CORE),
        ]

    async def login(self, request: web.Request, p: Params) -> web.Response:
        answer = await self.auth.login(p.text("username"), p.get("password") or "", request.remote or "unknown")
        token = answer["accessToken"]
        return json_text(dumps(answer), headers={"Authorization": f"Bearer {token}"} if token else None)

    async def create_admin(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(await self.auth.create_admin(p.get("password") or "")))

    async def create_user(self, request: web.Request, p: Params) -> web.Response:
        await self.auth.create_user(p.text("username"), p.get("password") or "")
        return core_ok(message="create user ok!")

    async def delete_user(self, request: web.Request, p: Params) -> web.Response:
        await self.auth.delete_user(p.text("username"))
        return core_ok(message="delete user ok!")

    async def update_user(self, request: web.Request, p: Params) -> web.Response:
        username = p.required("username")
        identity: Identity | None = request.get(IDENTITY_KEY)
        if identity is not None and not identity.global_admin and identity.username != username:
            raise Forbidden("authorization failed!")
        await self.auth.update_password(username, p.get("newPassword") or "")
        return core_ok(message="update user ok!")

    async def list_users(self, request: web.Request, p: Params) -> web.Response:
        users = self.auth.list_users(p.text("username"), p.text("search", "accurate").lower() == "blur")
        return json_text(dumps(auth_page(users, p)))

    async def search_users(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/auth/users/search?username=: the matching usernames, a bare JSON list (Nacos
        UserController.getUserListByUsername). ``username`` must be present; empty matches all."""
        return json_text(dumps(self.auth.search_users(search_param(p, "username"))))

    async def search_roles(self, request: web.Request, p: Params) -> web.Response:
        """GET /v1/auth/roles/search?role=: the matching role names, a bare JSON list (Nacos
        RoleController.searchRoles). ``role`` must be present; empty matches all."""
        return json_text(dumps(self.auth.search_roles(search_param(p, "role"))))

    async def add_role(self, request: web.Request, p: Params) -> web.Response:
        await self.auth.add_role(p.text("role"), p.text("username"))
        return core_ok(message="add role ok!")

    async def delete_role(self, request: web.Request, p: Params) -> web.Response:
        await self.auth.delete_role(p.text("role"), p.text("username"))
        return core_ok(message="delete role of user " + (p.text("username") or "*") + " ok!")

    async def list_roles(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(auth_page(self.auth.list_roles(p.text("username"), p.text("role")), p)))

    async def add_permission(self, request: web.Request, p: Params) -> web.Response:
        await self.auth.add_permission(p.text("role"), p.text("resource"), p.text("action"))
        return core_ok(message="add permission ok!")

    async def delete_permission(self, request: web.Request, p: Params) -> web.Response:
        await self.auth.delete_permission(p.text("role"), p.text("resource"), p.text("action"))
        return core_ok(message="delete permission ok!")

    async def list_permissions(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(auth_page(self.auth.list_permissions(p.text("role")), p)))
