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

A node of workers (``--workers N``) is one node here too: its figures are its workers' summed
(:meth:`ServerLoader.node_metrics`, each sibling asked on its private port), a reload keeps the
node's count by moving each worker's share (:meth:`ServerLoader.node_reload_count`), and the
automatic round runs in worker 0 only, for the whole node.

Either way the connection id is handed to ``on_move`` first: the service layer then keeps the
moved client's instances listed until it has registered again or ``shoal.rebalance.grace-ms``
passes (:mod:`shoal.service_layer.moved`), so subscribers see no false removal.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
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

    async def reload_client(self, address: str, connection_id: str, redirect: str) -> bool:
        """Ask the member to move one client (True when the call was answered)."""


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

    @property
    def complete(self) -> bool:
        """False when some of a node's workers did not answer (its counts are partial)."""
        return self.metric.get("workersAnswered", "") == self.metric.get("workers", "")


#: The figures of a worker's loader metrics a node's answer sums over its workers.
SUMMED = ("conCount", "sdkConCount", "keptClients")


def _count(metric: Mapping[str, str], key: str) -> int:
    """A count of a worker's metrics (0 when absent or not a number)."""
    try:
        return int(metric.get(key, "0") or 0)
    except ValueError:
        return 0


def split_moves(counts: list[int], excess: int) -> list[int]:
    """How many connections each worker moves so the node sheds ``excess``: in proportion to
    what each holds (largest remainders first, then the lower index), never more than it holds."""
    total = sum(counts)
    excess = min(max(excess, 0), total)
    if excess == 0:
        return [0] * len(counts)
    moves = [excess * c // total for c in counts]
    order = sorted(range(len(counts)), key=lambda i: (-(excess * counts[i] % total), i))
    left = excess - sum(moves)
    for i in order:
        if left <= 0:
            break
        if moves[i] < counts[i]:
            moves[i] += 1
            left -= 1
    return moves


class ServerLoader:
    """Loader metrics, the manual reload operations and the automatic rebalancing tick."""

    def __init__(self, config: Config, table: LoaderTable, resetter: Resetter, self_address: str,
                 members: Callable[[], list[str]], peers: LoaderPeers | None,
                 is_serving: Callable[[], bool], now_ms: Callable[[], int],
                 on_move: Callable[[str], None] | None = None, kept: Callable[[], int] | None = None,
                 workers: Sequence[str] = (), worker_index: int = 0,
                 sibling_connections: Callable[[], int] | None = None) -> None:
        """``workers`` (a worker's: every worker's private ``ip:port`` in index order, this one's
        included; empty for a single-process node) and ``worker_index`` place it in its node;
        ``sibling_connections`` is what its siblings' last member reports said they hold."""
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
        self.workers = tuple(workers)
        self.worker_index = worker_index
        self.sibling_connections = sibling_connections
        self.moved = 0

    def siblings(self) -> list[tuple[int, str]]:
        """The other workers of this node: (index, private ``ip:port``)."""
        return [(i, a) for i, a in enumerate(self.workers) if i != self.worker_index]

    # --- metrics -------------------------------------------------------------------------
    def sdk_connections(self) -> list[Any]:
        return [c for c in self.table.by_id.values()
                if c.registered and not c.closed and c.source == "sdk" and c.expelled_at_ms is None]

    def local_metrics(self) -> dict[str, str]:
        """This node's ServerLoaderInfoResponse.loaderMetrics (plus Shoal's ``loading`` and ``keptClients``)."""
        registered = [c for c in self.table.by_id.values() if c.registered and not c.closed]
        metric = {"conCount": str(len(registered)), "sdkConCount": str(len(self.sdk_connections())),
                  "load": "0", "cpu": "0", "loading": "false" if self.is_serving() else "true",
                  "keptClients": str(self.kept() if self.kept is not None else 0)}
        if self.sibling_connections is not None:  # what the limit checks add to this worker's own
            metric["siblingConCount"] = str(self.sibling_connections())
        return metric

    async def _workers_metrics(self) -> list[dict[str, str] | None]:
        """Every worker's own metrics in index order (this one's from here; None: did not answer)."""
        siblings = self.siblings()
        answers: list[dict[str, str] | None] = []
        if self.peers is not None and siblings:
            peers = self.peers
            answers = list(await asyncio.gather(*(peers.metrics(a) for _, a in siblings)))
        out: list[dict[str, str] | None] = [None] * max(len(self.workers), 1)
        out[self.worker_index if self.workers else 0] = self.local_metrics()
        for (i, _), answer in zip(siblings, answers, strict=False):
            out[i] = answer
        return out

    async def node_metrics(self) -> dict[str, str]:
        """The node's loader metrics: a single process's own; a node of workers' summed over the
        workers that answered, ``loading`` while any is, and per worker ``workers``,
        ``workersAnswered``, ``workerConCount`` and ``workerSdkConCount`` (comma-separated in
        worker order, ``-`` for one that did not answer)."""
        if not self.workers:
            return self.local_metrics()
        per_worker = await self._workers_metrics()
        answered = [m for m in per_worker if m is not None]
        metric = dict(per_worker[self.worker_index] or {})
        metric.pop("siblingConCount", None)
        for key in SUMMED:
            metric[key] = str(sum(_count(m, key) for m in answered))
        metric["loading"] = "true" if any(m.get("loading") == "true" for m in answered) else "false"
        metric["workers"] = str(len(per_worker))
        metric["workersAnswered"] = str(len(answered))
        for key, name in (("conCount", "workerConCount"), ("sdkConCount", "workerSdkConCount")):
            metric[name] = ",".join(m.get(key, "0") if m is not None else "-" for m in per_worker)
        return metric

    async def cluster_loads(self) -> list[MemberLoad]:
        """Every member's metrics that arrived (self always), sorted by address."""
        loads = [MemberLoad(self.self_address, await self.node_metrics())]
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

    async def node_reload_count(self, keep: int, redirect: str) -> int:
        """Keep at most ``keep`` SDK connections on this node: a single process as
        :meth:`reload_count`; a node of workers moves each worker's share of the surplus
        (:func:`split_moves`; a worker that does not answer keeps its own). Returns how many this
        worker moved plus how many its siblings were asked to."""
        if not self.workers:
            return await self.reload_count(keep, redirect)
        per_worker = await self._workers_metrics()
        counts = [_count(m, "sdkConCount") if m is not None else 0 for m in per_worker]
        moves = split_moves(counts, sum(counts) - max(keep, 0))
        asked = []
        for index, address in self.siblings():
            if moves[index] > 0 and self.peers is not None:
                asked.append(self.peers.reload(address, counts[index] - moves[index], redirect))
        moved = await self.reload_count(counts[self.worker_index] - moves[self.worker_index], redirect)
        await asyncio.gather(*asked)
        return moved + sum(m for i, m in enumerate(moves) if i != self.worker_index)

    async def node_reload_client(self, connection_id: str, redirect: str) -> bool:
        """Move one client of this node, whichever worker holds it (each sibling is asked when
        it is not here); True when it was here."""
        if await self.reload_client(connection_id, redirect):
            return True
        if self.peers is not None:
            peers = self.peers
            await asyncio.gather(*(peers.reload_client(a, connection_id, redirect) for _, a in self.siblings()))
        return False

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
                await self.node_reload_count(over_limit, target.address)
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
        if len(loads) < max(len(self.members()), 2) or any(m.loading or not m.complete for m in loads):
            return 0, ""  # a member (or a worker of one) did not answer or is loading its snapshot: wait
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
        """One automatic round: returns how many connections were moved (by the node's workers:
        only worker 0 of a node of workers decides, for the node)."""
        if not self.is_serving() or (self.workers and self.worker_index != 0):
            return 0
        loads = await self.cluster_loads()
        count, target = self.plan(loads)
        if count <= 0:
            return 0
        if self.workers:
            mine = next(m.sdk_count for m in loads if m.address == self.self_address)
            return await self.node_reload_count(mine - count, target)
        conns = sorted(self.sdk_connections(), key=lambda c: c.created_mono_ms)[-count:]
        await self._move(conns, target)
        return len(conns)
