"""Progress reporting for long commands: a bar on a terminal, plain lines in logs and CI.

Exports and Spark jobs over millions of rows take seconds to minutes; a person at a terminal wants a
live bar, while a CI log or a redirected stderr wants a few timestamped lines, not carriage returns.
Written to stderr so stdout stays the command's result. No dependency beyond the standard library.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["JobProgress", "Progress", "spark_progress", "status"]

log = logging.getLogger(__name__)

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
    a line is written per 10 % step, and also every ``interval`` seconds (default 10) without one, so
    a long step still shows its detail moving (with no total known at construction: only by time).
    Thread-safe: a poller thread may call :meth:`set` while the owner calls :meth:`close`.
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
        self._steps = total is not None  # a growing total is reported by time only
        # with a known total the first line is the first 10 % step (or ``interval`` after the start);
        # without one the first update is shown at once
        self._last_draw = self._start if self._steps else 0.0
        self._last_step = 0  # 0 % is covered by the "started" line
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
                self._last_draw = now
                self._line()
                return
        if now - self._last_draw >= self.interval:
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




class JobProgress:
    """Progress of a job made of named steps, each step's Spark tasks shown as they complete.

    The job declares its steps up front, so the line counts steps done of a known total and ends at
    100 %; Spark cannot say in advance how many stages and tasks a query will need (adaptive
    execution plans them as it goes), so tasks are the detail of the current step, not the total.
    Each :meth:`step` runs its Spark actions in a job group of its own; a daemon thread polls
    ``SparkContext.statusTracker()`` (driver-side, cheap) every ``poll_s`` for that group's stages
    and their completed tasks. Stages a finished job skipped (their shuffle output was reused) are
    left out, so a finished step shows all of its tasks done.

    With ``enabled=False`` nothing is printed and no thread runs; :meth:`step` still works, so jobs
    do not branch on whether progress is shown.
    """

    def __init__(
        self,
        spark: SparkSession,
        label: str,
        steps: Sequence[str],
        *,
        stream: TextIO | None = None,
        poll_s: float = 0.5,
        enabled: bool = True,
    ) -> None:
        if not steps:
            raise ValueError("a job has at least one step")
        self.steps = tuple(steps)
        self.enabled = enabled
        self.done = 0
        self.progress: Progress | None = (
            Progress(label, len(self.steps), unit="steps", stream=stream) if enabled else None
        )
        self._spark = spark
        self._poll_s = poll_s
        self._prefix = f"shoal-{label.split()[0]}-{uuid.uuid4().hex[:8]}"
        self._current: tuple[str, str] | None = None  # (step name, job group) while a Spark step runs
        self._lock = threading.Lock()  # the poller never reports a step that has just ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> JobProgress:
        if self.progress is not None:
            self.progress.__enter__()
            self._thread = threading.Thread(target=self._poll, name="shoal-spark-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self._poll_s + 1)
        if self.progress is not None:
            self.progress.__exit__(exc_type, exc, tb)

    @contextmanager
    def step(self, name: str, *, spark_jobs: bool = True) -> Iterator[None]:
        """Run the block as the next step; ``spark_jobs=False`` for driver-only work (no job group)."""
        if self.done >= len(self.steps):
            raise RuntimeError(f"step {name!r}: all {len(self.steps)} steps of the job are done")
        if self.progress is None:
            yield
            self.done += 1
            return
        if not spark_jobs:
            self.progress.set(self.done, detail=f"{name} ...")
            yield
            self.done += 1
            self.progress.set(self.done, detail=f"{name} done")
            return
        sc = self._spark.sparkContext
        group = f"{self._prefix}-{self.done + 1}"
        saved = {key: sc.getLocalProperty(key) for key in _JOB_GROUP_PROPERTIES}
        sc.setJobGroup(group, f"{self.progress.label}: {name}", interruptOnCancel=False)
        with self._lock:
            self._current = (name, group)
            self.progress.set(self.done, detail=f"{name} ...")
        try:
            yield
        finally:
            with self._lock:
                self._current = None
            for key, value in saved.items():
                sc.setLocalProperty(key, value)  # type: ignore[arg-type]  # None removes the property
        tasks = self._settled_tasks(group)
        self.done += 1
        self.progress.set(self.done, detail=f"{name} done{_fmt_tasks(tasks)}")

    def skip(self, name: str) -> None:
        """Count the next step as done without running it (e.g. nothing to compute)."""
        self.done += 1
        if self.progress is not None:
            self.progress.set(self.done, detail=f"{name} skipped")

    # -- status tracker ----------------------------------------------------------------------------

    def _tasks(self, group: str) -> tuple[int, int, int, int]:
        """(tasks completed, tasks, jobs, jobs still running) of the stages of ``group``'s jobs."""
        tracker = self._spark.sparkContext.statusTracker()
        done = total = jobs = running = 0
        seen: set[int] = set()
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            if info is None:
                continue
            jobs += 1
            finished = info.status != "RUNNING"
            running += not finished
            for stage_id in list(info.stageIds):
                if stage_id in seen:  # a reused shuffle stage appears in later jobs too
                    continue
                seen.add(stage_id)
                stage = tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                if finished and stage.numCompletedTasks == 0 and stage.numActiveTasks == 0:
                    continue  # skipped: its output was already there
                done += stage.numCompletedTasks
                total += stage.numTasks
        return done, total, jobs, running

    def _settled_tasks(self, group: str) -> tuple[int, int] | None:
        """The group's task counts once the status store has caught up with its finished jobs.

        The store is fed asynchronously by Spark's listener bus, so right after an action returns it
        may still show the job running; wait briefly (bounded) for it rather than report a step
        done with tasks missing."""
        deadline = time.monotonic() + _SETTLE_S
        first_job_by = time.monotonic() + _FIRST_JOB_S
        while True:
            try:
                done, total, jobs, running = self._tasks(group)
            except Exception:  # progress must never fail the job
                log.debug("spark status query failed", exc_info=True)
                return None
            now = time.monotonic()
            if (jobs and not running) or now >= deadline or (not jobs and now >= first_job_by):
                return (done, total) if jobs else None
            time.sleep(0.02)

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            current = self._current
            if current is None or self.progress is None:
                continue
            name, group = current
            try:
                done, total, jobs, _ = self._tasks(group)
            except Exception:  # the session may be stopping; progress must never fail the job
                log.debug("spark status poll failed", exc_info=True)
                continue
            with self._lock:
                if jobs and self._current == current:
                    self.progress.set(self.done, detail=f"{name}{_fmt_tasks((done, total))}")


_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
#: Longest wait for the status store to show a finished step's jobs as finished.
_SETTLE_S = 5.0
#: Longest wait for a step's first job to appear in the store (a step may run no Spark job at all).
_FIRST_JOB_S = 0.3


def _fmt_tasks(tasks: tuple[int, int] | None) -> str:
    if tasks is None or not tasks[1]:
        return ""
    done, total = tasks
    return f": {done}/{total} tasks"


def spark_progress(
    spark: SparkSession,
    label: str,
    steps: Sequence[str],
    *,
    stream: TextIO | None = None,
    poll_s: float = 0.5,
    enabled: bool = True,
) -> JobProgress:
    """A :class:`JobProgress` for ``label`` with ``steps`` (use it as a context manager)."""
    return JobProgress(spark, label, steps, stream=stream, poll_s=poll_s, enabled=enabled)
