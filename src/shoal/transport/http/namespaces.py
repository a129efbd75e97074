"""Namespace endpoints: ``/nacos/v1/console/namespaces`` (Nacos NamespaceController) and
``/nacos/v2/console/namespace`` (NamespaceControllerV2), over :class:`NamespaceService`.

v1 answers as Nacos's does: the list as a RestResult, the detail as a bare ``NamespaceAllInfo``,
and ``true``/``false`` for create, edit, delete and the id check, where ``false`` is how v1 says
"bad id, bad name or already there". v2 answers in its envelope and refuses bad input with
ILLEGAL_NAMESPACE (400), NAMESPACE_NOT_EXIST (404), NAMESPACE_ALREADY_EXIST (500, as Nacos) or
PARAMETER_MISSING (400). A store without quorum is a 503 in every generation.
"""

from __future__ import annotations

from aiohttp import web

from shoal.errors import IllegalNamespace, MissingParam, NamespaceAlreadyExist, NamespaceNotExist
from shoal.service_layer.namespaces import NamespaceService
from shoal.transport.http.api import Api, core_ok, dumps, json_text, v2_ok
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

V1_PATH = "/nacos/v1/console/namespaces"
V2_PATH = "/nacos/v2/console/namespace"



def _bool(value: bool) -> web.Response:
    return json_text("true" if value else "false")


class NamespaceRoutes:
    """The namespace endpoints."""

    def __init__(self, namespaces: NamespaceService) -> None:
        self.namespaces = namespaces

    def routes(self, admin: str, identity: str) -> list[Route]:
        """Reads are open as in Nacos (the v2 detail needs a login); writes need an admin."""
        return [
            Route("GET", V1_PATH, self.v1_get, api=Api.CORE),
            Route("POST", V1_PATH, self.v1_create, admin, api=Api.V1),
            Route("PUT", V1_PATH, self.v1_edit, admin, api=Api.V1),
            Route("DELETE", V1_PATH, self.v1_delete, admin, api=Api.V1),
            Route("GET", V2_PATH + "/list", self.v2_list, api=Api.V2),
            Route("GET", V2_PATH, self.v2_get, identity, api=Api.V2),
            Route("POST", V2_PATH, self.v2_create, admin, api=Api.V2),
            Route("PUT", V2_PATH, self.v2_edit, admin, api=Api.V2),
            Route("DELETE", V2_PATH, self.v2_delete, admin, api=Api.V2),
        ]

    # --- v1 -------------------------------------------------------------------------------------
    async def v1_get(self, request: web.Request, p: Params) -> web.Response:
        if p.text("show") == "all":
            namespace_id = p.get("namespaceId")
            if namespace_id is None:
                raise MissingParam("namespaceId")
            return json_text(dumps(self.namespaces.get(namespace_id)))
        if p.text("checkNamespaceIdExist") == "true":
            return _bool(self.namespaces.exists(p.text("customNamespaceId")))
        return core_ok(self.namespaces.list())

    async def v1_create(self, request: web.Request, p: Params) -> web.Response:
        name = p.get("namespaceName")
        if name is None:
            raise MissingParam("namespaceName")
        try:
            await self.namespaces.create(p.get("customNamespaceId"), name, p.get("namespaceDesc"))
        except (IllegalNamespace, NamespaceAlreadyExist):
            return _bool(False)
        return _bool(True)

    async def v1_edit(self, request: web.Request, p: Params) -> web.Response:
        namespace_id = p.required("namespace")
        name = p.get("namespaceShowName")
        if name is None:
            raise MissingParam("namespaceShowName")
        try:
            await self.namespaces.edit(namespace_id, name, p.get("namespaceDesc"))
        except (IllegalNamespace, NamespaceNotExist):
            return _bool(False)
        return _bool(True)

    async def v1_delete(self, request: web.Request, p: Params) -> web.Response:
        try:
            await self.namespaces.delete(p.required("namespaceId"))
        except IllegalNamespace:
            return _bool(False)
        return _bool(True)

    # --- v2 -------------------------------------------------------------------------------------
    async def v2_list(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(self.namespaces.list()))

    async def v2_get(self, request: web.Request, p: Params) -> web.Response:
        namespace_id = p.get("namespaceId")
        if namespace_id is None:
            raise MissingParam("namespaceId")
        return v2_ok(dumps(self.namespaces.get(namespace_id)))

    async def v2_create(self, request: web.Request, p: Params) -> web.Response:
        await self.namespaces.create(p.get("namespaceId"), p.get("namespaceName"), p.get("namespaceDesc"))
        return v2_ok("true")

    async def v2_edit(self, request: web.Request, p: Params) -> web.Response:
        namespace_id = p.get("namespaceId")
        if namespace_id is None:
            raise MissingParam("namespaceId")
        await self.namespaces.edit(namespace_id, p.get("namespaceName"), p.get("namespaceDesc"))
        return v2_ok("true")

    async def v2_delete(self, request: web.Request, p: Params) -> web.Response:
        namespace_id = p.get("namespaceId")
        if namespace_id is None:
            raise MissingParam("namespaceId")
        await self.namespaces.delete(namespace_id)
        return v2_ok("true")
