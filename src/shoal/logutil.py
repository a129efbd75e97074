"""Logging helpers shared by the node's modules.

:class:`CollapsingHandler` collapses a message repeated at WARNING or above (a peer that keeps
failing the same way, every retry) into its first line and, when the burst ends, one line with
how many more came: a handler-level guard, so no call site has to remember to rate-limit.

:class:`RateLimitedLog` is for input a node does not control (garbage frames, bad bodies, bad
HTTP), whose lines differ from one another (peer, connection id, detail) so the handler would not
collapse them: a call site names the *kind*, the first line of each kind is written at once, the
rest are counted for ``interval_s`` seconds and reported in one line, and a traceback goes only
with a written line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ACCESS_LOGGER", "CollapsingHandler", "RateLimitedLog"]

#: The logger of the HTTP access log: written by the HTTP transport, routed by :mod:`shoal.logconfig`
#: (named here so that logconfig needs no import of a transport).
ACCESS_LOGGER = "shoal.access"


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


@dataclass
class _Window:
    started: float
    level: int
    message: str
    held: int = 0
    timer: asyncio.TimerHandle | None = None


class RateLimitedLog:
    """At most one line per kind per ``interval_s``, then one line with how many were held back.

    :meth:`log` writes the line when no line of ``kind`` was written in the last ``interval_s``
    seconds and otherwise counts it. When a window with held-back lines ends, one line reports
    the count: when the window ends if an event loop is running (one timer per window that held
    something back), else with the next line of that kind or at :meth:`flush`. A traceback
    (``exc_info``) goes only with a written line, so an unexpected failure repeated a thousand
    times costs one traceback per interval. At most ``max_kinds`` kinds are tracked; past that,
    new kinds share one window (:attr:`OTHER`).
    """

    OTHER = "(other kinds)"

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0, *,
                 clock: Callable[[], float] = time.monotonic, max_kinds: int = 256) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self.max_kinds = max_kinds
        self._windows: dict[str, _Window] = {}

    def warning(self, kind: str, msg: str, *args: object) -> bool:
        """:meth:`log` at WARNING, without a traceback."""
        return self.log(logging.WARNING, kind, msg, *args)

    def log(self, level: int, kind: str, msg: str, *args: object,
            exc_info: BaseException | bool | None = None) -> bool:
        """Write this line now, or count it against ``kind``'s window; True when written."""
        now = self.clock()
        self._end_windows(now, only=kind)
        if kind not in self._windows and len(self._windows) >= self.max_kinds:
            self._end_windows(now)
            if len(self._windows) >= self.max_kinds:
                kind = self.OTHER
        window = self._windows.get(kind)
        if window is not None and now - window.started < self.interval_s:
            window.held += 1
            if window.timer is None:
                self._arm(kind, window, now)
            return False
        text = msg % args if args else msg
        self._windows[kind] = _Window(now, level, text if len(text) <= 300 else text[:300] + "...")
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def held_back(self, kind: str) -> int:
        """How many lines of ``kind`` are counted and not reported yet."""
        window = self._windows.get(kind)
        return 0 if window is None else window.held

    def flush(self) -> None:
        """Report the count of every window that has ended, and forget those windows."""
        self._end_windows(self.clock())

    def _end_windows(self, now: float, only: str | None = None) -> None:
        kinds = [only] if only is not None else list(self._windows)
        for kind in kinds:
            window = self._windows.get(kind)
            if window is not None and now - window.started >= self.interval_s:
                del self._windows[kind]
                self._report(window)

    def _report(self, window: _Window) -> None:
        if window.timer is not None:
            window.timer.cancel()
            window.timer = None
        if window.held:
            self.logger.log(window.level, "%d more like this in the last %g s: %s",
                            window.held, self.interval_s, window.message)
            window.held = 0

    def _arm(self, kind: str, window: _Window, now: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        window.timer = loop.call_later(max(0.0, window.started + self.interval_s - now), self._expire, kind, window)

    def _expire(self, kind: str, window: _Window) -> None:
        window.timer = None
        if self._windows.get(kind) is window:
            del self._windows[kind]
        self._report(window)
