"""The operator write API, as Nacos 2.x maps it (docs/protocol.md, "Switches").

- switches (OperatorController / OperatorControllerV2): ``GET|PUT /nacos/v1/ns/operator/switches``,
  its alias ``/nacos/v1/ns/ops/switches``, and ``/nacos/v2/ns/operator/switches``; ``PUT`` takes
  ``entry``, ``value`` and ``debug`` (true: this node only) and answers ``ok``;
- log levels: ``PUT /nacos/v1/ns/operator/log`` (and ``/ops/log``, ``/v2/ns/operator/log``) with
  ``logName`` and ``logLevel``: this node's logger level (not persisted, as Nacos);
- manual health of a persistent instance, v2: ``PUT /nacos/v2/ns/health/instance`` (HealthControllerV2);
- metadata batch: ``PUT|DELETE /nacos/v1|v2/ns/instance/metadata/batch`` with ``consistencyType``
  (``ephemeral`` default, or ``persistent``), ``instances`` (JSON list of ``{ip, port,
  clusterName}``; absent or ``[]``: every instance of that kind) and ``metadata``; answers
  ``{"updated": ["ip:port:cluster", ...]}``;
- ``PATCH /nacos/v2/ns/instance``: only the given fields change (InstanceControllerV2.patch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal import jsonfast
from shoal.auth.service import WRITE
from shoal.errors import InvalidParam, MissingParam, NacosError
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.service_layer import NamingService
from shoal.service_layer.switches import Switches
from shoal.transport.http.api import Api, dumps, json_text, ok_text, v2_ok
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

#: Nacos's naming log names → this node's loggers.
LOG_NAMES = {
    "naming-server": "shoal", "naming-push": "shoal.push", "naming-distro": "shoal.distro",
    "naming-event": "shoal.model", "naming-raft": "shoal.cp", "naming-rt": "shoal.transport",
    "naming-performance": "shoal.metrics",
}
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "OFF")


def set_log_level(names: dict[str, str], name: str, level: str) -> None:
    """Set the level of the logger Nacos's log ``name`` stands for (this node only, not kept);
    an unknown name or level is a 400 that lists the accepted ones."""
    logger = names.get(name)
    if logger is None:
        raise InvalidParam(f"Param 'logName' must be one of {', '.join(sorted(names))}.")
    level = level.upper()
    if level not in LOG_LEVELS:
        raise InvalidParam(f"Param 'logLevel' must be one of {', '.join(LOG_LEVELS)}.")
    mapped = {"TRACE": "DEBUG", "WARN": "WARNING", "OFF": "CRITICAL"}.get(level, level)
    logging.getLogger(logger).setLevel(mapped)


class OperatorRoutes:
    """Operator endpoints (switches, log levels, metadata batches, v2 health and PATCH)."""

    def __init__(self, naming: NamingService, switches: Switches) -> None:
        self.instances = naming.instance_ops
        self.switches = switches

    def routes(self, admin: str) -> list[Route]:
        table = []
        for base in ("/nacos/v1/ns/operator", "/nacos/v1/ns/ops"):
            table += [
                Route("GET", f"{base}/switches", self.v1_switches, admin, api=Api.V1),
                Route("PUT", f"{base}/switches", self.v1_update_switch, admin, api=Api.V1),
                Route("PUT", f"{base}/log", self.v1_log, admin, api=Api.V1),
            ]
        table += [
            Route("GET", "/nacos/v2/ns/operator/switches", self.v2_switches, admin, api=Api.V2),
            Route("PUT", "/nacos/v2/ns/operator/switches", self.v2_update_switch, admin, api=Api.V2),
            Route("PUT", "/nacos/v2/ns/operator/log", self.v2_log, admin, api=Api.V2),
            Route("PUT", "/nacos/v2/ns/health/instance", self.v2_health, WRITE, api=Api.V2),
        ]
        for api, base in ((Api.V1, "/nacos/v1/ns"), (Api.V2, "/nacos/v2/ns")):
            table += [
                Route("PUT", f"{base}/instance/metadata/batch", self.batch(api, remove=False), WRITE, api=api),
                Route("DELETE", f"{base}/instance/metadata/batch", self.batch(api, remove=True), WRITE, api=api),
            ]
        return [*table, Route("PATCH", "/nacos/v2/ns/instance", self.v2_patch, WRITE, distro=True, api=Api.V2)]

    # --- switches ------------------------------------------------------------------------------
    async def v1_switches(self, request: web.Request, p: Params) -> web.Response:
        return json_text(dumps(self.switches.domain()))

    async def v2_switches(self, request: web.Request, p: Params) -> web.Response:
        return v2_ok(dumps(self.switches.domain()))

    async def v1_update_switch(self, request: web.Request, p: Params) -> web.Response:
        await self.switches.update(p.required("entry"), p.required("value"), p.boolean("debug", False))
        return ok_text()

    async def v2_update_switch(self, request: web.Request, p: Params) -> web.Response:
        await self.switches.update(p.required("entry"), p.required("value"), p.boolean("debug", False))
        return v2_ok('"ok"')

    # --- log levels ----------------------------------------------------------------------------
    def _set_log(self, p: Params) -> None:
        set_log_level(LOG_NAMES, p.required("logName"), p.required("logLevel"))

    async def v1_log(self, request: web.Request, p: Params) -> web.Response:
        self._set_log(p)
        return ok_text()

    async def v2_log(self, request: web.Request, p: Params) -> web.Response:
        self._set_log(p)
        return v2_ok('"ok"')

    # --- health, v2 -----------------------------------------------------------------------------
    async def v2_health(self, request: web.Request, p: Params) -> web.Response:
        """HealthControllerV2.update: ``healthy`` is required; persistent instances only."""
        service = p.v2_service()
        if not p.text("healthy"):
            raise InvalidParam("Param 'healthy' is required.")
        await self.instances.set_health(service, p.required("ip"), p.port(), p.cluster(), p.boolean("healthy", True))
        return v2_ok('"ok"')

    # --- PATCH v2 --------------------------------------------------------------------------------
    async def v2_patch(self, request: web.Request, p: Params) -> web.Response:
        service = p.v2_service()
        ip, port, cluster = p.required("ip"), p.port(), p.cluster()
        await self.instances.patch(service, ip, port, cluster, weight=p.weight(None), enabled=p.enabled(None),
                                   metadata=p.metadata())
        return v2_ok('"ok"')

    # --- metadata batch --------------------------------------------------------------------------
    def batch(self, api: Api, remove: bool) -> Callable[[web.Request, Params], Any]:
        """The metadata batch handler answering in ``api``'s shape (v1 bare, v2/v3 in a Result)."""
        async def handle(request: web.Request, p: Params) -> web.Response:
            service = p.v1_service() if api is Api.V1 else p.v2_service()
            updated = await self._batch_metadata(service, p, remove)
            body = dumps({"updated": updated})
            return json_text(body) if api is Api.V1 else v2_ok(body)
        return handle

    async def _batch_metadata(self, service: ServiceKey, p: Params, remove: bool) -> list[str]:
        """Each instance's edit through the one write of operators' edits (any node takes it: an
        ephemeral instance's edit is kept in the CP store, as a persistent instance is)."""
        kind = (p.text("consistencyType") or "ephemeral").lower()
        if kind not in ("ephemeral", "persistent"):
            raise InvalidParam("Param 'consistencyType' must be 'ephemeral' or 'persistent'.")
        metadata = p.metadata()
        if not metadata:  # InstanceMetadataBatchOperationForm.validate: PARAMETER_MISSING
            raise MissingParam("metadata")
        targets = self.instances.metadata_targets(service, kind == "persistent", _instances_param(p.text("instances")))
        updated: list[str] = []
        for ip, port, cluster in targets:
            try:
                await self.instances.update(service, ip, port, cluster, ephemeral=kind == "ephemeral",
                                            metadata=None if remove else metadata,
                                            remove_keys=tuple(metadata) if remove else ())
            except NacosError:
                continue  # an instance named but not there is skipped, as Nacos does
            updated.append(f"{ip}:{port}:{cluster}")
        return updated


def _instances_param(raw: str) -> list[tuple[str, int, str]]:
    """``instances``: a JSON list of ``{"ip", "port", "clusterName"}`` (empty: all)."""
    if not raw.strip():
        return []
    try:
        items = jsonfast.loads(raw)
    except ValueError:
        raise InvalidParam("Param 'instances' must be a JSON list.") from None
    if not isinstance(items, list):
        raise InvalidParam("Param 'instances' must be a JSON list.")
    out: list[tuple[str, int, str]] = []
    for item in items:
        if not isinstance(item, dict):
            raise InvalidParam("Param 'instances' must be a JSON list of objects.")
        ip, port, cluster = item.get("ip"), item.get("port"), item.get("clusterName") or DEFAULT_CLUSTER
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if not isinstance(ip, str) or not ip or isinstance(port, bool) or not isinstance(port, int) \
                or not isinstance(cluster, str):
            raise InvalidParam("Param 'instances' entries need 'ip' (string) and 'port' (integer).")
        out.append((ip, port, cluster))
    return out
