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
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Sequence

from shoal.config import Config
from shoal.distro.members import MemberManager
from shoal.distro.sync import SyncEngine

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
