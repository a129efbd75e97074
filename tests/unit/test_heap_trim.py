"""The heap trimmer (shoal/gcpolicy.py, ``HeapTrimmer``) on this process's real glibc malloc.

Blocks freed in the middle of the heap stay resident (glibc gives a heap back only from its top):
after a burst of garbage under load a node kept 116 MB of such holes for good. The trimmer must
see the free bytes grow and hand the holes' pages back.
"""

from __future__ import annotations

import os

import pytest

from shoal.gcpolicy import HeapTrimmer
from shoal.testing.faults import rss_kb

MIB = 1024 * 1024


@pytest.fixture
def trimmer() -> HeapTrimmer:
    loaded = HeapTrimmer.load(min_free=8 * MIB)
    # the node's platform is Debian's glibc (>= 2.33: mallinfo2); only elsewhere has a node no trimmer
    assert loaded is not None, "this C library has no mallinfo2/malloc_trim: the node would keep its heap holes"
    return loaded


def _holes(total: int) -> tuple[list[bytes], list[bytes]]:
    """``total`` bytes of 64 kB blocks, each followed by a small block that stays: freeing the
    big ones leaves holes no top trim reaches."""
    big, pins = [], []
    for n in range(total // (64 * 1024)):
        big.append(bytes([n % 251]) * (64 * 1024))  # touched, so resident
        pins.append(bytes([n % 251]) * 1000)
    return big, pins


def test_freed_holes_make_a_trim_due_and_the_trim_returns_them(trimmer: HeapTrimmer) -> None:
    assert not trimmer.due()
    big, pins = _holes(48 * MIB)
    assert not trimmer.due(), "allocating frees nothing"
    before = rss_kb(os.getpid())
    del big
    assert trimmer.due(), f"free bytes {trimmer.free_bytes()} after freeing 48 MiB of holes"
    trimmer.trim()
    after = rss_kb(os.getpid())
    assert trimmer.trims == 1
    assert before - after >= 24 * 1024, f"RSS {before // 1024} -> {after // 1024} MB"
    assert not trimmer.due(), "the trimmed holes stay free (their pages went back): no second trim"
    assert len(pins) > 0


def test_reused_holes_lower_the_mark(trimmer: HeapTrimmer) -> None:
    big, pins = _holes(24 * MIB)
    del big
    trimmer.trim()
    again, more = _holes(24 * MIB)  # the holes are reused ...
    assert not trimmer.due()
    del again  # ... and freed again: due again
    assert trimmer.due()
    assert len(pins) + len(more) > 0
