"""Seams to the cluster: who is responsible for an ``ip:port`` (Nacos DistroFilter) and who the
members are (``/core/cluster/nodes``).

* :class:`Responsibility` (defined in :mod:`shoal.distro.responsibility`, re-exported here)
  answers ``owner_of("ip:port")``: None when this node handles it, else the owner's HTTP
  ``ip:port``. Standalone: always None. The Distro mapper plugs in there.
* :class:`Forwarder` proxies an HTTP write or beat for an ``ip:port`` this node is not
  responsible for to its owner (same method, path, query and body, ``User-Agent:
  Nacos-Server``) and relays the answer. A request that arrives already forwarded by a peer
  and is still not ours is refused with 400, which stops forwarding loops (docs/protocol.md §5.5).
  In a Shoal cluster a :class:`ForwardFallback` has this node handle the write itself, pending
  handoff to the owner, instead of failing it: when the owner is not answering (or does not
  answer within ``shoal.http.forward-timeout-ms``), and when a forwarded request is still not
  ours (the two nodes' member views differ for a moment). Without one (standalone, the test
  hook) those are a 502 and a 400. The first forward to an owner that fails or times out turns
  the owner not answering (SUSPICIOUS) and releases every other forward still waiting on it at
  once (they are handled here too), so a hung owner costs one timeout, not one per write; the
  owner is forwarded to again once a call to it succeeds (the member report, every
  ``report-interval-ms``).
* :class:`MemberView` lists the members in Nacos's Member JSON shape; standalone: this node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from shoal import __version__
from shoal.distro.responsibility import (
    ForwardAllTo,
    ForwardFallback,
    MapperResponsibility,
    Responsibility,
    Standalone,
)
from shoal.errors import ForwardFailed, InvalidParam

log = logging.getLogger(__name__)

__all__ = ["ForwardAllTo", "ForwardFailed", "Forwarder", "MapperResponsibility", "MemberList", "MemberView",
           "Responsibility", "Standalone", "StandaloneMembers", "member_json"]

#: Nacos peers mark forwarded requests with a User-Agent that contains ``Nacos-Server``.
SERVER_USER_AGENT = f"Nacos-Server:shoal-{__version__}"
_PASSED_HEADERS = ("Content-Type", "accessToken", "Authorization", "Client-Version", "RequestId")




class MemberView(Protocol):
    """The cluster members, each as Nacos's Member JSON object (docs/protocol.md §6.2)."""

    def members(self) -> list[dict[str, Any]]: ...


def member_json(ip: str, port: int, state: str = "UP") -> dict[str, Any]:
    return {
        "ip": ip,
        "port": port,
        "state": state,
        "extendInfo": {"raftPort": str(port - 1000), "version": __version__, "site": "unknow",
                       "adWeight": "0", "weight": "1"},
        "address": f"{ip}:{port}",
        "failAccessCnt": 0,
        "abilities": {"remoteAbility": {"supportRemoteConnection": True, "grpcReportEnabled": True},
                      "configAbility": {"supportRemoteMetrics": False},
                      "namingAbility": {"supportJraft": False}},
        "grpcReportEnabled": True,
    }


class MemberList:
    """A MemberView over anything that lists members with a ``to_nacos()`` form."""

    def __init__(self, source: Callable[[], Iterable[Any]]) -> None:
        self.source = source

    def members(self) -> list[dict[str, Any]]:
        return [m.to_nacos() for m in self.source()]


class StandaloneMembers:
    """A standalone node's member list: itself, UP."""

    def __init__(self, ip: str, port: int) -> None:
        self.ip = ip
        self.port = port

    def members(self) -> list[dict[str, Any]]:
        return [member_json(self.ip, self.port)]


