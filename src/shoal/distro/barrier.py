"""Read-your-writes across the workers of one node (docs/workers.md, "Writes wait for the sibling workers").

:class:`SiblingBarrier` is the :class:`~shoal.service_layer.barrier.WriteBarrier` of a worker: a
write of a client, already applied here and queued to every peer by the Distro processor (events
are synchronous), waits until each sibling worker acknowledged the sync batch carrying it
(:meth:`SyncEngine.delivery`; siblings are synced at once, not after ``sync.delayMs``). The wait is
bounded: it ends when the batch fails, and after ``shoal.server.workers.write-wait-ms`` whatever
happens; a sibling that is DOWN, backing off or already sitting on an unanswered batch longer
than that is not waited for at all. A write that could not be confirmed is answered as a success
all the same (it is applied here; sync retries and verify repair the sibling) and counted in
:attr:`SiblingBarrier.outcomes` (``shoal_workers_write_waits_total{outcome}``), logged at DEBUG.
Other nodes are never waited for.

:class:`SiblingCatchUp` does the same for CP writes (persistent instances, operators' edits, service
documents, namespaces, users...): each worker reads them from its own view of the CP store, so a
write, once the writer's view shows it, waits until each sibling answered a ``CpCatchUpRequest``
(:class:`CpCatchUpReceiver`: its view reached the write's revision), bounded by the same setting.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Sequence

from shoal.config import Config
from shoal.cp.store import CpStore, Keyspace
from shoal.distro.members import MemberManager, MemberState
from shoal.distro.sync import SyncEngine
from shoal.distro.transport import PeerError, PeerTransport, PeerUnavailable

log = logging.getLogger(__name__)

#: Outcomes of a write that waited: every sibling acknowledged it, a batch failed, the bound passed.
ACKED, FAILED, TIMEOUT = "acked", "failed", "timeout"


def waits_for_siblings(config: Config, members: MemberManager | None) -> bool:
    """Whether this process's writes wait for sibling workers: a worker of a node of several, with a
    positive ``shoal.server.workers.write-wait-ms``."""
    return members is not None and bool(members.sibling_addresses()) and config.workers_write_wait_ms > 0


class SiblingBarrier:
    """Waits, bounded, until the sibling workers hold a client's latest write."""

    def __init__(self, engine: SyncEngine, siblings: Sequence[str], wait_ms: int) -> None:
        self.engine = engine
        self.siblings = tuple(siblings)
        self.wait_s = wait_ms / 1000
        #: writes that waited, by outcome (a write with nothing to wait for is not counted)
        self.outcomes: Counter[str] = Counter()

    def __call__(self, client_id: str) -> Awaitable[None] | None:
        waits = [w for w in (self.engine.delivery(s, client_id) for s in self.siblings) if w is not None]
        return self._wait(client_id, waits) if waits else None

    async def _wait(self, client_id: str, waits: list[asyncio.Future[bool]]) -> None:
        # asyncio.wait never cancels the futures, which other writes of the same client may share
        done, pending = await asyncio.wait(waits, timeout=self.wait_s)
        if pending:
            self.outcomes[TIMEOUT] += 1
            log.debug("a write of %s was answered before %d sibling workers confirmed it within %.0f ms",
                      client_id, len(pending), self.wait_s * 1000)
        elif all(w.result() for w in done):
            self.outcomes[ACKED] += 1
        else:
            self.outcomes[FAILED] += 1
            log.debug("a write of %s was answered though a sync batch to a sibling worker failed", client_id)


#: A worker asks a sibling to answer once its view of a keyspace reached a revision (docs/protocol.md §6.4).
CP_CATCH_UP_REQUEST = "CpCatchUpRequest"
CP_CATCH_UP_RESPONSE = "CpCatchUpResponse"


def cp_catch_up_body(keyspace: Keyspace, revision: int) -> bytes:
    return json.dumps({"keyspace": keyspace.value, "revision": revision}).encode()


class SiblingCatchUp:
    """A worker's :class:`~shoal.cp.store.SiblingViews`: a CP write, once this worker's view shows it,
    waits until every sibling worker answered a :data:`CP_CATCH_UP_REQUEST` (its view of the keyspace
    reached the revision; the embedded store polls the shared file at once on it), bounded by
    ``shoal.server.workers.write-wait-ms``. A DOWN sibling is not asked; a sibling that fails or
    passes the bound is counted in :attr:`outcomes` and the write is answered all the same (it is
    stored: the sibling's view gets it from its next poll or watch event)."""

    def __init__(self, transport: PeerTransport, members: MemberManager, siblings: Sequence[str],
                 wait_ms: int) -> None:
        self.transport = transport
        self.members = members
        self.siblings = tuple(siblings)
        self.wait_ms = wait_ms
        #: writes that waited, by outcome (as :attr:`SiblingBarrier.outcomes`)
        self.outcomes: Counter[str] = Counter()

    def __call__(self, keyspace: Keyspace, revision: int) -> Awaitable[None] | None:
        peers = self.members.peers
        targets = [s for s in self.siblings if s not in peers or peers[s].state is not MemberState.DOWN]
        return self._wait(targets, cp_catch_up_body(keyspace, revision)) if targets else None

    async def _wait(self, targets: list[str], body: bytes) -> None:
        calls = [asyncio.ensure_future(self._ask(t, body)) for t in targets]
        done, pending = await asyncio.wait(calls, timeout=self.wait_ms / 1000)
        for call in pending:
            call.cancel()
        if pending:
            self.outcomes[TIMEOUT] += 1
        elif all(c.result() for c in done):
            self.outcomes[ACKED] += 1
        else:
            self.outcomes[FAILED] += 1

    async def _ask(self, target: str, body: bytes) -> bool:
        try:
            _type, answer = await self.transport.call(target, CP_CATCH_UP_REQUEST, body, self.wait_ms)
            return bool(json.loads(answer).get("caughtUp"))
        except (PeerError, PeerUnavailable, TimeoutError, ValueError) as exc:
            log.debug("CP catch-up of sibling worker %s failed: %s", target, exc)
            return False


class CpCatchUpReceiver:
    """The answering side of :data:`CP_CATCH_UP_REQUEST`: once this process's views of the keyspace
    reached the revision (:meth:`CpStore.catch_up`), or the bound passed (``caughtUp`` false)."""

    def __init__(self, store: CpStore, wait_ms: int) -> None:
        self.store = store
        self.wait_s = wait_ms / 1000

    async def handle(self, _sender: str, body: bytes) -> tuple[str, bytes]:
        request = json.loads(body)  # shape checked by bodies.cp_catch_up_request
        caught_up = await self.store.catch_up(Keyspace(request["keyspace"]), request["revision"], self.wait_s)
        return CP_CATCH_UP_RESPONSE, b'{"caughtUp":true}' if caught_up else b'{"caughtUp":false}'
