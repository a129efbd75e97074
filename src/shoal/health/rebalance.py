"""Connection rebalancing: Nacos's manual loader API and, beyond Nacos, automatic rebalancing.

Nacos (``ServerLoaderController``, ``ConnectionManager.loadCount/loadSingle``) lets an operator
ask one node to keep only ``count`` SDK connections, or to move one client, by sending them
``ConnectResetRequest`` naming a server to move to (docs/protocol.md §2.7); ``smartReloadCluster``
asks every node above ``avg * (1 + loaderFactor)`` to keep only that many. After a rolling
restart all clients sit on the nodes that stayed up and stay there until an operator acts.

:class:`ServerLoader` does the same here, and its :meth:`ServerLoader.rebalance_tick` (a
Periodic when ``shoal.rebalance.enabled``) does it unasked: when the members' SDK connection
counts drift apart by more than ``shoal.rebalance.threshold`` of the average, a node above the
average moves at most ``shoal.rebalance.rate`` connections per tick to the least loaded member,
never keeping fewer than ``shoal.rebalance.floor``, and does nothing while any member (itself
included) is loading its snapshot or did not answer. Every node decides for itself from the
same figures, so only the busy ones shed load.

Clients that cannot parse ``ConnectResetRequest`` (nacos-sdk-python up to 3.2.0 drops it) are
moved by closing their stream: they reconnect to a server of their own list. Others get the
reset and, if they ignore it, are closed by the keep-alive scan on its next round (the
``expelled_at_ms`` mark it already uses for the limit rules).

Either way the connection id is handed to ``on_move`` first: the service layer then keeps the
moved client's instances listed until it has registered again or ``shoal.rebalance.grace-ms``
passes (:mod:`shoal.service_layer.moved`), so subscribers see no false removal.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shoal.config import Config
from shoal.health.keepalive import KeptConnection

log = logging.getLogger(__name__)

#: Client versions that cannot parse ConnectResetRequest (docs/protocol.md §2.4).
NO_RESET_CLIENTS = ("Nacos-Python-Client",)


class LoaderConnection(KeptConnection, Protocol):
    """What the loader reads of a connection (the gRPC transport's Connection fits)."""

    @property
    def client_version(self) -> str: ...

    @property
    def source(self) -> str: ...


class LoaderTable(Protocol):
    """The SDK connection table (the gRPC ConnectionManager fits)."""

    @property
    def by_id(self) -> Mapping[str, Any]: ...

    def unregister(self, connection_id: str, reason: str) -> bool: ...


class Resetter(Protocol):
    """Sends ConnectResetRequest (the SDK server fits)."""

    async def reset(self, conn: Any, redirect: str) -> None: ...


class LoaderPeers(Protocol):
    """Asks other members over the network (the HTTP transport implements it)."""

    async def metrics(self, address: str) -> dict[str, str] | None:
        """The member's own loader metrics, or None when it did not answer."""

    async def reload(self, address: str, count: int, redirect: str) -> bool:
        """Ask the member to keep only ``count`` SDK connections, moving the rest to ``redirect``."""


@dataclass(frozen=True)
class MemberLoad:
    """One member's loader metrics (Nacos ServerLoaderMetrics)."""

    address: str
    metric: dict[str, str]

    @property
    def sdk_count(self) -> int:
        return int(self.metric.get("sdkConCount", "0"))

    @property
    def loading(self) -> bool:
        return self.metric.get("loading") == "true"


class ServerLoader:
    """Loader metrics, the manual reload operations and the automatic rebalancing tick."""

    def __init__(self, config: Config, table: LoaderTable, resetter: Resetter, self_address: str,
                 members: Callable[[], list[str]], peers: LoaderPeers | None,
                 is_serving: Callable[[], bool], now_ms: Callable[[], int],
                 on_move: Callable[[str], None] | None = None, kept: Callable[[], int] | None = None) -> None:
        self.config = config
        self.table = table
        self.resetter = resetter
        self.self_address = self_address
        self.members = members
        self.peers = peers
        self.is_serving = is_serving
        self.now_ms = now_ms
        #: Told each moved connection's id before it is reset or closed (the service layer
        #: keeps its client's instances listed for the grace period).
        self.on_move = on_move
        #: How many moved clients this node keeps listed in their grace period (reported as keptClients).
        self.kept = kept
        self.moved = 0

    # --- metrics -------------------------------------------------------------------------
    def sdk_connections(self) -> list[Any]:
        return [c for c in self.table.by_id.values()
                if c.registered and not c.closed and c.source == "sdk" and c.expelled_at_ms is None]

    def local_metrics(self) -> dict[str, str]:
        """This node's ServerLoaderInfoResponse.loaderMetrics (plus Shoal's ``loading`` and ``keptClients``)."""
        registered = [c for c in self.table.by_id.values() if c.registered and not c.closed]
        return {"conCount": str(len(registered)), "sdkConCount": str(len(self.sdk_connections())),
                "load": "0", "cpu": "0", "loading": "false" if self.is_serving() else "true",
                "keptClients": str(self.kept() if self.kept is not None else 0)}

    async def cluster_loads(self) -> list[MemberLoad]:
        """Every member's metrics that arrived (self always), sorted by address."""
        loads = [MemberLoad(self.self_address, self.local_metrics())]
        others = [m for m in self.members() if m != self.self_address]
        if self.peers is not None and others:
            peers = self.peers
            answers = await asyncio.gather(*(peers.metrics(m) for m in others))
            loads += [MemberLoad(m, a) for m, a in zip(others, answers, strict=True) if a is not None]
        return sorted(loads, key=lambda m: m.address)

    async def cluster_summary(self) -> dict[str, Any]:
        """The ``/v2/core/loader/cluster`` answer (ServerLoaderController.getServerLoadMetrics)."""
        loads = await self.cluster_loads()
        counts = [m.sdk_count for m in loads]
        total = sum(counts)
        avg = total // len(loads)
        return {"detail": [{"address": m.address, "metric": m.metric} for m in loads],
                "memberCount": len(self.members()) or 1, "metricsCount": len(loads),
                "completed": len(loads) == (len(self.members()) or 1),
                "max": max(counts), "min": min(counts), "avg": avg, "threshold": avg * 1.1, "total": total}

    # --- manual reloads --------------------------------------------------------------------
    async def reload_count(self, keep: int, redirect: str) -> int:
        """Keep at most ``keep`` SDK connections, moving the newest others (ConnectionManager.loadCount).

        Returns how many were moved.
        """
        conns = sorted(self.sdk_connections(), key=lambda c: c.created_mono_ms)
        surplus = conns[max(keep, 0):]
        await self._move(surplus, redirect)
        return len(surplus)

    async def reload_client(self, connection_id: str, redirect: str) -> bool:
        """Move one client (ConnectionManager.loadSingle); False when it is not here."""
        conn = self.table.by_id.get(connection_id)
        if conn is None or not conn.registered or conn.closed:
            return False
        await self._move([conn], redirect)
        return True

    async def smart_reload(self, loader_factor: float) -> bool:
        """ServerLoaderController.smartReload: members above ``avg*(1+f)`` keep that many,
        moving the rest to those below ``avg*(1-f)``."""
        loads = await self.cluster_loads()
        if not loads:
            return True
        avg = sum(m.sdk_count for m in loads) // len(loads)
        over_limit, low_limit = int(avg * (1 + loader_factor)), int(avg * (1 - loader_factor))
        over = sorted((m for m in loads if m.sdk_count > over_limit), key=lambda m: -m.sdk_count)
        low = sorted((m for m in loads if m.sdk_count < low_limit), key=lambda m: m.sdk_count)
        ok = True
        for source, target in zip(over, low, strict=False):
            if source.address == self.self_address:
                await self.reload_count(over_limit, target.address)
            elif self.peers is None or not await self.peers.reload(source.address, over_limit, target.address):
                ok = False
        return ok

    async def _move(self, conns: list[Any], redirect: str) -> None:
        now = self.now_ms()
        resets = []
        for conn in conns:
            if conn.closed:
                continue
            self.moved += 1
            if self.on_move is not None:
                self.on_move(conn.connection_id)
            if conn.client_version.startswith(NO_RESET_CLIENTS):
                self.table.unregister(conn.connection_id, "moved to another server (rebalancing)")
            else:
                conn.expelled_at_ms = now  # the keep-alive scan closes it if the client ignores the reset
                resets.append(conn)
        if resets:
            await asyncio.gather(*(self.resetter.reset(c, redirect) for c in resets))
        if conns:
            log.info("moved %d connections towards %s", len(conns), redirect or "any server")

    # --- automatic rebalancing --------------------------------------------------------------
    def plan(self, loads: list[MemberLoad]) -> tuple[int, str]:
        """How many of this node's connections to move now, and where; (0, "") for none."""
        if len(loads) < max(len(self.members()), 2) or any(m.loading for m in loads):
            return 0, ""  # a member did not answer or is loading its snapshot: wait
        counts = {m.address: m.sdk_count for m in loads}
        mine = counts.get(self.self_address, 0)
        avg = sum(counts.values()) / len(counts)
        spread = max(counts.values()) - min(counts.values())
        if avg <= 0 or spread <= self.config.rebalance_threshold * avg:
            return 0, ""
        target = min(counts, key=lambda a: (counts[a], a))
        surplus = mine - math.ceil(avg)
        room = math.ceil(avg) - counts[target]
        count = min(surplus, room, self.config.rebalance_rate, mine - self.config.rebalance_floor)
        if count <= 0 or target == self.self_address:
            return 0, ""
        return count, target

    async def rebalance_tick(self) -> int:
        """One automatic round: returns how many connections were moved."""
        if not self.is_serving():
            return 0
        count, target = self.plan(await self.cluster_loads())
        if count <= 0:
            return 0
        conns = sorted(self.sdk_connections(), key=lambda c: c.created_mono_ms)[-count:]
        await self._move(conns, target)
        return len(conns)