class Forwarder:
    """Proxies requests to the responsible node with one pooled aiohttp client session (Nacos
    DistroFilter). An owner that does not answer in time is handled by :attr:`fallback` when
    there is one (the write is then served here), else :class:`~shoal.errors.ForwardFailed` (502)."""

    def __init__(self, responsibility: Responsibility, timeout_ms: int,
                 ssl_context: ssl.SSLContext | None = None, fallback: ForwardFallback | None = None) -> None:
        self.responsibility = responsibility
        self.ssl_context = ssl_context  # set: the peers serve HTTPS, verified with this context
        self.timeout_s = timeout_ms / 1000
        self.timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.handled_locally = 0
        #: the deadlines of the forwards waiting on each owner now, released when it stops answering
        self._waiting: dict[str, set[asyncio.Timeout]] = {}
        self._fallback: ForwardFallback | None = None
        self.fallback = fallback

    @property
    def fallback(self) -> ForwardFallback | None:
        return self._fallback

    @fallback.setter
    def fallback(self, fallback: ForwardFallback | None) -> None:
        self._fallback = fallback
        if fallback is not None:
            fallback.subscribe(self._release_not_answering)

    def _release_not_answering(self) -> None:
        """An owner may have stopped answering: the forwards waiting on it give up now."""
        fallback = self._fallback
        if fallback is None or not self._waiting:
            return
        now = asyncio.get_running_loop().time()
        for owner, deadlines in self._waiting.items():
            if deadlines and not fallback.answering(owner):
                for deadline in deadlines:
                    if not deadline.expired():  # one that expired meanwhile is already on its way out
                        deadline.reschedule(now)

    @contextlib.asynccontextmanager
    async def _deadline(self, owner: str) -> AsyncIterator[None]:
        """The forward's timeout (TimeoutError), cut short when ``owner`` stops answering."""
        async with asyncio.timeout(self.timeout_s) as deadline:
            waiting = self._waiting.setdefault(owner, set())
            waiting.add(deadline)
            try:
                yield
            finally:
                waiting.discard(deadline)
                if not waiting:
                    self._waiting.pop(owner, None)

    def owner_of(self, tag: str) -> str | None:
        return self.responsibility.owner_of(tag)

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def forward(self, request: web.Request, owner: str, tag: str = "") -> web.Response | None:
        """The owner's answer, relayed; None when this node is to handle the request itself
        (the owner is not answering and there is a :attr:`fallback`)."""
        fallback = self.fallback
        if "Nacos-Server" in request.headers.get("User-Agent", ""):
            # never forwarded twice. Nacos refuses it; a Shoal cluster handles it here: the peer
            # that sent it sees another owner (the member views differ for a moment), and a
            # refusal would fail the client's write
            if fallback is None:
                raise InvalidParam(f"receive invalid redirect request from peer {request.remote}")
            self._locally(fallback, tag)
            return None
        if fallback is not None and not fallback.answering(owner):
            self._locally(fallback, tag)
            return None
        attempt = fallback.attempt(owner) if fallback is not None else 0
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context is not None else None
            self._session = aiohttp.ClientSession(timeout=self.timeout, auto_decompress=False, connector=connector)
        body = await request.read() if request.body_exists else None
        headers = {"User-Agent": SERVER_USER_AGENT}
        for name in _PASSED_HEADERS:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value
        url = f"{'https' if self.ssl_context is not None else 'http'}://{owner}{request.path_qs}"
        try:
            async with self._deadline(owner), self._session.request(request.method, url, data=body, headers=headers,
                                                                   allow_redirects=False) as resp:
                payload = await resp.read()
                relayed = {"Content-Type": resp.headers.get("Content-Type", "text/plain; charset=utf-8")}
                return web.Response(status=resp.status, body=payload, headers=relayed)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if fallback is None:
                log.warning("forwarding %s %s to %s failed: %r", request.method, request.path, owner, exc)
                raise ForwardFailed(f"forwarding to the responsible node {owner} failed: {exc!r}") from None
            log.debug("forwarding %s %s to %s failed (%r): handled here", request.method, request.path, owner, exc)
            fallback.failed(owner, attempt)
            self._locally(fallback, tag)
            return None

    def _locally(self, fallback: ForwardFallback, tag: str) -> None:
        fallback.handle_locally(tag)
        self.handled_locally += 1
