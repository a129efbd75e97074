"""Injected time, so engines can be stepped by hand in tests.

Every component reads time through a Clock. Wall-clock milliseconds are what Nacos puts on
the wire (lastRefTime, connection ids); monotonic milliseconds drive timeouts and scans.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where every component reads time: wall-clock ms for the wire, monotonic ms for deadlines.

    :class:`SystemClock` in a node; :class:`ManualClock` in tests that step engines by hand.
    """

    def now_ms(self) -> int:
        """Wall-clock epoch milliseconds (for wire fields)."""

    def monotonic_ms(self) -> int:
        """Monotonic milliseconds (for deadlines and idle times)."""


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to; both readings advance together."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._wall = start_ms
        self._mono = 0

    def now_ms(self) -> int:
        return self._wall

    def monotonic_ms(self) -> int:
        return self._mono

    def advance(self, ms: int) -> None:
        """Move both readings forward by ``ms`` (never backwards)."""
        if ms < 0:
            raise ValueError("a clock does not go backwards")
        self._wall += ms
        self._mono += ms
