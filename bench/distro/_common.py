"""Shared pieces of the Distro benchmarks: `shoal server` processes on 127.0.0.1 that are always
cleaned up, /proc readings, Prometheus scraping, percentiles and JSON output.

Every server is started in its own session with PR_SET_PDEATHSIG, tracked by a
:class:`ServerSet` (a context manager that kills what it started on any exit), and SIGTERM /
SIGINT to the benchmark are turned into an exception so the ``finally`` blocks run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
HOST = "127.0.0.1"
READINESS = "/nacos/v1/console/health/readiness"
PROMETHEUS = "/nacos/actuator/prometheus"


def import_load_client() -> Any:
    """bench/load's Nacos gRPC client module (not a package: put its folder on the path)."""
    path = str(REPO / "bench" / "load")
    if path not in sys.path:
        sys.path.insert(0, path)
    import nacos_client

    return nacos_client


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


# --- ports --------------------------------------------------------------------------------------
def free_port_block(offsets: tuple[int, ...] = (0, 1000, 1001), avoid: Sequence[int] = ()) -> int:
    """A main port P with P+offset free on 127.0.0.1 for every offset (HTTP, SDK gRPC, cluster)."""
    taken = {p + o for p in avoid for o in offsets}
    for _ in range(200):
        with socket.socket() as s:
            s.bind((HOST, 0))
            base = int(s.getsockname()[1])
        if base + max(offsets) >= 65535 or any(base + o in taken for o in offsets):
            continue
        ok = True
        for off in offsets:
            with socket.socket() as probe:
                try:
                    probe.bind((HOST, base + off))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free block of loopback ports")


# --- HTTP ---------------------------------------------------------------------------------------
def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric_values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` in a Prometheus text page, with its labels."""
    out = []
    for match in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        out.append((labels, float(match.group(2))))
    return out


# --- the server process -------------------------------------------------------------------------
#: Runs first in the new process, then execs the real command in place (same pid): raise the fd
#: limit and ask for SIGKILL when the benchmark dies (PR_SET_PDEATHSIG survives exec). Doing this
#: here rather than in a preexec_fn keeps Python code out of the window between fork and exec,
#: which is unsafe once gRPC threads run in the benchmark (children died with SIGSEGV).
LAUNCHER = """
import ctypes, os, resource, signal, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY and soft < hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(70)
os.execv(sys.argv[2], sys.argv[2:])
"""


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


def gc_pauses(server: Server, since: float = 0.0) -> list[tuple[float, int, float]]:
    """(epoch s, generation, ms) of the collections a GC-logging server reported."""
    return [(float(t), int(g), float(ms)) for t, g, ms in GC_PAUSE_RE.findall(server.log()) if float(t) >= since]


def launched(cmd: list[str]) -> list[str]:
    """``cmd`` wrapped in :data:`LAUNCHER` (cmd[0] must be an absolute executable path)."""
    return [sys.executable, "-c", LAUNCHER, str(os.getpid()), *cmd]


class Server:
    """One `shoal server` process on 127.0.0.1 (HTTP port, SDK gRPC = +1000, cluster = +1001)."""

    def __init__(self, port: int, data_dir: Path, args: list[str], env: dict[str, str] | None = None,
                 gc_log: bool = False) -> None:
        self.port = port
        self.data_dir = data_dir
        self.log_path = data_dir / "server.log"
        entry = ["-c", GC_LOGGER] if gc_log else ["-m", "shoal"]
        self.cmd = [sys.executable, *entry, "server", "--host", HOST, "--port", str(port),
                    "--data-dir", str(data_dir), *args]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.time() just before the process was spawned

    @property
    def grpc_port(self) -> int:
        return self.port + 1000

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log_file:
            self.started_at = time.time()
            self.proc = subprocess.Popen(launched(self.cmd), stdout=log_file, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"server on {self.port} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def ready(self) -> bool:
        self.check_alive()
        try:
            return http_get(self.url(READINESS), 0.5)[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float, interval_s: float = 0.05) -> float:
        """Poll readiness; returns the time.time() it first answered 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready():
                return time.time()
            time.sleep(interval_s)
        raise TimeoutError(f"server on {self.port} not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def prometheus(self) -> str:
        status, text = http_get(self.url(PROMETHEUS), 5.0)
        if status != 200:
            raise RuntimeError(f"prometheus on {self.port} answered {status}")
        return text

    def gauge(self, name: str) -> float | None:
        values = metric_values(self.prometheus(), f"shoal_{name}")
        return values[0][1] if values else None

    def try_gauge(self, name: str) -> float | None:
        """The gauge, or None when the node does not answer in time (a stalled event loop)."""
        try:
            return self.gauge(name)
        except (OSError, RuntimeError):
            return None

    def members(self) -> list[dict[str, Any]]:
        status, text = http_get(self.url("/nacos/v1/core/cluster/nodes"), 2.0)
        if status != 200:
            return []
        body = json.loads(text)
        data = body.get("data", body) if isinstance(body, dict) else body
        return list(data) if isinstance(data, list) else []

    def proc_status(self) -> dict[str, int]:
        """VmRSS / VmHWM in bytes from /proc/<pid>/status (empty once the process is gone)."""
        out: dict[str, int] = {}
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return out
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def cpu_s(self) -> float | None:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def extensions_loaded(self) -> bool | None:
        try:
            maps = Path(f"/proc/{self.pid}/maps").read_text()
        except OSError:
            return None
        return "shoal/_ext/" in maps

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL; always reaps the process."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        return proc.returncode


class ServerSet:
    """Starts servers and stops every one of them when the ``with`` block ends, however it ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.servers: list[Server] = []

    def start(self, port: int, args: list[str], env: dict[str, str] | None = None, gc_log: bool = False) -> Server:
        server = Server(port, self.root / f"node-{port}", args, env, gc_log)
        self.servers.append(server)
        server.start()
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        for server in self.servers:  # anything still there is killed outright
            if server.proc is not None and server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()

    def __enter__(self) -> ServerSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.1, what: str = "condition") -> Any:
    """The integration tests' poll-with-deadline helper (one implementation for both)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.integration.procs import wait_until as poll

    return poll(predicate, timeout_s, interval_s, what)


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
