"""Prometheus HTTP service discovery over the registry (Nacos's PrometheusController).

``GET /nacos/prometheus`` lists every instance of every namespace,
``/nacos/prometheus/namespaceId/{namespaceId}`` those of one namespace and
``.../service/{service}`` those of services with one bare name, in the shape Prometheus's
``http_sd_configs`` reads: one ``{"targets": ["ip:port"], "labels": {...}}`` object per instance,
whose labels are ``__meta_clusterName`` and the instance metadata with ``.`` and ``-`` in the keys
turned into ``_`` (PrometheusUtils). Served only with ``nacos.prometheus.metrics.enabled=true``.

With auth on, Nacos guards the API with HTTP Basic credentials of any user
(PrometheusAuthFilter: a missing or wrong ``Authorization`` header is answered 403). Nacos's
filter covers only the root path; here the same check guards all three, since the per-namespace
lists expose the same instances.
"""

from __future__ import annotations

import base64
import binascii
import re

from aiohttp import web

from shoal.auth.service import AuthService
from shoal.errors import Forbidden
from shoal.model.instance import InstanceInfo
from shoal.service_layer import NamingService
from shoal.tasks import run_blocking
from shoal.transport.http.api import Api, dumps
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

_LABEL_CHARS = re.compile(r"[.\-]")


class PrometheusSdRoutes:
    """The three discovery endpoints; each answers a JSON array (never an error for an unknown
    namespace or service: an empty array, as Nacos)."""

    def __init__(self, naming: NamingService, auth: AuthService | None) -> None:
        self.reads = naming.reads
        self.auth = auth

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/nacos/prometheus", self.all_targets, api=Api.V1),
            Route("GET", "/nacos/prometheus/namespaceId/{namespaceId}", self.namespace_targets, api=Api.V1),
            Route("GET", "/nacos/prometheus/namespaceId/{namespaceId}/service/{service}", self.service_targets,
                  api=Api.V1),
        ]

    async def all_targets(self, request: web.Request, p: Params) -> web.Response:
        await self._check_basic_auth(request)
        return await self._answer(None, None)

    async def namespace_targets(self, request: web.Request, p: Params) -> web.Response:
        await self._check_basic_auth(request)
        return await self._answer(request.match_info["namespaceId"], None)

    async def service_targets(self, request: web.Request, p: Params) -> web.Response:
        await self._check_basic_auth(request)
        return await self._answer(request.match_info["namespaceId"], request.match_info["service"])

    async def _answer(self, namespace: str | None, service: str | None) -> web.Response:
        groups = [target_group(inst) for _key, inst in self.reads.all_instances(namespace, service)]
        body = await run_blocking(dumps, groups)  # a whole registry's worth of JSON: off the loop
        return web.Response(text=body, content_type="application/json", charset="utf-8")

    async def _check_basic_auth(self, request: web.Request) -> None:
        if self.auth is None or not self.auth.enabled:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded.strip():
            raise Forbidden("Access Denied")
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise Forbidden("Access Denied") from None
        username, sep, password = decoded.partition(":")
        if not sep or not username or not password:
            raise Forbidden("Access Denied")
        await self.auth.identity_from_credentials(username, password, request.remote or "unknown")


def target_group(inst: InstanceInfo) -> dict[str, object]:
    """One instance as a Prometheus target group (PrometheusUtils.assembleInstanceToArrayNode)."""
    labels = {"__meta_clusterName": inst.cluster}
    for key, value in inst.metadata.items():
        labels[_LABEL_CHARS.sub("_", key)] = value
    return {"targets": [f"{inst.ip}:{inst.port}"], "labels": labels}
