"""Progress reporting for long commands: a bar on a terminal, plain lines in logs and CI.

Exports and Spark jobs over millions of rows take seconds to minutes; a person at a terminal wants a
live bar, while a CI log or a redirected stderr wants a few timestamped lines, not carriage returns.
Written to stderr so stdout stays the command's result. No dependency beyond the standard library.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Progress", "spark_progress", "status"]

_BAR_WIDTH = 28


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt_count(n: int) -> str:
    for unit, size in (("G", 1_000_000_000), ("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def status(message: str, stream: TextIO | None = None) -> None:
    """One plain status line (both on a terminal and in logs)."""
    out = stream if stream is not None else sys.stderr
    out.write(f"[shoal] {message}\n")
    out.flush()


class Progress:
    """Progress of ``label`` towards ``total`` (None: unknown, a counter is shown).

    On a TTY the bar is redrawn in place at most every ``interval`` seconds (default 0.1); otherwise
    a line is written per 10 % step (or every ``interval`` seconds, default 10, when the total was
    not known at construction). Thread-safe: a poller thread may call :meth:`set` while the owner calls :meth:`close`.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        interval: float | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.tty = _is_tty(self.stream)
        self.interval = interval if interval is not None else (0.1 if self.tty else 10.0)
        self.done = 0
        self.detail = ""
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._last_step = 0  # 0 % is covered by the "started" line
        self._steps = total is not None  # a growing total (Spark stages) is reported by time instead
        self._closed = False
        self._lock = threading.Lock()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            self._maybe_draw()

    def set(self, done: int, total: int | None = None, detail: str | None = None) -> None:
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
            if detail is not None:
                self.detail = detail
            self._maybe_draw()

    def close(self, message: str | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            text = f"{self.label}: {message or 'done'} in {self.elapsed:.1f}s"
            if self.tty:
                self.stream.write("\r\x1b[2K" + text + "\n")
            else:
                self.stream.write(f"[shoal] {text}\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        if not self.tty:
            self.stream.write(f"[shoal] {self.label}: started\n")
            self.stream.flush()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close("failed" if exc_type is not None else None)

    # -- drawing (lock held) ---------------------------------------------------------------------

    def _maybe_draw(self) -> None:
        if self._closed:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= self.interval:
                self._last_draw = now
                self.stream.write("\r\x1b[2K" + self._bar())
                self.stream.flush()
            return
        if self._steps and self.total:
            step = min(10, int(10 * self.done / self.total))
            if step > self._last_step:
                self._last_step = step
                self._line()
        elif now - self._last_draw >= self.interval:
            self._last_draw = now
            self._line()

    def _counts(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            return f"{_fmt_count(self.done)}/{_fmt_count(self.total)}{unit}"
        return f"{_fmt_count(self.done)}{unit}"

    def _bar(self) -> str:
        detail = f" {self.detail}" if self.detail else ""
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * _BAR_WIDTH)
            bar = "#" * filled + "." * (_BAR_WIDTH - filled)
            return f"{self.label} [{bar}] {frac:4.0%} {self._counts()}{detail} {self.elapsed:.1f}s"
        return f"{self.label} {self._counts()}{detail} {self.elapsed:.1f}s"

    def _line(self) -> None:
        detail = f" {self.detail}" if self.detail else ""
        pct = f" {min(1.0, self.done / self.total):.0%}" if self.total else ""
        self.stream.write(f"[shoal] {self.label}:{pct} {self._counts()}{detail} ({self.elapsed:.1f}s)\n")
        self.stream.flush()


@contextmanager
def spark_progress(
    spark: SparkSession, label: str, *, stream: TextIO | None = None, poll_s: float = 0.5
) -> Iterator[Progress]:
    """Show the tasks of the Spark stages that run inside the ``with`` block.

    A daemon thread polls ``SparkContext.statusTracker()`` (cheap, driver-side) every ``poll_s``.
    Spark plans stages as a job goes (adaptive execution adds some), so the total is not known in
    advance: the line shows tasks completed of the tasks of the stages seen so far, not a percentage.
    """
    progress = Progress(label, None, stream=stream)
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    seen: set[int] = set()

    def poll() -> None:
        while not stop.wait(poll_s):
            seen.update(tracker.getActiveStageIds())
            done = total = 0
            for sid in seen:  # finished stages too: their final counts replace the last snapshot
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if seen:
                progress.set(done, None, detail=f"of {total} tasks done, {len(seen)} stages")

    thread = threading.Thread(target=poll, name="shoal-spark-progress", daemon=True)
    with progress:
        thread.start()
        try:
            yield progress
        finally:
            stop.set()
            thread.join(timeout=2 * poll_s + 1)
