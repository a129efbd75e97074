"""Multi-process gRPC load generator for a Shoal (Nacos 2.x) naming node.

Run ``python bench/load/run.py --help`` for the phases, the flags and the JSON it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import native_gen  # siblings: run.py is run as a script, so its folder is on the path
import worker as load_worker

from shoal.testing import OPEN, free_port_block

HERE = Path(__file__).resolve().parent

CLK_TCK = os.sysconf("SC_CLK_TCK")
PHASES = ("register", "query", "deregister", "push", "idle")
TARGETS = {  # the native transport's targets: measured on the 2-core box
    "register_ops_per_server_cpu_s": 12_000.0,
    "query_ops_per_server_cpu_s": 15_000.0,
    "push_latency_p99_ms": 10.0,  # on a quiet box
    "idle_connections": 10_000,
    "idle_rss_bytes_per_connection": 20 * 1024,
}
#: --compare-transports: what is measured side by side, in this order within every round.
TRANSPORT_TARGETS = ("native", "grpcio", "floor-native", "floor-grpcio")
#: --compare-transports target: Shoal on the native transport from --baseline-src (before/after A/B)
BASELINE = "baseline"

DESCRIPTION = """\
Load generator for a Shoal node over the Nacos 2.x gRPC SDK protocol (grpc.aio, real Nacos
payloads, one HTTP/2 transport per Nacos connection, many connections per worker process).

It starts `shoal server` itself on free 127.0.0.1 ports (data dir in a temp directory, log
level --server-log-level, extra settings with --server-arg) unless --addr names a running
node; then it runs the phases given by --phases, prints ONE JSON document on stdout (and
writes it to --out), and always stops the server it started (SIGTERM, then SIGKILL after
10 s), also on errors and Ctrl-C. All traffic goes to 127.0.0.1 (or --addr).

phases
  register    W worker processes (--workers) x C connections each (--connections) register
              --ops instances in total: connection g registers one instance (ip derived from
              g, port 8080, 4 metadata keys) into --ops/(W*C) of the --services services
              (InstanceRequest registerInstance, the Java 2.5.1 body), --window requests in
              flight per connection.
  query       --query-ops ServiceQueryRequest on random registered services, same connections.
  deregister  every registered instance is deregistered (InstanceRequest deregisterInstance).
              Before query and after deregister one extra process queries every service once
              and checks the host totals (the "verify" entries).
  push        --push-subscribers new connections (spread over the workers) each subscribe
              to one of --push-services services; one more process with --push-publishers
              connections registers/deregisters instances at --push-rate per second,
              --push-changes in all, every register with a fresh port. A subscriber's latency
              sample is (time the push carrying the change was received) - (time the request
              was sent), both from time.time() on this host; a change is matched by the
              instance appearing in (register) or leaving (deregister) the pushed
              serviceInfo, so coalesced pushes are counted correctly. Reports p50/p99/max,
              samples, missed samples and pushes received.
  idle        on a fresh server (when this tool manages it) open --idle-connections
              connections spread over the workers, read the server's VmRSS before and after
              (bytes per connection), how long opening took, then hold them --idle-hold
              seconds (default: keep-alive-ms + 15 s, so at least one keep-alive scan probes
              all of them with ClientDetectionRequest, which the clients answer) while one
              more connection queries every --ping-interval s; then report how many streams
              are still open and answer a HealthCheckRequest (i.e. survived), how many probes
              were answered, and the ping latencies.

measurements
  ops/s         ops completed / (last worker end - first worker start).
  server CPU    utime+stime of the server process and its live descendants (all threads)
                from /proc/<pid>/stat, divided by SC_CLK_TCK, taken just before and after
                the phase: server_cpu_s_per_1000_ops and ops_per_server_cpu_s.
  latency       client-observed request latency p50/p99/max in ms.
  client CPU    CPU seconds the generator processes used (they share the cores with the
                server: on a 2-core box prefer few workers, or --generator native);
                client_over_server_cpu is that over the server's CPU in the phase.

--compare-pure runs register (+ query and deregister) twice, once against a server started
normally and once with SHOAL_NO_EXTENSIONS=1 (pure-Python kernels), and reports both
CPU-per-1000-ops figures and their ratio. Whether the compiled kernels were loaded is read
from /proc/<pid>/maps.
"""

EPILOG = """\
examples
  python bench/load/run.py --phases register,query,deregister --ops 5000 --query-ops 10000
  python bench/load/run.py --out /tmp/load.json                       # every phase, default sizes
  python bench/load/run.py --phases idle --idle-connections 10000 --server-arg \\
      nacos.remote.server.connection.detection-timeout-ms=5000
  python bench/load/run.py --compare-pure --phases register,query,deregister
  python bench/load/run.py --addr 127.0.0.1:9848 --server-pid 1234 --phases register,query
