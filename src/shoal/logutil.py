"""Logging helpers shared by the node's modules.

:class:`CollapsingHandler` collapses a message repeated at WARNING or above (a peer that keeps
failing the same way, every retry) into its first line and, when the burst ends, one line with
how many more came: a handler-level guard, so no call site has to remember to rate-limit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CollapsingHandler"]


@dataclass
class _Burst:
    first: logging.LogRecord
    started: float
    repeats: int = 0


class CollapsingHandler(logging.Handler):
    """Pass records to ``target``; the same WARNING+ message again within ``window_s`` is only counted.

    "The same" is the same logger, level and rendered message. A burst ends when its window has
    passed; its count is reported (one line, ``... repeated N more times in X s``) with the next
    record handled, or at :meth:`flush` / :meth:`close`. Lower levels always pass. At most
    ``max_bursts`` messages are tracked; past that, untracked repeats pass through uncounted.
    """

    def __init__(self, target: logging.Handler, window_s: float = 30.0, *, max_bursts: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.target = target
        self.window_s = window_s
        self.max_bursts = max_bursts
        self.clock = clock
        self._bursts: dict[tuple[str, int, str], _Burst] = {}

    def emit(self, record: logging.LogRecord) -> None:
        """Forward ``record`` unless it repeats a WARNING+ message of the current window."""
        now = self.clock()
        self._end_bursts(now)
        if record.levelno < logging.WARNING:
            self.target.handle(record)
            return
        key = (record.name, record.levelno, record.getMessage())
        burst = self._bursts.get(key)
        if burst is not None:
            burst.repeats += 1
            return
        if len(self._bursts) < self.max_bursts:
            self._bursts[key] = _Burst(record, now)
        self.target.handle(record)

    def repeats(self) -> int:
        """Records counted and not reported yet, over every burst."""
        return sum(b.repeats for b in self._bursts.values())

    def flush(self) -> None:
        """Report every burst's count now, and forget the bursts."""
        self._end_bursts(None)
        self.target.flush()

    def close(self) -> None:
        """Report what is left, then close the target."""
        self.flush()
        self.target.close()
        super().close()

    def _end_bursts(self, now: float | None) -> None:
        ended = [k for k, b in self._bursts.items() if now is None or now - b.started >= self.window_s]
        for key in ended:
            burst = self._bursts.pop(key)
            if burst.repeats:
                first = burst.first
                elapsed = (now if now is not None else self.clock()) - burst.started
                summary = logging.LogRecord(
                    first.name, first.levelno, first.pathname, first.lineno,
                    "%s (repeated %d more times in %.0f s)", (first.getMessage(), burst.repeats, elapsed),
                    None, first.funcName,
                )
                summary.repeated = burst.repeats
                self.target.handle(summary)
