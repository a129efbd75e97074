"""What an answered write waits for: the seam between the use cases and replication.

A node of several workers (docs/workers.md) answers a client's ephemeral write only once the
node's sibling workers have applied it, so the client's next request finds it whichever worker
the kernel hands it. The use cases know only this protocol; the composition root (``app.py``)
gives them :class:`shoal.distro.barrier.SiblingBarrier` on a worker and nothing (None: no cost at
all) on a single-process node. Other nodes are never waited for: across nodes Distro stays
eventually consistent, as in Nacos.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol


class WriteBarrier(Protocol):
    """Called right after a write of ``client_id`` was applied here (model events dispatched):
    something to await before answering it, or None to answer at once. It never raises; a wait
    that fails or times out still ends (the write stands, replication repairs the rest)."""

    def __call__(self, client_id: str) -> Awaitable[None] | None: ...