"""


# --- the server process ------------------------------------------------------------------------
def _server_preexec() -> None:  # runs in the child between fork and exec
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with contextlib.suppress(Exception):  # die with the generator even if it is SIGKILLed
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """A `shoal server` this tool started, or an existing one (then stats need its pid)."""

    def __init__(
        self,
        target: str,
        pid: int | None,
        proc: subprocess.Popen[bytes] | None = None,
        tmpdir: str | None = None,
        log_path: str | None = None,
        argv: list[str] | None = None,
        http_port: int | None = None,
        env_note: str = "",
    ) -> None:
        self.target = target
        self.pid = pid
        self.proc = proc
        self.tmpdir = tmpdir
        self.log_path = log_path
        self.argv = argv or []
        self.http_port = http_port
        self.env_note = env_note

    @classmethod
    def start(
        cls, server_args: Sequence[str], log_level: str, pure: bool = False, ready_timeout_s: float = 30.0,
        src: str | None = None, node_argv: Sequence[str] = (),
    ) -> Server:
        """``node_argv``: more `shoal server` arguments (e.g. ``--workers 2``)."""
        port = free_port_block((0, 1000))
        tmpdir = tempfile.mkdtemp(prefix="shoal-load-")
        argv = [
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            os.path.join(tmpdir, "data"),
            "--log-level",
            log_level,
            *OPEN.value,  # the load runs against an open node (no login)
            *node_argv,
        ]
        for item in server_args:
            argv += ["-D", item]
        env = dict(os.environ)
        env.pop("SHOAL_NO_EXTENSIONS", None)
        if pure:
            env["SHOAL_NO_EXTENSIONS"] = "1"
        if src:  # another tree's code (and built kernels): the baseline of a before/after comparison
            env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        log_path = os.path.join(tmpdir, "server.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "shoal", *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # preexec_fn is only safe while this process has no other threads (it has none:
                # the workers are separate processes); otherwise skip it and lose the extras.
                preexec_fn=_server_preexec if threading.active_count() == 1 else None,
                start_new_session=True,
            )
        server = cls(
            f"127.0.0.1:{port + 1000}",
            proc.pid,
            proc,
            tmpdir,
            log_path,
            [a if a != os.path.join(tmpdir, "data") else "<tmp>/data" for a in argv],
            port,
            "SHOAL_NO_EXTENSIONS=1" if pure else f"baseline src {src}" if src else "",
        )
        try:
            server._wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    @classmethod
    def start_floor(cls, transport: str, hosts: int, ready_timeout_s: float = 30.0) -> Server:
        """``floor_server.py`` on a free port: the transport's own cost, answers of ``hosts`` hosts."""
        port = free_port_block((0,))
        tmpdir = tempfile.mkdtemp(prefix="shoal-floor-")
        log_path = os.path.join(tmpdir, "floor.log")
        argv = [str(HERE / "floor_server.py"), "--transport", transport, "--port", str(port), "--hosts", str(hosts)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent.parent / "src"), env.get("PYTHONPATH")) if p)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=_server_preexec if threading.active_count() == 1 else None, start_new_session=True,
            )
        server = cls(f"127.0.0.1:{port}", proc.pid, proc, tmpdir, log_path, argv[1:], None, f"floor {transport}")
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                server.check_alive()
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"floor server not listening after {ready_timeout_s} s:\n{server.log_tail()}")
                time.sleep(0.1)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, timeout_s: float) -> None:
        url = f"http://127.0.0.1:{self.http_port}/nacos/v1/console/health/readiness"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout_s} s:\n{self.log_tail()}")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode(errors="replace")

    def stop(self) -> int | None:
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            code = self.proc.returncode
            self.proc = None
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        return code

    # --- /proc --------------------------------------------------------------------------------
    def cpu_s(self) -> float | None:
        """utime + stime of the node: its process and every live descendant (all threads)."""
        if self.pid is None:
            return None
        return sum(_proc_cpu_s(pid) for pid in _proc_tree(self.pid))

    def status(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.pid is None:
            return out
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
                elif key == "Threads":
                    out[key] = int(value)
        with contextlib.suppress(OSError):
            out["fds"] = len(os.listdir(f"/proc/{self.pid}/fd"))
        return out

    def rss(self) -> int | None:
        return self.status().get("VmRSS")

    def processes(self) -> list[dict[str, Any]]:
        """Every process of the node (its pid first, then its live descendants: a multi-worker
        node's workers): pid, parent, VmRSS and CPU seconds so far."""
        return [] if self.pid is None else [_proc_info(p) for p in _proc_tree(self.pid)]

    def extensions_loaded(self) -> bool | None:
        if self.pid is None:
            return None
        with open(f"/proc/{self.pid}/maps") as f:
            return any("shoal/_ext/" in line for line in f)


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # gone since it was listed
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def _proc_info(pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": pid, "ppid": None, "rss_bytes": None, "cpu_s": round(_proc_cpu_s(pid), 2)}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "PPid":
                out["ppid"] = int(value)
            elif key == "VmRSS":
                out["rss_bytes"] = int(value.split()[0]) * 1024
    return out


def _proc_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from /proc/<pid>/task/<tid>/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return out


# --- the worker processes ------------------------------------------------------------------------
class Pool:
    """Worker processes (spawned, not forked: grpc is not fork-safe), one pipe each."""

    def __init__(self, count: int, target: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        for i in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=load_worker.worker_main, args=(i, target, child), daemon=True, name=f"shoal-load-{i}"
            )
            proc.start()
            child.close()
            self.procs.append(proc)
            self.pipes.append(parent)

    def send(self, indexes: Iterable[int], command: str, params: dict[str, Any] | list[dict[str, Any]]) -> list[int]:
        idx = list(indexes)
        for n, i in enumerate(idx):
            self.pipes[i].send((command, params[n] if isinstance(params, list) else params))
        return idx

    def recv(self, indexes: Iterable[int], timeout_s: float, server: Server | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        for i in indexes:
            while not self.pipes[i].poll(0.2):
                if server is not None:
                    server.check_alive()
                if not self.procs[i].is_alive():
                    raise RuntimeError(f"worker {i} died (exit code {self.procs[i].exitcode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {i} did not answer within {timeout_s:.0f} s")
            status, result = self.pipes[i].recv()
            if status != "ok":
                raise RuntimeError(result)
            out.append(result)
        return out

    def call(
        self,
        indexes: Iterable[int],
        command: str,
        params: dict[str, Any] | list[dict[str, Any]],
        timeout_s: float,
        server: Server | None = None,
    ) -> list[dict[str, Any]]:
        return self.recv(self.send(indexes, command, params), timeout_s, server)

    def close(self, grace_s: float = 15.0) -> None:
        """Ask every worker to close its connections and exit; terminate those still busy."""
        for i, pipe in enumerate(self.pipes):
            if self.procs[i].is_alive():
                with contextlib.suppress(Exception):
                    pipe.send(("exit", {}))
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


# --- statistics ------------------------------------------------------------------------------------
def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def latency_ms(values: Iterable[float]) -> dict[str, float | int | None]:
    data = sorted(v * 1000 for v in values)

    def r3(x):
        return None if x is None else round(x, 3)

    return {
        "samples": len(data),
        "p50": r3(percentile(data, 50)),
        "p90": r3(percentile(data, 90)),
        "p99": r3(percentile(data, 99)),
        "max": r3(data[-1] if data else None),
    }


def merge_errors(results: Iterable[dict[str, Any]], key: str = "errors") -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        for k, v in r.get(key, {}).items():
            out[k] = out.get(k, 0) + v
    return out


def rate_phase(
    name: str,
    results: list[dict[str, Any]],
    cpu0: float | None,
    cpu1: float | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ops = sum(r["ops"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    lat = array("d")
    for r in results:
        lat.extend(r["latency_s"])
    out: dict[str, Any] = {
        "ops": ops,
        "errors": merge_errors(results),
        "truncated": any(r["truncated"] for r in results),
        "wall_s": round(wall, 3),
        "ops_per_s": round(ops / wall, 1) if wall > 0 else None,
        "latency_ms": latency_ms(lat),
        "client_cpu_s": round(sum(r["client_cpu_s"] for r in results), 3),
    }
    if cpu0 is not None and cpu1 is not None:
        cpu = cpu1 - cpu0
        out.update(
            {
                "server_cpu_s": round(cpu, 3),
                "server_cpu_utilisation": round(cpu / wall, 3) if wall > 0 else None,
                "server_cpu_s_per_1000_ops": round(cpu / ops * 1000, 4) if ops else None,
                "ops_per_server_cpu_s": round(ops / cpu, 1) if cpu > 0 else None,
                # the generator's CPU per op as a share of the node's (<= 1/8 for writes)
                "client_over_server_cpu": round(out["client_cpu_s"] / cpu, 4) if cpu > 0 else None,
            }
        )
    if extra:
        out.update(extra)
    log(
        f"{name}: {ops} ops in {wall:.2f} s = {out['ops_per_s']}/s; server {out.get('server_cpu_s')} CPU-s "
        f"-> {out.get('ops_per_server_cpu_s')} ops/CPU-s; p50/p99 {out['latency_ms']['p50']}/"
        f"{out['latency_ms']['p99']} ms; errors {out['errors']}"
    )
    return out


def summarise_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One run: itself. Several: the run with the median ops_per_server_cpu_s, plus every
    run's headline figures and the medians (the box is shared, single runs are noisy)."""
    if len(runs) == 1:
        return runs[0]
    key = "ops_per_server_cpu_s" if runs[0].get("ops_per_server_cpu_s") is not None else "ops_per_s"
    ordered = sorted(runs, key=lambda r: r.get(key) or 0)
    out = dict(ordered[(len(ordered) - 1) // 2])
    heads = ("ops", "ops_per_s", "ops_per_server_cpu_s", "server_cpu_s_per_1000_ops", "server_cpu_utilisation",
             "client_cpu_s", "client_over_server_cpu")
    out["runs"] = [{k: r.get(k) for k in heads} | {"latency_p99_ms": r["latency_ms"]["p99"]} for r in runs]
    for k in ("ops_per_s", "ops_per_server_cpu_s", "server_cpu_s_per_1000_ops", "client_over_server_cpu"):
        values = sorted(r[k] for r in runs if r.get(k) is not None)
        if values:
            mid = len(values) // 2
            out[f"median_{k}"] = values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 4)
    return out


def log(message: str) -> None:
    print(f"[load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- phases ----------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server: Server | None = None
        self.pool: Pool | native_gen.NativePool | None = None
        self.servers_started: list[dict[str, Any]] = []

    # servers and pools
    def open_server(self, pure: bool = False, transport: str = "", node_argv: Sequence[str] = ()) -> Server:
        """The node under test; ``transport`` (--compare-transports) is native, grpcio or floor-*;
        ``node_argv``: more `shoal server` arguments (``--workers N``)."""
        a = self.args
        if a.addr:
            self.server = Server(a.addr, a.server_pid)
        elif transport.startswith("floor-"):
            hosts = round(a.ops / a.services)
            log(f"starting the {transport} server ({hosts} hosts per query answer)")
            self.server = Server.start_floor(transport.removeprefix("floor-"), hosts)
            log(f"floor pid {self.server.pid} on {self.server.target}")
        else:
            src = a.baseline_src if transport == BASELINE else None
            transport = "native" if transport == BASELINE else transport
            extra = [f"shoal.remote.transport={transport}"] if transport else []
            log(f"starting shoal server{' (SHOAL_NO_EXTENSIONS=1)' if pure else ''}"
                f"{f' on the {transport} transport' if transport else ''}{f' from {src}' if src else ''}")
            self.server = Server.start([*a.server_arg, *extra], a.server_log_level, pure=pure, src=src,
                                       node_argv=node_argv)
            log(f"server pid {self.server.pid} on {self.server.target}")
        info = {
            "target": self.server.target,
            "pid": self.server.pid,
            "managed": self.server.proc is not None,
            "argv": self.server.argv,
            "env": self.server.env_note,
            "extensions_loaded": self.server.extensions_loaded(),
            "status_at_start": self.server.status(),
        }
        self.servers_started.append(info)
        return self.server

    def close_server(self) -> None:
        if self.server is not None and self.server.proc is not None:
            code = self.server.stop()
            self.servers_started[-1]["exit_code"] = code
            log(f"server stopped (exit {code})")
        self.server = None

    def open_pool(self, generator: str | None = None) -> Pool | native_gen.NativePool:
        assert self.server is not None
        if (generator or self.args.generator) == "native":
            # loaders in C; the verifier (index --workers) stays a Python worker
            self.pool = native_gen.NativePool(self.args.workers, self.server.target, Pool(1, self.server.target))
        else:
            self.pool = Pool(self.args.workers + 1, self.server.target)  # +1: publisher / verifier / pinger
        return self.pool

    def close_pool(self, grace_s: float = 15.0) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close(grace_s)

    @property
    def aux(self) -> int:
        return self.args.workers

    def loaders(self) -> range:
        return range(self.args.workers)

    def cpu(self) -> float | None:
        assert self.server is not None
        return self.server.cpu_s()

    # the rate phases
    def rate_phases(self, phases: Sequence[str], on_phase: Any = None) -> dict[str, Any]:
        """``on_phase(name, result)``, if given, runs after each phase's measurement, before the next
        phase (and before the connections close: their instances are still registered)."""
        a, pool, server = self.args, self.pool, self.server
        assert pool is not None and server is not None
        out: dict[str, Any] = {}
        n_conns = a.workers * a.connections
        per_conn = max(1, math.ceil(a.ops / n_conns))
        common = {
            "prefix": "load-svc",
            "services": a.services,
            "per_conn": per_conn,
            "window": a.window,
            "batch": a.native_batch,
            "coalesce_us": a.native_coalesce_us,
            "duration": a.duration,
            "seed": a.seed,
        }
        log(f"opening {n_conns} connections in {a.workers} workers")
        opened = pool.call(
            self.loaders(),
            "connect",
            [
                {"count": a.connections, "concurrency": a.connect_concurrency, "first_global": i * a.connections}
                for i in self.loaders()
            ],
            a.duration + 60,
            server,
        )
        connect_lat = array("d")
        for r in opened:
            connect_lat.extend(r["connect_s"])
        out["connections"] = {
            "opened": sum(r["opened"] for r in opened),
            "failed": sum(r["failed"] for r in opened),
            "errors": merge_errors(opened),
            "handshake_ms": latency_ms(connect_lat),
        }
        out["workload"] = {
            "connections": n_conns,
            "services": a.services,
            "registrations_per_connection": per_conn,
            "instances_per_service": n_conns * per_conn / a.services,
            "window_per_connection": a.window,
            "native_refill_batch": a.native_batch if isinstance(pool, native_gen.NativePool) else None,
            "native_coalesce_us": a.native_coalesce_us if isinstance(pool, native_gen.NativePool) else None,
            "in_flight_max": n_conns * a.window,
            "instance_metadata_keys": len(load_worker.INSTANCE_METADATA),
        }
        pool.call([self.aux], "connect", {"count": 1, "concurrency": 1, "first_global": 10_000_000}, 60, server)
        runs: dict[str, list[dict[str, Any]]] = {phase: [] for phase in phases}
        for rep in range(a.repeat):
            if a.repeat > 1:
                log(f"round {rep + 1} of {a.repeat}")
            for phase in phases:
                if phase == "query" and rep == 0:
                    out["verify_before_query"] = pool.call([self.aux], "verify", common, 300, server)[0]
                params = dict(common)
                if phase == "query":
                    params["ops"] = max(1, a.query_ops // a.workers)
                    params["seed"] = a.seed + rep
                if isinstance(pool, native_gen.NativePool):
                    pool.prepare(self.loaders(), phase, params)  # the plan is built outside the measurement
                cpu0 = self.cpu()
                results = pool.call(self.loaders(), phase, params, a.duration + 120, server)
                cpu1 = self.cpu()
                result = rate_phase(phase, results, cpu0, cpu1)
                result["server_rss_bytes_after"] = server.rss()
                result["server_processes_after"] = server.processes()  # a multi-worker node: each process
                if on_phase is not None:
                    on_phase(phase, result)
                runs[phase].append(result)
                if phase == "deregister" and rep == a.repeat - 1:
                    out["verify_after_deregister"] = pool.call([self.aux], "verify", common, 300, server)[0]
        for phase, results in runs.items():
            out[phase] = summarise_runs(results)
        pool.call([*list(self.loaders()), self.aux], "close_all", {}, 120, server)
        return out

    # push latency
    def push_phase(self) -> dict[str, Any]:
        a, pool, server = self.args, self.pool, self.server
        assert pool is not None and server is not None
        prefix = "push-svc"
        per = [
            a.push_subscribers // a.workers + (1 if i < a.push_subscribers % a.workers else 0) for i in self.loaders()
        ]
        first = [sum(per[:i]) for i in self.loaders()]
        log(
            f"push: {a.push_subscribers} subscribers on {a.push_services} services, {a.push_publishers} publishers, "
            f"{a.push_changes} changes at {a.push_rate}/s"
        )
        subs = pool.call(
            self.loaders(),
            "push_subscribe",
            [
                {
                    "count": per[i],
                    "concurrency": a.connect_concurrency,
                    "first_sub": first[i],
                    "prefix": prefix,
                    "services": a.push_services,
                }
                for i in self.loaders()
            ],
            300,
            server,
        )
        subscribers: dict[str, list[int]] = {}
        for r in subs:
            for svc, ids in r["subscribers"].items():
                subscribers.setdefault(svc, []).extend(ids)
        pool.call(
            [self.aux], "connect", {"count": a.push_publishers, "concurrency": 50, "first_global": 0}, 120, server
        )
        time.sleep(1.0)  # let the first-subscription pushes land, then forget them
        pool.call(self.loaders(), "push_collect", {}, 60, server)
        cpu0 = self.cpu()
        pub = pool.call(
            [self.aux],
            "publish",
            {
                "prefix": prefix,
                "services": a.push_services,
                "rate": a.push_rate,
                "changes": a.push_changes,
                "duration": a.duration,
            },
            a.duration + 120,
            server,
        )[0]
        # wait for the last pushes: until every expected sample arrived or --push-settle s passed
        expected = sum(len(subscribers.get(svc, [])) for _, svc, _, _, _ in pub["ops"])
        events: list[tuple[int, str, str, int, str, float]] = []
        pushes = unchanged = 0
        deadline = time.monotonic() + a.push_settle
        while True:
            got = pool.call(self.loaders(), "push_collect", {}, 60, server)
            for r in got:
                events.extend(r["events"])
                pushes += r["pushes"]
                unchanged += r["unchanged"]
            if len(events) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        cpu1 = self.cpu()
        first_seen: dict[tuple[int, str, int, str], float] = {}
        for sub, _svc, ip, port, kind, received in events:
            key = (sub, ip, port, kind)
            if key not in first_seen or received < first_seen[key]:
                first_seen[key] = received
        samples: dict[str, array[float]] = {"registerInstance": array("d"), "deregisterInstance": array("d")}
        missed = 0
        for kind, svc, port, ip, sent in pub["ops"]:
            want = "up" if kind == "registerInstance" else "down"
            for sub in subscribers.get(svc, []):
                received = first_seen.get((sub, ip, port, want))
                if received is None:
                    missed += 1
                else:
                    samples[kind].append(received - sent)
        both = array("d", list(samples["registerInstance"]) + list(samples["deregisterInstance"]))
        wall = pub["end"] - pub["start"]
        result: dict[str, Any] = {
            "subscribers": sum(r["opened"] for r in subs),
            "subscriber_connect_failures": sum(r["failed"] for r in subs),
            "services": a.push_services,
            "publishers": a.push_publishers,
            "changes_sent": len(pub["ops"]),
            "change_rate_target_per_s": a.push_rate,
            "change_rate_per_s": round(len(pub["ops"]) / wall, 1) if wall else None,
            "publish_errors": pub["errors"],
            "publish_request_latency_ms": latency_ms(pub["request_latency_s"]),
            "expected_samples": expected,
            "missed_samples": missed,
            "pushes_received": pushes,
            "pushes_per_s": round(pushes / wall, 1) if wall else None,
            "pushes_with_unchanged_hosts": unchanged,
            "push_latency_ms": latency_ms(both),
            "push_latency_ms_register": latency_ms(samples["registerInstance"]),
            "push_latency_ms_deregister": latency_ms(samples["deregisterInstance"]),
        }
        if cpu0 is not None and cpu1 is not None:
            result["server_cpu_s"] = round(cpu1 - cpu0, 3)
            result["server_cpu_s_per_1000_pushes"] = round((cpu1 - cpu0) / pushes * 1000, 4) if pushes else None
        pl = result["push_latency_ms"]
        log(
            f"push: {pl['samples']} samples, p50 {pl['p50']} ms, p99 {pl['p99']} ms, max {pl['max']} ms, "
            f"missed {missed}, {pushes} pushes"
        )
        pool.call([*list(self.loaders()), self.aux], "close_all", {}, 120, server)
        return result

    # idle connections
    def idle_phase(self) -> dict[str, Any]:
        a, pool, server = self.args, self.pool, self.server
        assert pool is not None and server is not None
        n = a.idle_connections
        per = [n // a.workers + (1 if i < n % a.workers else 0) for i in self.loaders()]
        first = [sum(per[:i]) for i in self.loaders()]
        warm = pool.call([self.aux], "one_query", {"service": "idle-probe-svc"}, 60, server)[0]
        time.sleep(1.0)
        before = server.status()
        log(f"idle: opening {n} connections over {a.workers} workers (server RSS {before.get('VmRSS')})")
        cpu0 = self.cpu()
        opened = pool.call(
            self.loaders(),
            "idle_open",
            [
                {"count": per[i], "concurrency": a.connect_concurrency, "first_global": first[i], "timeout": 60.0}
                for i in self.loaders()
            ],
            1800,
            server,
        )
        cpu1 = self.cpu()
        open_wall = max(r["end"] for r in opened) - min(r["start"] for r in opened)
        n_open = sum(r["opened"] for r in opened)
        time.sleep(2.0)
        after = server.status()
        log(f"idle: {n_open} open in {open_wall:.1f} s; server RSS {after.get('VmRSS')}")
        during = pool.call([self.aux], "one_query", {"service": "idle-probe-svc"}, 60, server)[0]
        pool.call(
            [self.aux],
            "ping_start",
            {"service": "idle-probe-svc", "interval": a.ping_interval, "max_s": a.idle_hold + 120},
            60,
            server,
        )
        hold = a.idle_hold if a.idle_hold is not None else 35.0
        peak_rss = after.get("VmRSS") or 0
        hold_cpu0 = self.cpu()
        end = time.monotonic() + hold
        while time.monotonic() < end:
            server.check_alive()
            peak_rss = max(peak_rss, server.rss() or 0)
            time.sleep(1.0)
        hold_cpu1 = self.cpu()
        ping = pool.call([self.aux], "ping_stop", {}, 60, server)[0]
        after_hold = server.status()
        checks = pool.call(self.loaders(), "idle_check", {"concurrency": 200}, 600, server)
        survived = sum(min(r["stream_open"], r["health_ok"]) for r in checks)
        rss0, rss1 = before.get("VmRSS"), after.get("VmRSS")
        result: dict[str, Any] = {
            "requested": n,
            "opened": n_open,
            "open_failures": sum(r["failed"] for r in opened),
            "open_errors": merge_errors(opened),
            "open_wall_s": round(open_wall, 2),
            "opens_per_s": round(n_open / open_wall, 1) if open_wall > 0 else None,
            "handshake_ms": latency_ms(v for r in opened for v in r["connect_s"]),
            "server_cpu_s_to_open": round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None,
            "server_status_before": before,
            "server_status_after_open": after,
            "server_status_after_hold": after_hold,
            "server_rss_peak_during_hold": peak_rss,
            "rss_per_connection_bytes": round((rss1 - rss0) / n_open) if rss0 and rss1 and n_open else None,
            "query_before_open": warm,
            "query_while_holding": during,
            "hold_s": hold,
            "server_cpu_s_during_hold": round(hold_cpu1 - hold_cpu0, 3)
            if hold_cpu0 is not None and hold_cpu1 is not None
            else None,
            "ping_during_hold_ms": latency_ms(ping["latency_s"]),
            "ping_errors": ping["errors"],
            "stream_open_after_hold": sum(r["stream_open"] for r in checks),
            "health_ok_after_hold": sum(r["health_ok"] for r in checks),
            "health_errors_after_hold": merge_errors(checks, "health_errors"),
            "stream_errors": merge_errors(checks, "stream_errors"),
            "probes_answered": sum(r["detections_answered"] for r in checks),
            "connections_probed": sum(r["connections_probed"] for r in checks),
            "survived": survived,
            "all_survived": survived == n_open == n,
            "client_fd_limit": min(r["fd_limit"] for r in opened),
            "client_rss_bytes_per_worker": [r["client_rss_bytes"] for r in opened],
        }
        log(
            f"idle: {survived}/{n_open} survived {hold:.0f} s; probes answered {result['probes_answered']}; "
            f"{result['rss_per_connection_bytes']} B RSS per connection; ping p99 "
            f"{result['ping_during_hold_ms']['p99']} ms max {result['ping_during_hold_ms']['max']} ms"
        )
        pool.call([*list(self.loaders()), self.aux], "close_all", {}, 300, server)
        return result


def compare_transports(bench: Bench, rate_names: list[str]) -> dict[str, Any]:
    """Every target of TRANSPORT_TARGETS once per round, rounds interleaved (so load drift on a
    shared box hits them alike); each target's rounds and medians, and a side-by-side table."""
    a = bench.args
    repeat, a.repeat = a.repeat, 1
    chosen = [t.strip() for t in a.transports.split(",") if t.strip()]
    rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in chosen}
    try:
        for rep in range(repeat):
            log(f"transport round {rep + 1} of {repeat}")
            for target in chosen:
                bench.open_server(transport=target)
                try:
                    bench.open_pool()
                    rounds[target].append(bench.rate_phases(rate_names))
                finally:
                    bench.close_pool()
                    bench.close_server()
    finally:
        a.repeat = repeat
    out: dict[str, Any] = {}
    table: dict[str, dict[str, Any]] = {}
    for target, runs in rounds.items():
        merged = {name: summarise_runs([r[name] for r in runs if name in r]) for name in rate_names}
        out[target] = merged
        for name in rate_names:
            got = _median_or_single(merged[name], "ops_per_server_cpu_s")
            table.setdefault(name, {})[target] = got
    for row in table.values():
        native, grpcio = row.get("native"), row.get("grpcio")
        row["native_over_grpcio"] = round(native / grpcio, 2) if native and grpcio else None
        floor = row.get("floor-native")
        row["native_share_of_native_floor"] = round(native / floor, 3) if native and floor else None
        baseline = row.get(BASELINE)
        if baseline is not None:
            row["native_over_baseline"] = round(native / baseline, 3) if native and baseline else None
    out["ops_per_server_cpu_s"] = table
    out["note"] = "floor-* answer constants (no parsing, no registry) of the same size: the transport's own cost"
    return out


GENERATORS = ("native", "python")


def compare_generators(bench: Bench, rate_names: list[str]) -> dict[str, Any]:
    """--generator both: the rate phases with the native and the Python generator, each round on a
    fresh node per generator, rounds interleaved; each one's medians and a side-by-side table."""
    a = bench.args
    repeat, a.repeat = a.repeat, 1
    rounds: dict[str, list[dict[str, Any]]] = {g: [] for g in GENERATORS}
    try:
        for rep in range(repeat):
            for gen in GENERATORS:
                log(f"generator round {rep + 1} of {repeat}: {gen}")
                bench.open_server()
                try:
                    bench.open_pool(gen)
                    rounds[gen].append(bench.rate_phases(rate_names))
                finally:
                    bench.close_pool()
                    bench.close_server()
    finally:
        a.repeat = repeat
    out: dict[str, Any] = {}
    table: dict[str, dict[str, Any]] = {}
    for gen, runs in rounds.items():
        merged = {name: summarise_runs([r[name] for r in runs if name in r]) for name in rate_names}
        merged["connections"] = [r["connections"] for r in runs]
        out[gen] = merged
        for name in rate_names:
            row = table.setdefault(name, {})
            for key in ("ops_per_s", "ops_per_server_cpu_s", "client_over_server_cpu"):
                row[f"{gen}_{key}"] = _median_or_single(merged[name], key)
    out["table"] = table
    out["note"] = "client_over_server_cpu: the generator's CPU seconds over the node's in the same phase"
    return out


def targets(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    phases = report.get("phases", {})
    rates = (
        phases.get("rates", {})
        or phases.get("compare_transports", {}).get("native", {})
        or phases.get("compare_generators", {}).get("native", {})
    )
    for name in ("register", "query"):
        phase = rates.get(name, {})
        got = _median_or_single(phase, "ops_per_server_cpu_s")
        if got is not None:
            want = TARGETS[f"{name}_ops_per_server_cpu_s"]
            out[f"{name}_ops_per_server_cpu_s"] = {"target_min": want, "measured": got, "met": got >= want}
    push = phases.get("push", {}).get("push_latency_ms", {}).get("p99")
    if push is not None:
        out["push_latency_p99_ms"] = {
            "target_max": TARGETS["push_latency_p99_ms"],
            "measured": push,
            "met": push <= TARGETS["push_latency_p99_ms"],
        }
    idle = phases.get("idle")
    if idle:
        out["idle_connections"] = {
            "target_min": TARGETS["idle_connections"],
            "measured": idle["survived"],
            "met": idle["survived"] >= TARGETS["idle_connections"],
        }
        per_conn = idle.get("rss_per_connection_bytes")
        if per_conn is not None:
            out["idle_rss_bytes_per_connection"] = {
                "target_max": TARGETS["idle_rss_bytes_per_connection"],
                "measured": per_conn,
                "met": per_conn <= TARGETS["idle_rss_bytes_per_connection"],
            }
    return out


# --- CLI -------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/load/run.py",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("server")
    g.add_argument("--addr", help="host:port of a running node's gRPC SDK port instead of starting one")
    g.add_argument("--server-pid", type=int, help="pid of the --addr node, for CPU and RSS from /proc")
    g.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="PROPERTY=VALUE",
        help="setting passed to the started server as -D PROPERTY=VALUE (repeatable)",
    )
    g.add_argument(
        "--server-log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="log level of the started server (default warning: info logs every connection)",
    )
    g.add_argument(
        "--no-fresh-idle-server",
        action="store_true",
        help="run the idle phase on the same server as the other phases (default: a fresh one, "
        "so the RSS baseline is clean)",
    )
    g = p.add_argument_group("load shape")
    g.add_argument(
        "--phases",
        default=None,
        help=f"comma list of phases to run, in order (default {','.join(PHASES)}; register,query,deregister "
        "with --generator native/both)",
    )
    g.add_argument(
        "--workers", type=int, default=2, help="generator processes (default 2; they share the cores with the server)"
    )
    g.add_argument(
        "--connections",
        type=int,
        default=100,
        help="connections per worker for register/query/deregister (default 100)",
    )
    g.add_argument("--services", type=int, default=1000, help="services the instances are spread over (default 1000)")
    g.add_argument(
        "--ops", type=int, default=20_000, help="register ops in total; deregister does as many (default 20000)"
    )
    g.add_argument("--query-ops", type=int, default=40_000, help="ServiceQueryRequest ops in total (default 40000)")
    g.add_argument("--window", type=int, default=2, help="requests in flight per connection (default 2)")
    g.add_argument(
        "--native-batch",
        type=int,
        default=1,
        help="--generator native: a connection sends new calls only once this many of its --window slots are "
        "free, in one write (default 1: refill at every answer)",
    )
    g.add_argument(
        "--native-coalesce-us",
        type=int,
        default=0,
        help="--generator native: sleep this many microseconds after each round of events, so answers pile up "
        "and one wake-up serves several (default 0)",
    )
    g.add_argument(
        "--duration", type=float, default=120.0, help="cap in seconds on every phase's op loop (default 120)"
    )
    g.add_argument("--connect-concurrency", type=int, default=100, help="handshakes in flight per worker (default 100)")
    g.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run register/query/deregister this many rounds on the same connections and report each round "
        "and the medians (default 1; use 3+ on a shared box)",
    )
    g.add_argument("--seed", type=int, default=1, help="seed of the query service choice")
    g.add_argument(
        "--generator",
        choices=["python", "native", "both"],
        default="python",
        help="who drives register/query/deregister: python (grpc.aio worker processes), native (one "
        "C/libnghttp2 process per --workers, native/nacos_load.c, compiled on first use; the rate phases "
        "only), or both (each round on a fresh node per generator, side by side) (default python)",
    )
    g = p.add_argument_group("push latency")
    g.add_argument("--push-subscribers", type=int, default=100, help="subscriber connections (default 100)")
    g.add_argument(
        "--push-services", type=int, default=10, help="services; subscriber i watches service i %% N (default 10)"
    )
    g.add_argument("--push-publishers", type=int, default=10, help="publisher connections (default 10)")
    g.add_argument(
        "--push-rate", type=float, default=100.0, help="register+deregister changes per second (default 100)"
    )
    g.add_argument("--push-changes", type=int, default=2000, help="changes in all (default 2000)")
    g.add_argument("--push-settle", type=float, default=5.0, help="max seconds to wait for the last pushes (default 5)")
    g = p.add_argument_group("idle connections")
    g.add_argument("--idle-connections", type=int, default=10_000, help="idle connections to open (default 10000)")
    g.add_argument(
        "--idle-hold",
        type=float,
        default=None,
        help="seconds to hold them (default keep-alive-ms/1000 + 15, i.e. 35 s with server defaults)",
    )
    g.add_argument(
        "--ping-interval", type=float, default=0.25, help="seconds between queries while holding (default 0.25)"
    )
    g = p.add_argument_group("modes and output")
    g.add_argument(
        "--compare-pure",
        action="store_true",
        help="run the rate phases against a normal and a SHOAL_NO_EXTENSIONS=1 server and compare",
    )
    g.add_argument(
        "--compare-transports",
        action="store_true",
        help="run the rate phases, --repeat rounds interleaved, against Shoal on the native transport, Shoal "
        "on grpcio, and the do-nothing floor on each transport (floor_server.py, query answers of "
        "ops/services hosts); report each one's medians side by side",
    )
    g.add_argument(
        "--transports",
        default=",".join(TRANSPORT_TARGETS),
        help=f"with --compare-transports: which of {','.join(TRANSPORT_TARGETS)} to run (default all; "
        f"{BASELINE} with --baseline-src)",
    )
    g.add_argument(
        "--baseline-src",
        help=f"with --compare-transports: the src/ directory of another Shoal tree (its kernels built), run "
        f"on the native transport as the '{BASELINE}' target (added to --transports): this tree's native "
        f"against it, rounds interleaved, e.g. before/after a change",
    )
    g.add_argument("--out", help="also write the JSON report to this file")
    return p


def _keep_alive_s(server_args: Sequence[str]) -> float:
    for item in server_args:
        key, _, value = item.partition("=")
        if key.strip() in ("nacos.remote.server.connection.keep-alive-ms", "connection_keep_alive_ms"):
            return int(value) / 1000
    return 20.0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.phases is None:
        args.phases = ",".join(PHASES) if args.generator == "python" else "register,query,deregister"
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        build_parser().error(f"unknown phase(s) {unknown}; choose from {PHASES}")
    if args.workers < 1 or args.connections < 1:
        build_parser().error("--workers and --connections must be at least 1")
    if args.idle_hold is None:
        args.idle_hold = _keep_alive_s(args.server_arg) + 15.0
    if args.addr and (args.compare_pure or args.compare_transports):
        build_parser().error("--compare-pure and --compare-transports start their own servers; drop --addr")
    if args.generator != "python" and any(p in ("push", "idle") for p in phases):
        build_parser().error("--generator native/both drives register, query and deregister only")
    if args.generator == "both" and (args.compare_pure or args.compare_transports):
        build_parser().error("--generator both is its own comparison; use native or python with --compare-*")
    if args.compare_pure and args.compare_transports:
        build_parser().error("choose one of --compare-pure and --compare-transports")
    allowed = (*TRANSPORT_TARGETS, BASELINE) if args.baseline_src else TRANSPORT_TARGETS
    bad = [t for t in args.transports.split(",") if t.strip() and t.strip() not in allowed]
    if bad or not args.transports.strip():
        build_parser().error(f"--transports: choose from {','.join(allowed)}")
    if args.baseline_src:
        if not os.path.isdir(os.path.join(args.baseline_src, "shoal")):
            build_parser().error(f"--baseline-src: {args.baseline_src} holds no shoal package")
        if BASELINE not in [t.strip() for t in args.transports.split(",")]:
            args.transports = f"{BASELINE},{args.transports}"
    if math.ceil(args.ops / (args.workers * args.connections)) > args.services:
        build_parser().error(
            f"--ops {args.ops} over {args.workers * args.connections} connections needs more than --services "
            f"{args.services} services per connection (a connection holds one instance per service)"
        )

    stop_on_sigterm()
    report: dict[str, Any] = {
        "tool": "bench/load/run.py",
        "schema": 1,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "source": _source_revision(),
        "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "phases": {},
    }
    bench = Bench(args)
    status = 0
    try:
        rate_names = [p for p in phases if p in ("register", "query", "deregister")]
        if args.generator == "both":
            report["phases"]["compare_generators"] = compare_generators(bench, rate_names or ["register", "query"])
        elif args.compare_transports:
            report["phases"]["compare_transports"] = compare_transports(bench, rate_names or ["register", "query"])
        elif args.compare_pure:
            compare: dict[str, Any] = {}
            for mode in ("extensions", "pure"):
                bench.open_server(pure=mode == "pure")
                bench.open_pool()
                compare[mode] = bench.rate_phases(rate_names or ["register", "deregister"])
                compare[mode]["server"] = bench.servers_started[-1]
                bench.close_pool()
                bench.close_server()
            summary: dict[str, Any] = {}
            for name in rate_names or ["register", "deregister"]:
                e, py = (
                    _median_or_single(compare[mode].get(name, {}), "server_cpu_s_per_1000_ops")
                    for mode in ("extensions", "pure")
                )
                summary[name] = {
                    "server_cpu_s_per_1000_ops_extensions": e,
                    "server_cpu_s_per_1000_ops_pure": py,
                    "pure_over_extensions": round(py / e, 3) if e and py else None,
                }
            compare["summary"] = summary
            report["phases"]["compare_pure"] = compare
        else:
            bench.open_server()
            bench.open_pool()
            if rate_names:
                report["phases"]["rates"] = bench.rate_phases(rate_names)
            if "push" in phases:
                report["phases"]["push"] = bench.push_phase()
            if "idle" in phases:
                if (
                    bench.server is not None
                    and bench.server.proc is not None
                    and not args.no_fresh_idle_server
                    and (rate_names or "push" in phases)
                ):
                    bench.close_pool()
                    bench.close_server()
                    bench.open_server()
                    bench.open_pool()
                report["phases"]["idle"] = bench.idle_phase()
                if bench.server is not None:
                    report["phases"]["idle"]["server_extensions_loaded"] = bench.server.extensions_loaded()
    except KeyboardInterrupt as exc:
        report["error"] = f"interrupted ({exc})"
        status = 130
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        if bench.server is not None:
            report["server_log_tail"] = bench.server.log_tail()
        status = 1
    finally:
        with contextlib.suppress(BaseException):
            bench.close_pool(15.0 if status == 0 else 2.0)  # interrupted workers may be mid-phase
        with contextlib.suppress(BaseException):
            bench.close_server()
    report["servers"] = bench.servers_started
    report["targets"] = targets(report)
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["host"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2, default=_json_default)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return status


def stop_on_sigterm() -> None:
    """SIGTERM ends a bench as Ctrl-C does (KeyboardInterrupt), so its ``finally`` stops its nodes."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)


def report_header(tool: str, args: Any, loadavg: str) -> dict[str, Any]:
    """The fields every bench report of this folder starts with (``args`` less ``--out``)."""
    return {
        "tool": tool,
        "schema": 1,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"cpus": os.cpu_count(), "loadavg_at_start": loadavg},
        "source": _source_revision(),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
    }


def _source_revision() -> dict[str, Any]:
    """Which Shoal was measured: its version and, in a git checkout, HEAD and whether src/ is dirty."""
    out: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        import shoal

        out["shoal_version"] = shoal.__version__
    with contextlib.suppress(Exception):
        root = HERE.parent.parent
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        out.update(git_head=head, src_dirty=bool(dirty))
    return out


def _median_or_single(phase: dict[str, Any], key: str) -> Any:
    return phase.get(f"median_{key}", phase.get(key))


def _json_default(value: Any) -> Any:
    if isinstance(value, array):
        return list(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
