"""Which node is stale (issue 23 item 4), over HTTP.

- ``GET /nacos/v1/shoal/digests[?service=NAME]``: this node's digest of each service
  (:class:`~shoal.service_layer.digests.ServiceDigests`): ``{"self": ip:port, "services":
  {"namespace/group@@name": [digest, instances]}}``;
- ``GET /nacos/v1/shoal/consistency[?service=NAME&recheckMs=N]``: this node asks every member
  for its digests (itself without a request), again ``recheckMs`` later (default
  ``shoal.consistency.recheck-ms``) when the first round shows a difference, and answers what
  both rounds show (:meth:`~shoal.service_layer.digests.Comparison.to_json`).

Both need an admin (or the cluster identity, which is what peers send). Each comparison sets
the gauge ``shoal_consistency_disagreements{member}``: services on which that member differs
from the majority (``-1``: it did not answer); a periodic check keeps it fresh when
``shoal.consistency.check-interval-ms`` is set.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.core import GaugeMetricFamily

from shoal.config import Config
from shoal.service_layer.digests import Comparison, MemberDigests, ServiceDigests, compare, parse_digests, persistent
from shoal.tls import PortTls
from shoal.transport.http.api import Api, dumps, json_text
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

log = logging.getLogger(__name__)

DIGESTS_PATH = "/nacos/v1/shoal/digests"


class DisagreementGauge:
    """``shoal_consistency_disagreements{member}`` from the last comparison (a collector)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        #: services the members disagreed on at the last comparison (None: none yet; the console's charts)
        self.services: int | None = None

    def update(self, result: Comparison) -> None:
        counts = result.per_member()
        for member in result.unanswered:
            counts[member] = -1
        self.last = counts
        self.services = len(result.disagree)

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "shoal_consistency_disagreements",
            "Services on which a member differs from the majority at the last consistency check (-1: no answer)",
            labels=["member"])
        for member, count in sorted(self.last.items()):
            family.add_metric([member], count)
        yield family


class ConsistencyCheck:
    """Asks the members for their digests and compares them, twice when they differ."""

    def __init__(self, config: Config, digests: ServiceDigests, self_address: str,
                 members: Callable[[], list[str]], tls: PortTls | None, gauge: DisagreementGauge) -> None:
        self.config = config
        self.digests = digests
        self.self_address = self_address
        self.members = members
        self.scheme = "https" if tls is not None else "http"
        self.ssl = tls.client_context() if tls is not None else None
        self.gauge = gauge
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl) if self.ssl is not None else None
            timeout = aiohttp.ClientTimeout(total=self.config.consistency_peer_timeout_ms / 1000)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    async def _peer(self, address: str, service: str) -> MemberDigests:
        headers = {"User-Agent": "Nacos-Server"}
        if self.config.cluster_identity_key:
            headers[self.config.cluster_identity_key] = self.config.cluster_identity_value
        params = {"service": service} if service else {}
        try:
            async with self._client().get(f"{self.scheme}://{address}{DIGESTS_PATH}", params=params,
                                          headers=headers) as response:
                if response.status != 200:
                    log.info("digests of %s answered %d", address, response.status)
                    return None
                return parse_digests(json.loads(await response.text()).get("services"))
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            log.debug("digests of %s: %r", address, exc)
            return None

    async def _round(self, service: str) -> Comparison:
        members = self.members() or [self.self_address]
        answers = await asyncio.gather(*(
            self._local(service) if m == self.self_address else self._peer(m, service) for m in members))
        return compare(dict(zip(members, answers, strict=True)))

    async def _local(self, service: str) -> MemberDigests:
        return self.digests.digests(service)

    async def run(self, service: str = "", recheck_ms: int | None = None) -> Comparison:
        """The members' comparison; a difference must show again ``recheck_ms`` later."""
        first = await self._round(service)
        if not first.agree:
            await asyncio.sleep((self.config.consistency_recheck_ms if recheck_ms is None else recheck_ms) / 1000)
            first = persistent(first, await self._round(service))
        self.gauge.update(first)
        return first

    async def tick(self) -> None:
        await self.run()

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class ConsistencyRoutes:
    """The digests of this node and the members' comparison."""

    def __init__(self, digests: ServiceDigests, check: ConsistencyCheck) -> None:
        self.digests = digests
        self.check = check

    def routes(self, admin: str) -> list[Route]:
        return [
            Route("GET", DIGESTS_PATH, self.own_digests, admin, api=Api.V1),
            Route("GET", "/nacos/v1/shoal/consistency", self.consistency, admin, api=Api.V1),
        ]

    async def own_digests(self, request: web.Request, p: Params) -> web.Response:
        services = self.digests.digests(p.text("service"))
        return json_text(dumps({"self": self.check.self_address, "services": services}))

    async def consistency(self, request: web.Request, p: Params) -> web.Response:
        recheck = p.integer("recheckMs", low=0, high=60_000) if p.text("recheckMs") else None
        result = await self.check.run(p.text("service"), recheck)
        return json_text(dumps(result.to_json()))
