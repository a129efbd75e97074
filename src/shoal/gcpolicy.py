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

Blocks under that threshold come from the heap, and glibc gives the heap's memory back only from
its top. Under load, a burst of garbage requests (each one's reads, aiohttp's error message and
400 answer, a few hundred kB apiece) spreads freed blocks all over the main heap while the live
requests around them pin its top: after 20 s of the soak's garbage at one node under the soak's
load, its main heap held 116 MB free in 1,200 holes and the RSS stayed at 263 MB from a baseline of
89 MB for good, although nothing held that memory any more (``malloc_trim(0)`` gave it all back
in 15 ms). So the policy also runs a :class:`HeapTrimmer`: every :data:`TRIM_CHECK_INTERVAL_MS` it
reads how much the heaps hold free (``mallinfo2``, a walk of the free lists), and when that grew by
:data:`TRIM_MIN_FREE` since the last trim it calls ``malloc_trim(0)`` off the loop, which hands the
free pages inside the heaps back (``MADV_DONTNEED``) while keeping their address space.

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
from collections.abc import Callable, Iterator
from typing import Final

from shoal.tasks import Periodic, run_blocking

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
#: How often the heap trimmer reads the heaps' free bytes.
TRIM_CHECK_INTERVAL_MS: Final = 2000
#: Free bytes the heaps must have gained since the last trim (or their low point since) before a trim.
TRIM_MIN_FREE: Final = 16 * 1024 * 1024


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc >= 2.33)."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc malloc's mmap threshold at ``threshold`` (which also stops its dynamic trim
    threshold); True when done. Not on another libc, nor when ``MALLOC_MMAP_THRESHOLD_`` is set:
    the operator's choice wins."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    libc = _libc()
    try:
        mallopt = libc.mallopt  # type: ignore[union-attr]
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))


class HeapTrimmer:
    """Hands the free pages inside glibc malloc's heaps back to the system once enough was freed
    (see the module doc): ``malloc_trim(0)`` when the heaps' free bytes grew by ``min_free`` over
    their lowest reading since the last trim. A trimmed hole stays on the free lists (only its
    pages went back), so the free bytes do not fall after a trim: the low point starts again from
    the reading after it, and blocks reused later lower it.

    :meth:`load` gives None where the C library has no ``mallinfo2``/``malloc_trim`` (not glibc).
    """

    def __init__(self, mallinfo2: Callable[[], _MallInfo2], malloc_trim: Callable[[int], int],
                 min_free: int = TRIM_MIN_FREE) -> None:
        self._mallinfo2 = mallinfo2
        self._malloc_trim = malloc_trim
        self.min_free = min_free
        self._low = self.free_bytes()
        #: Trims done so far.
        self.trims = 0

    @classmethod
    def load(cls, min_free: int = TRIM_MIN_FREE) -> HeapTrimmer | None:
        libc = _libc()
        try:
            mallinfo2, malloc_trim = libc.mallinfo2, libc.malloc_trim  # type: ignore[union-attr]
        except AttributeError:
            return None
        mallinfo2.argtypes, mallinfo2.restype = [], _MallInfo2
        malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        return cls(mallinfo2, malloc_trim, min_free)

    def free_bytes(self) -> int:
        """Bytes the heaps hold free (resident or not): ordinary and fastbin chunks."""
        info = self._mallinfo2()
        return int(info.fordblks) + int(info.fsmblks)

    def due(self) -> bool:
        """Whether the heaps gained ``min_free`` free bytes over their low point (constant in the
        registry's size: a walk of the free lists only)."""
        free = self.free_bytes()
        self._low = min(self._low, free)
        return free - self._low >= self.min_free

    def trim(self) -> None:
        """``malloc_trim(0)``: blocking (it walks and madvises the free chunks; 15 ms for 116 MB),
        so the periodic runs it off the loop."""
        self._malloc_trim(0)
        self.trims += 1
        self._low = self.free_bytes()

    def periodic(self) -> Periodic:
        """The periodic check, owned by the entry point like the collector's (the heap is process-wide)."""

        async def tick() -> None:
            if self.due():
                await run_blocking(self.trim)

        return Periodic("heap-trim", TRIM_CHECK_INTERVAL_MS, tick)


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
