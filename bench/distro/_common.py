"""Shared pieces of the Distro benchmarks: signals, GC-pause logging, percentiles, JSON output, py-spy.

The `shoal server` processes themselves come from :mod:`shoal.testing` (the same harness as the
integration tests): every server is started in its own session with PR_SET_PDEATHSIG
(:func:`server_options`), tracked by a :class:`shoal.testing.ServerSet` (a context manager that
kills what it started on any exit), and SIGTERM / SIGINT to the benchmark are turned into an
exception so the ``finally`` blocks run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from shoal.testing import ServerProcess
from shoal.testing.procs import DIE_WITH_PARENT

REPO = Path(__file__).resolve().parent.parent.parent


# --- signals: turn SIGTERM/SIGINT into an exception so cleanup always runs --------------------
class Interrupted(BaseException):
    pass


def run_main(main: Any) -> None:
    """``sys.exit(main())``, reporting an interruption (after the cleanup has run) as exit code 130."""
    try:
        code = main()
    except Interrupted as exc:
        print(f"interrupted ({exc}); every server this run started has been stopped", file=sys.stderr)
        code = 130
    sys.exit(code)


def install_signal_handlers() -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


# --- the server process -------------------------------------------------------------------------
#: Runs `shoal` as ``python -m shoal`` would, but first hooks gc.callbacks to write one line per
#: collection of 5 ms or more to stderr (the server log): ``GCPAUSE <epoch s> gen=<g> ms=<ms>``.
#: A diagnostic only (the node's own code is unchanged).
GC_LOGGER = """
import gc, runpy, sys, time
_t = [0.0]
def _cb(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _t[0]) * 1000
    if ms >= 5:
        sys.stderr.write(f"GCPAUSE {time.time():.3f} gen={info['generation']} ms={ms:.1f}\\n")
gc.callbacks.append(_cb)
sys.argv[0] = "shoal"
runpy.run_module("shoal", run_name="__main__", alter_sys=True)
"""

GC_PAUSE_RE = re.compile(r"^GCPAUSE (\S+) gen=(\d) ms=(\S+)$", re.MULTILINE)


def gc_pauses(server: ServerProcess, since: float = 0.0) -> list[tuple[float, int, float]]:
    """(epoch s, generation, ms) of the collections a GC-logging server reported."""
    return [(float(t), int(g), float(ms)) for t, g, ms in GC_PAUSE_RE.findall(server.log()) if float(t) >= since]


def launched(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped so it dies with this process (cmd[0] must be an absolute executable path)."""
    return [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *cmd]


def server_options(gc_log: bool = False) -> dict[str, Any]:
    """Options for :class:`shoal.testing.ServerProcess` / ``ServerSet.start``: the server dies
    with the benchmark, and with ``gc_log`` its collections of 5 ms or more are logged."""
    return {"die_with_parent": True, "entry": ["-c", GC_LOGGER] if gc_log else ["-m", "shoal"]}


# --- statistics and output ----------------------------------------------------------------------
def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summary_ms(values_s: Sequence[float]) -> dict[str, Any]:
    """count, p50/p95/p99/max/mean of durations given in seconds, reported in ms."""
    ordered = sorted(v * 1000 for v in values_s)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {
        "count": len(ordered),
        "p50_ms": r(percentile(ordered, 50)),
        "p95_ms": r(percentile(ordered, 95)),
        "p99_ms": r(percentile(ordered, 99)),
        "max_ms": r(ordered[-1] if ordered else None),
        "mean_ms": r(sum(ordered) / len(ordered) if ordered else None),
    }


def host_info() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load],
            "python": sys.version.split()[0]}


def emit(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def cpu_timer() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        yield out
    finally:
        out["cpu_s"] = time.process_time() - c0
        out["wall_s"] = time.perf_counter() - w0


# --- optional profiling with py-spy --------------------------------------------------------------
class PySpy:
    """``py-spy record --format raw`` attached to a pid until :meth:`stop`; then the hottest frames."""

    def __init__(self, pid: int, out: Path, rate: int = 100) -> None:
        self.out = out
        local = Path(sys.executable).with_name("py-spy")
        exe = str(local) if local.exists() else shutil.which("py-spy") or "/usr/bin/py-spy"
        self.cmd = [exe, "record", "--pid", str(pid), "--format", "raw",
                    "--rate", str(rate), "--nonblocking", "--threads", "--output", str(out)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.error = ""

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(launched(self.cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as exc:
            self.error = str(exc)

    def stop(self, timeout_s: float = 30.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=timeout_s)
            self.error = err.decode(errors="replace")[-500:] if proc.returncode else ""
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.error = "py-spy did not stop"

    def top(self, n: int = 15) -> dict[str, Any]:
        """Self and inclusive sample shares of the hottest frames (``function (file:line)``)."""
        try:
            lines = self.out.read_text().splitlines()
        except OSError:
            return {"error": self.error or "no py-spy output"}
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        for line in lines:
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
            frames = [f.replace(str(REPO) + "/", "") for f in frames
                      if not f.startswith(("thread ", "process "))] or ["<idle>"]
            total += count
            own[frames[-1]] = own.get(frames[-1], 0) + count
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + count

        def share(table: dict[str, int]) -> list[tuple[str, float]]:
            return [(k, round(100 * v / total, 1)) for k, v in sorted(table.items(), key=lambda kv: -kv[1])[:n]]

        return {"samples": total, "self_pct": share(own), "inclusive_pct": share(inclusive),
                "error": self.error or None}
