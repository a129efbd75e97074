"""Shared pieces of the Distro benchmarks: signals, GC-pause logging, percentiles, JSON output, py-spy.

The `shoal server` processes themselves come from :mod:`shoal.testing` (the same harness as the
integration tests): every server is started in its own session with PR_SET_PDEATHSIG
(:func:`server_options`), tracked by a :class:`shoal.testing.ServerSet` (a context manager that
kills what it started on any exit), and SIGTERM / SIGINT to the benchmark are turned into an
exception so the ``finally`` blocks run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any

from shoal.childproc import dying_with_parent
from shoal.testing import ServerProcess

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS_DIR = REPO / "bench" / "results"
#: The gRPC transports a node can serve (``shoal.remote.transport``).
TRANSPORTS = ("native", "grpcio")


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
#: collection of 5 ms or more to stderr (the server log): ``GCPAUSE <epoch s> gen=<g> ms=<ms>``,
#: and runs a task on the node's loop that wakes every 5 ms and writes one line per wake-up late by
#: 20 ms or more: ``LOOPSTALL <epoch s> wall_ms=<late> cpu_ms=<loop thread CPU meanwhile>``. A
#: late wake-up with little CPU is the process waiting for a core (a loaded machine), one with
#: as much CPU as wall time is the loop itself busy. A diagnostic only (the node's own code is
#: unchanged).
GC_LOGGER = """
import asyncio, gc, runpy, sys, time
_t = [0.0]
def _cb(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _t[0]) * 1000
    if ms >= 5:
        sys.stderr.write(f"GCPAUSE {time.time():.3f} gen={info['generation']} ms={ms:.1f}\\n")
gc.callbacks.append(_cb)
async def _watch_loop():
    while True:
        w0, c0 = time.perf_counter(), time.thread_time()
        await asyncio.sleep(0.005)
        late = (time.perf_counter() - w0) * 1000 - 5
        if late >= 20:
            cpu = (time.thread_time() - c0) * 1000
            sys.stderr.write(f"LOOPSTALL {time.time():.3f} wall_ms={late:.1f} cpu_ms={cpu:.1f}\\n")
import uvloop
_run = uvloop.run
def _run_watched(main, **kwargs):
    async def watched():
        watcher = asyncio.get_running_loop().create_task(_watch_loop())
        try:
            return await main
        finally:
            watcher.cancel()
    return _run(watched(), **kwargs)
uvloop.run = _run_watched
sys.argv[0] = "shoal"
runpy.run_module("shoal", run_name="__main__", alter_sys=True)
"""

GC_PAUSE_RE = re.compile(r"^GCPAUSE (\S+) gen=(\d) ms=(\S+)$", re.MULTILINE)
LOOP_STALL_RE = re.compile(r"^LOOPSTALL (\S+) wall_ms=(\S+) cpu_ms=(\S+)$", re.MULTILINE)


def gc_pauses(server: ServerProcess, since: float = 0.0) -> list[tuple[float, int, float]]:
    """(epoch s, generation, ms) of the collections a GC-logging server reported."""
    return [(float(t), int(g), float(ms)) for t, g, ms in GC_PAUSE_RE.findall(server.log()) if float(t) >= since]


def loop_stalls(server: ServerProcess, since: float = 0.0) -> list[tuple[float, float, float]]:
    """(epoch s, wall ms late, loop-thread CPU ms meanwhile) of a GC-logging server's late loop wake-ups."""
    return [(float(t), float(w), float(c)) for t, w, c in LOOP_STALL_RE.findall(server.log()) if float(t) >= since]


def launched(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped so it dies with this process (cmd[0] must be an absolute executable path)."""
    return dying_with_parent(cmd)


def server_options(gc_log: bool = False) -> dict[str, Any]:
    """Options for :class:`shoal.testing.ServerProcess` / ``ServerSet.start``: the server dies
    with the benchmark, and with ``gc_log`` its collections of 5 ms or more are logged."""
    return {"die_with_parent": True, "entry": ["-c", GC_LOGGER] if gc_log else ["-m", "shoal"]}


# --- command line, work directory, helper processes ---------------------------------------------
def add_output_args(parser: argparse.ArgumentParser, name: str | None = None) -> None:
    """``--keep-logs`` and, for a bench that saves its report as ``name``, ``--out``."""
    if name:
        parser.add_argument("--out", help=f"write the JSON here (default bench/results/{name}-<time>.json)")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep the servers' data dirs and logs here")


def parse_transports(text: str) -> list[str]:
    """The ``--transports`` comma list, each one of :data:`TRANSPORTS` (else a usage error)."""
    transports = [t for t in text.split(",") if t]
    if not transports or any(t not in TRANSPORTS for t in transports):
        raise SystemExit(f"--transports takes a comma list of {', '.join(TRANSPORTS)}")
    return transports


def settings(args: Any) -> dict[str, Any]:
    """The run's options for the report, without where its files go."""
    return {k: v for k, v in vars(args).items() if k not in ("keep_logs", "out")}


def work_root(stack: contextlib.ExitStack, keep_logs: str | None) -> Path:
    """``--keep-logs`` if given, else a temporary directory removed when ``stack`` closes."""
    return Path(keep_logs) if keep_logs else Path(stack.enter_context(tempfile.TemporaryDirectory()))


def stop_processes(procs: Sequence[BaseProcess], timeout_s: float = 5.0) -> None:
    """Join each helper process, killing one that has not ended within ``timeout_s``."""
    for proc in procs:
        proc.join(timeout=timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()


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


def median(values: Sequence[Any]) -> float | None:
    """The median of the values that are not None, to 2 places (None if there are none)."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, to 2 places."""
    return [round(x, 2) for x in os.getloadavg()]


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


def save_report(report: dict[str, Any], out: str | None, name: str) -> None:
    """Write the report to ``out`` (default ``bench/results/<name>-<time>.json``), then print it."""
    path = Path(out) if out else RESULTS_DIR / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    log(f"saved {path}")
    emit(report)


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
