"""The server process's garbage-collector policy, in one place: thresholds and freezes.

A registry is millions of small, long-lived, acyclic objects (instances, their tuples and
publications). CPython's cyclic collector scans every object of the generations it collects,
so two things stall the event loop of a large node:

* **Young collections over the registry's newest objects.** A generation-1 collection scans
  everything that survived since the last one, up to ``threshold0 x (threshold1 + 1)`` objects.
  Right after a node is loaded with 1,000,000 instances its newest ~150,000 are still young, and
  the first generation-1 collection afterwards (whenever it comes, e.g. while the node serves a
  snapshot to a joining peer) held the loop 124 ms (``bench/distro/snapshot_load.py --gc-log``).
* **Full collections over the whole heap**, seconds at a few million objects.

``gc.freeze()`` moves every tracked object into the permanent generation, which no collection
scans, in constant time. So the policy freezes what exists before the node is built, pauses
the collector while the node starts (a joining node loads its peers' snapshot then) and freezes
what the start built, and then, every
:data:`CHECK_INTERVAL_MS`, looks at the heap's growth since the last freeze. Once growth has
settled (fewer than ``threshold0`` / :data:`SETTLE_DIVISOR` new objects in the last interval:
a registration burst or a snapshot load is over) it freezes again if the heap grew a lot (at
least :data:`FREEZE_MIN_GROWTH` objects and :data:`FREEZE_GROWTH_FRACTION` of what is frozen,
so these freezes are few and geometric), or if what grew is still mostly young (at least
``threshold0`` objects in generations 0 and 1: the next generation-1 collection would scan a
burst's tail of registry objects). Nothing is frozen while the heap keeps growing: young
collections stay bounded by the thresholds, and a full collection needs ~1000 generation-1
collections first. Later collections then scan only what is newer than the registry's bulk.

What a freeze costs: frozen objects are still freed by reference counting, but a reference
*cycle* that was frozen and dies afterwards is never collected. A freeze collects nothing first
(a young collection at that moment would be the very pause it avoids), so the cycles alive or
not yet collected at a freeze stay until exit. The registry's own records are acyclic, and a
freeze needs a settled burst of at least ``threshold0`` objects, so freezes stay rare.

Growth is estimated from the collector's own counters, in constant time: every automatic
collection starts when ``threshold0`` more container objects (tracked or not: a dict of strings
counts) were allocated than freed since the previous one, so growth = ``threshold0`` x
collections - objects they found to be garbage + the current generation-0 count. It is an upper
estimate (CPython does not count frees while that count is 0, i.e. of objects that were
allocated before the last collection and freed after it), close with the thresholds above.

The policy also fixes glibc malloc's mmap threshold (:func:`tune_allocator`). By default glibc
raises that threshold to the size of each large block freed (up to 32 MiB), so after one 9 MiB
message every later block up to 9 MiB comes from the heap's arenas, and those are returned to
the system only from their top: after a burst of large garbage messages a node kept ~45 MB more
than before on grpc.aio (and 226 MB after 307 MB in the issue's 90 s burst), for good. With the
threshold fixed at :data:`MMAP_THRESHOLD`, every block of 1 MiB or more is its own mapping and
goes back to the system when it is freed.

Only the ``shoal server`` entry point (``__main__``) installs this policy, on its one process:
in-process nodes (tests, the simulator) leave their host's collector and allocator alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Iterator
from typing import Final

from shoal.tasks import Periodic

log = logging.getLogger(__name__)

#: The collector's thresholds. With CPython's default first threshold (700) the collector ran so
#: often that it took ~40 % of a 10,000-connection keep-alive scan, hence 50,000. The second
#: threshold bounds a generation-1 collection to ~150,000 objects (with 50 one scanned 2.5 million
#: and held the loop 2.4 s while a 1,000,000-instance node served a snapshot). Full collections
#: stay rare (CPython also waits for 25 % growth of the long-lived heap) and freezes keep the
#: registry out of them.
THRESHOLDS: Final = (50_000, 2, 1000)
#: How often the policy looks at the heap's growth.
CHECK_INTERVAL_MS: Final = 500
#: Tracked objects the heap must have grown by since the last freeze before the next one
#: (~80,000 instances' worth).
FREEZE_MIN_GROWTH: Final = 250_000
#: ... and at least this fraction of what is frozen already.
FREEZE_GROWTH_FRACTION: Final = 0.25
#: Growth has settled when an interval added fewer than ``threshold0`` / this many objects.
SETTLE_DIVISOR: Final = 10
#: Blocks from this size up are mmapped by glibc malloc, and unmapped when freed (see the module doc).
MMAP_THRESHOLD: Final = 1024 * 1024
_M_MMAP_THRESHOLD: Final = -3  # mallopt parameter (glibc malloc.h)


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc malloc's mmap threshold at ``threshold`` (which also stops its dynamic trim
    threshold); True when done. Not on another libc, nor when ``MALLOC_MMAP_THRESHOLD_`` is set:
    the operator's choice wins."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))


class GcPolicy:
    """The process's collector policy: thresholds, the start's freeze and growth freezes.

    ``check()`` is the periodic step (``periodic()`` runs it); it reads only the collector's
    counters, so it costs microseconds whatever the heap's size.
    """

    def __init__(self, thresholds: tuple[int, int, int] = THRESHOLDS, min_growth: int = FREEZE_MIN_GROWTH,
                 growth_fraction: float = FREEZE_GROWTH_FRACTION) -> None:
        self.thresholds = thresholds
        self.min_growth = min_growth
        self.growth_fraction = growth_fraction
        #: Freezes done so far, and an estimate of the objects they froze.
        self.freezes = 0
        self.frozen_estimate = 0
        self._mark = self._allocation_counter()
        self._last_check = self._mark

    def _allocation_counter(self) -> int:
        """A counter whose increase estimates the tracked heap's growth (see the module doc)."""
        stats = gc.get_stats()
        collections = sum(int(s["collections"]) for s in stats)
        collected = sum(int(s["collected"]) for s in stats)
        return gc.get_threshold()[0] * collections - collected + gc.get_count()[0]

    def install(self) -> None:
        """Set the collector's thresholds and the allocator's mmap threshold (once, before the
        node is built)."""
        gc.set_threshold(*self.thresholds)
        if not tune_allocator():
            log.debug("malloc's mmap threshold left as it is (not glibc, or MALLOC_MMAP_THRESHOLD_ set)")
        self._mark = self._last_check = self._allocation_counter()

    def growth(self) -> int:
        """Estimated tracked objects added since the last freeze."""
        return max(0, self._allocation_counter() - self._mark)

    def freeze_startup(self) -> None:
        """Collect once and freeze what exists (modules, configuration, handler tables): a
        full collection is cheap before the registry exists, and never needed for these again."""
        gc.collect()
        gc.freeze()
        self.frozen_estimate = gc.get_freeze_count()  # walks the frozen list: once, while it is small
        self.freezes += 1
        self._mark = self._last_check = self._allocation_counter()

    def freeze(self, reason: str) -> int:
        """Freeze every tracked object now (constant time); returns the estimated growth frozen."""
        grown = self.growth()
        gc.freeze()
        self.freezes += 1
        self.frozen_estimate += grown
        self._mark = self._last_check = self._allocation_counter()
        log.info("froze ~%d tracked objects grown since the last freeze (%s); ~%d frozen in all",
                 grown, reason, self.frozen_estimate)
        return grown

    @contextlib.contextmanager
    def paused(self, reason: str) -> Iterator[None]:
        """The collector off while a bulk of long-lived objects is built (the node's start with
        its snapshot load: otherwise dozens of young collections, each over up to ~150,000 of the
        new registry objects), then what was built frozen and the collector on again. Only
        reference cycles that die meanwhile outlive it (the start is bounded by the load
        timeout)."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            self.freeze(reason)
            if was_enabled:
                gc.enable()

    def check(self) -> bool:
        """Freeze if the heap's growth since the last freeze has settled and was large or is
        still young; returns whether it froze."""
        threshold0 = gc.get_threshold()[0]
        now = self._allocation_counter()
        since_check, self._last_check = now - self._last_check, now
        if since_check >= threshold0 // SETTLE_DIVISOR:
            return False  # still growing: freeze what lasts, not a burst's in-flight objects
        grown = now - self._mark
        count0, count1, _count2 = gc.get_count()
        young = min(grown, count0 + count1 * threshold0)  # objects a generation-1 collection would scan
        if grown >= max(self.min_growth, int(self.growth_fraction * self.frozen_estimate)):
            self.freeze("the heap grew")
        elif young >= threshold0:
            self.freeze("a young tail")
        else:
            return False
        return True

    def periodic(self) -> Periodic:
        """The periodic check (owned by the entry point: the collector is process-wide)."""

        async def tick() -> None:
            self.check()

        return Periodic("gc-policy", CHECK_INTERVAL_MS, tick)
