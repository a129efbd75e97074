"""Deadline scans over slot tables: pure-Python twin (the specification) of ``ext/expiry.pyx``.

Callers keep per-slot timestamps in parallel ``array.array`` columns (slot = index) and ask once
per scan which slots are past their deadline:

* the connection keep-alive scan (Nacos ``ConnectionManager`` eject/expel of idle gRPC
  connections) uses :func:`idle_slots`;
* the ip:port heartbeat checker (Nacos ``ClientBeatCheckTaskV2`` / ``UnhealthyInstanceChecker``
  and ``ExpiredInstanceChecker``) uses :func:`beat_deadlines`.

Buffers are 1-D buffers of signed int64 (``array('q')``; format ``q``, or ``l`` where that is
8 bytes) or, for the healthy flags, uint8 (``array('B')``, ``bytes``, ``bytearray``). A
negative timestamp marks an empty slot, which is never reported. ``now_ms`` in
:func:`beat_deadlines` must fit a signed int64 (``OverflowError`` otherwise), as in the
compiled kernel.
"""

from __future__ import annotations

import operator
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["beat_deadlines", "idle_slots"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# Byte-order prefixes that mean "native order" on this host.
_NATIVE_PREFIXES = ("@", "=", "<" if sys.byteorder == "little" else ">")
_INT64_CODES = frozenset({"q", "l"})  # with an item size of 8 bytes
_UINT8_CODES = frozenset({"B"})


def _view(buf: Buffer, codes: frozenset[str], itemsize: int, what: str, name: str) -> memoryview:
    """``buf`` as a 1-D memoryview of ``what``; TypeError if not a buffer, ValueError if mistyped.

    Accepts what the compiled kernel's typed memoryviews accept: a native-order format code of
    the right size and signedness, with or without a byte-order prefix (ctypes writes ``<q``).
    """
    view = memoryview(buf)
    if view.ndim != 1:
        raise ValueError(f"{name}: expected a 1-dimensional buffer, got ndim={view.ndim}")
    fmt = view.format
    code = fmt[1:] if fmt[:1] in _NATIVE_PREFIXES else fmt
    if view.itemsize != itemsize or code not in codes:
        raise ValueError(f"{name}: expected a buffer of {what}, got format {fmt!r}")
    if code != fmt:  # memoryview only iterates bare native formats
        view = memoryview(view.tobytes()).cast("B" if itemsize == 1 else "q")
    return view


def idle_slots(stamps: Buffer, now_ms: int, idle_ms: int) -> list[int]:
    """Ascending indices of slots with ``stamp >= 0`` and ``now_ms - stamp >= idle_ms``."""
    view = _view(stamps, _INT64_CODES, 8, "int64", "stamps")
    # now - stamp >= idle  <=>  stamp <= now - idle
    threshold = operator.index(now_ms) - operator.index(idle_ms)
    return [i for i, stamp in enumerate(view) if 0 <= stamp <= threshold]


def beat_deadlines(
    last_beat: Buffer, unhealthy_after: Buffer, remove_after: Buffer, healthy: Buffer, now_ms: int
) -> tuple[list[int], list[int]]:
    """Which ip:port instances turn unhealthy and which are removed, as ``(to_unhealthy, to_remove)``.

    Parallel buffers, one slot per instance: ``last_beat`` (int64 ms, negative = empty slot),
    ``unhealthy_after`` and ``remove_after`` (int64 ms; negative = the rule never fires),
    ``healthy`` (uint8, 1 = currently healthy). Like Nacos, a deadline is passed only when the
    elapsed time is strictly greater than the timeout. A slot due for removal is reported only in
    ``to_remove``; ``to_unhealthy`` holds the remaining slots that are healthy (flag == 1) and past
    their unhealthy timeout. Both lists ascend. ValueError if the buffers differ in length.
    """
    last = _view(last_beat, _INT64_CODES, 8, "int64", "last_beat")
    unhealthy = _view(unhealthy_after, _INT64_CODES, 8, "int64", "unhealthy_after")
    remove = _view(remove_after, _INT64_CODES, 8, "int64", "remove_after")
    flags = _view(healthy, _UINT8_CODES, 1, "uint8", "healthy")
    now_ms = operator.index(now_ms)
    if not _INT64_MIN <= now_ms <= _INT64_MAX:
        raise OverflowError("now_ms does not fit a signed 64-bit integer")
    n = len(last)
    if not len(unhealthy) == len(remove) == len(flags) == n:
        raise ValueError(
            "parallel buffers differ in length: "
            f"last_beat={n}, unhealthy_after={len(unhealthy)}, "
            f"remove_after={len(remove)}, healthy={len(flags)}"
        )
    to_unhealthy: list[int] = []
    to_remove: list[int] = []
    for i in range(n):
        beat = last[i]
        if beat < 0:
            continue
        elapsed = now_ms - beat
        remove_ms = remove[i]
        if remove_ms >= 0 and elapsed > remove_ms:
            to_remove.append(i)
            continue
        unhealthy_ms = unhealthy[i]
        if flags[i] == 1 and unhealthy_ms >= 0 and elapsed > unhealthy_ms:
            to_unhealthy.append(i)
    return to_unhealthy, to_remove
