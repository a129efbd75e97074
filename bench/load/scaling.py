"""Multi-worker scaling: the same load on a fresh node per worker count, side by side (issue 21).

For each count in ``--workers`` (default ``1,2``), in turn, a fresh ``shoal server`` (``--workers N``
passed only when N != 1) on free 127.0.0.1 ports, and on it run.py's rate phases with the native
generator: register (``--services`` x ``--instances`` instances over ``--connections``
connections, ``--window`` calls in flight each), query (``--query-ops`` ServiceQueryRequests)
and deregister, ``--repeat`` rounds. With ``--memory``, one more fresh node per count is loaded
with ``--memory-services`` x ``--memory-instances`` instances (100,000 by default) and the RSS
of each of its processes is read, idle and loaded.

A node's processes are its pid and every live descendant (``/proc/<pid>/task/*/children``, so a
supervisor's workers); CPU (utime + stime) and RSS are summed over them, and listed per process.
Before the load starts the tool waits until N sockets listen on the node's SDK port, so the
kernel spreads the connections over every worker (SO_REUSEPORT).

Prints a table on stderr and one JSON document on stdout (and ``--out``): per worker count and
phase ops/s, the node's CPU-seconds, ops per node CPU-second, the generator's CPU over the
node's, RSS per process; the ratios of each count to 1 worker next to the issue's targets for
2 workers on a 2-core box (a report: the exit code does not depend on them); /proc/loadavg at
the start and end of every node's run.

    .venv/bin/python bench/load/scaling.py --workers 1,2 --repeat 3 --memory --out /tmp/workers.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import run  # siblings: this file is run as a script, so its folder is on the path

from shoal.workers.placement import WorkerPlacement

#: Issue 21's targets for N workers against 1 on this 2-core box (reported, never asserted).
TARGETS = {
    "query": {"ops_per_s_ratio_min": 1.5, "ops_per_server_cpu_s_ratio_min": 0.85},
    "register": {"ops_per_s_ratio_min": 1.3, "ops_per_server_cpu_s_ratio_min": 0.7},
}
RATE_PHASES = ("register", "query", "deregister")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def listening_sockets(port: int) -> int:
    """Sockets in LISTEN on ``port`` in this network namespace (one per SO_REUSEPORT worker)."""
    count, want = 0, f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                fields = line.split()
                count += len(fields) > 3 and fields[1].endswith(want) and fields[3] == "0A"
    return count


def placement(pid: int) -> WorkerPlacement | None:
    """The worker placement the supervisor gave process ``pid`` (its environment), None if none."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)
    try:
        return WorkerPlacement.from_env(env)
    except Exception:  # not a worker's environment after all
        return None


def node_processes(server: run.Server) -> list[dict[str, Any]]:
    """run.Server.processes(), each labelled with its worker index and private port (None: not a worker)."""
    out = server.processes()
    for proc in out:
        where = placement(proc["pid"])
        proc["worker"] = None if where is None else where.index
        proc["private_port"] = None if where is None else where.private_port
    return out


_IP_COUNT = re.compile(r'^nacos_monitor\{[^}]*name="ipCount"[^}]*\}\s+(\S+)', re.M)


def ip_count(http_port: int) -> int | None:
    """Instances the node (or worker) on ``http_port`` holds: its ``nacos_monitor`` ipCount gauge."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/nacos/actuator/prometheus", timeout=5) as r:
            m = _IP_COUNT.search(r.read().decode())
    except OSError:
        return None
    return int(float(m.group(1))) if m else None


_SYNC_SENT = re.compile(r'^shoal_distro_sync_(records_total|batches_total)\{([^}]*)\}\s+(\S+)', re.M)


def sync_sent(http_port: int) -> dict[str, int] | None:
    """What the worker on ``http_port`` sent its peers so far: client records and acknowledged
    batches, summed over peers (``records / batches`` is the mean batch)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/nacos/actuator/prometheus", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {"records": 0, "batches": 0}
    for name, labels, value in _SYNC_SENT.findall(text):
        if name == "records_total":
            out["records"] += int(float(value))
        elif 'result="success"' in labels:
            out["batches"] += int(float(value))
    return out


def wait_instances(server: run.Server, want: int, timeout_s: float) -> dict[str, Any]:
    """Until every worker (each on its private HTTP port; the node's port without workers) holds
    ``want`` instances: how long that took (replication to the siblings) and the counts."""
    ports = sorted(p["private_port"] for p in node_processes(server) if p["private_port"]) or [server.http_port]
    t0 = time.monotonic()
    while True:
        counts = {str(port): ip_count(port) for port in ports if port}
        if all(c is not None and c >= want for c in counts.values()) or time.monotonic() - t0 > timeout_s:
            break
        time.sleep(0.05)
    return {"want": want, "ip_count": counts, "waited_s": round(time.monotonic() - t0, 3),
            "all_hold": all(c is not None and c >= want for c in counts.values()),
            # cumulative since the node started (the first round's register alone in round 1)
            "sync_sent": {str(port): sync_sent(port) for port in ports if port}}


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes a comma list of counts, got {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"--workers counts must be at least 1, got {text!r}")
    return counts


_HAS_WORKERS_FLAG: list[bool] = []


def has_workers_flag() -> bool:
    """Whether the `shoal server` this tool starts (this interpreter, this PYTHONPATH) takes --workers."""
    if not _HAS_WORKERS_FLAG:
        shown = subprocess.run([sys.executable, "-m", "shoal", "server", "--help"], capture_output=True, text=True,
                               timeout=60, stdin=subprocess.DEVNULL)
        _HAS_WORKERS_FLAG.append("--workers" in shown.stdout)
    return _HAS_WORKERS_FLAG[0]


def node_argv(workers: int) -> list[str]:
    """``--workers N`` whenever the node takes it (its default may be one worker per core); a node
    without the flag runs 1 worker and nothing else."""
    if has_workers_flag():
        return ["--workers", str(workers)]
    if workers != 1:
        raise RuntimeError(f"this shoal server has no --workers flag: it cannot run {workers} workers")
    return []


def run_args(args: argparse.Namespace, *, services: int, ops: int, query_ops: int, repeat: int) -> argparse.Namespace:
    """run.py's arguments for one node: the native generator, this tool's load shape."""
    ns = run.build_parser().parse_args(["--generator", "native"])
    ns.workers = args.generators
    ns.connections = max(1, args.connections // args.generators)
    ns.services, ns.ops, ns.query_ops = services, ops, query_ops
    ns.window, ns.repeat, ns.duration = args.window, repeat, args.duration
    ns.server_arg, ns.server_log_level = args.server_arg, args.server_log_level
    return ns


def open_node(bench: run.Bench, workers: int, ready_timeout_s: float) -> run.Server:
    server = bench.open_server(node_argv=node_argv(workers))
    grpc_port = int(server.target.rpartition(":")[2])
    deadline = time.monotonic() + ready_timeout_s
    while listening_sockets(grpc_port) < workers:
        server.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{listening_sockets(grpc_port)} of {workers} workers listen on {grpc_port} "
                               f"after {ready_timeout_s} s:\n{server.log_tail()}")
        time.sleep(0.1)
    return server


def node_round(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    """One fresh node with ``workers`` workers: the rate phases."""
    ns = run_args(args, services=args.services, ops=args.services * args.instances, query_ops=args.query_ops,
                  repeat=args.repeat)
    bench = run.Bench(ns)
    out: dict[str, Any] = {"workers": workers, "loadavg_at_start": loadavg()}
    try:
        server = open_node(bench, workers, args.ready_timeout)
        out["processes_idle"] = node_processes(server)
        bench.open_pool()
        want = args.services * args.instances

        def after(name: str, result: dict[str, Any]) -> None:
            if name == "register":  # every worker holds the registry before the queries (untimed)
                result["replicated"] = wait_instances(server, want, args.replication_timeout)

        out["rates"] = bench.rate_phases(list(RATE_PHASES), after)
        out["processes_after"] = node_processes(server)
    finally:
        bench.close_pool()
        bench.close_server()
        out["server"] = bench.servers_started[-1] if bench.servers_started else None
        out["loadavg_at_end"] = loadavg()
    return out


def memory_round(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    """One fresh node with ``workers`` workers: RSS per process idle and with the big registry."""
    instances = args.memory_services * args.memory_instances
    ns = run_args(args, services=args.memory_services, ops=instances, query_ops=1, repeat=1)
    bench = run.Bench(ns)
    out: dict[str, Any] = {"workers": workers, "instances": instances, "loadavg_at_start": loadavg()}
    try:
        server = open_node(bench, workers, args.ready_timeout)
        out["processes_idle"] = node_processes(server)
        bench.open_pool()

        def loaded(name: str, result: dict[str, Any]) -> None:  # before the connections close
            out["replicated"] = wait_instances(server, instances, args.replication_timeout)
            out["processes_loaded"] = node_processes(server)

        register = bench.rate_phases(["register"], loaded)["register"]
        out["register"] = {k: register.get(k) for k in ("ops", "errors", "ops_per_s", "ops_per_server_cpu_s")}
    finally:
        bench.close_pool()
        bench.close_server()
        out["loadavg_at_end"] = loadavg()
    for key in ("idle", "loaded"):
        rss = [p["rss_bytes"] or 0 for p in out[f"processes_{key}"]] if f"processes_{key}" in out else []
        out[f"rss_bytes_{key}_total"] = sum(rss)
        out[f"rss_bytes_{key}_per_process"] = rss
    return out


def phase_row(phase: dict[str, Any]) -> dict[str, Any]:
    def med(key: str) -> Any:
        return run._median_or_single(phase, key)

    procs = phase.get("server_processes_after") or []
    return {
        "ops": phase.get("ops"),
        "errors": phase.get("errors"),
        "ops_per_s": med("ops_per_s"),
        "server_cpu_s": phase.get("server_cpu_s"),
        "ops_per_server_cpu_s": med("ops_per_server_cpu_s"),
        "client_over_server_cpu": med("client_over_server_cpu"),
        "rss_bytes_per_process": [p["rss_bytes"] for p in procs],
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for r in rounds:
        rates = r.get("rates", {})
        table[str(r["workers"])] = {name: phase_row(rates[name]) for name in RATE_PHASES if name in rates}
    base_key = "1" if "1" in table else next(iter(table), None)
    ratios: dict[str, Any] = {}
    for key, row in table.items():
        if key == base_key or base_key is None:
            continue
        ratios[f"{key}_over_{base_key}"] = per = {}
        for name in ("query", "register"):
            got, base = row.get(name, {}), table[base_key].get(name, {})
            entry: dict[str, Any] = {}
            for metric in ("ops_per_s", "ops_per_server_cpu_s"):
                a, b = got.get(metric), base.get(metric)
                ratio = round(a / b, 3) if a and b else None
                want = TARGETS[name][f"{metric}_ratio_min"]
                entry[metric] = {"ratio": ratio, "target_min": want, "met": ratio is not None and ratio >= want}
            per[name] = entry
    return {"table": table, "ratios": ratios,
            "targets_note": "issue 21: 2 workers vs 1 on a 2-core box; a report, not an assertion"}


def print_table(summary: dict[str, Any], memory: list[dict[str, Any]]) -> None:
    def fmt(v: Any, spec: str = ",.0f") -> str:
        return "-" if v is None else format(v, spec)

    lines = [f"{'workers':>7} {'phase':<10} {'ops/s':>9} {'node CPU-s':>10} {'ops/CPU-s':>9} {'gen/node':>8}  RSS MB"]
    for key, row in summary["table"].items():
        for name, r in row.items():
            rss = ",".join(f"{(b or 0) / 2**20:.0f}" for b in r["rss_bytes_per_process"])
            lines.append(f"{key:>7} {name:<10} {fmt(r['ops_per_s']):>9} {fmt(r['server_cpu_s'], '.2f'):>10} "
                         f"{fmt(r['ops_per_server_cpu_s']):>9} {fmt(r['client_over_server_cpu'], '.3f'):>8}  {rss}")
    for label, per in summary["ratios"].items():
        for name, entry in per.items():
            parts = [f"{m} {fmt(e['ratio'], '.2f')} (target >= {e['target_min']})" for m, e in entry.items()]
            lines.append(f"{label} {name}: " + ", ".join(parts))
    for m in memory:
        idle = ",".join(f"{b / 2**20:.0f}" for b in m["rss_bytes_idle_per_process"])
        loaded = ",".join(f"{b / 2**20:.0f}" for b in m["rss_bytes_loaded_per_process"])
        lines.append(f"memory, {m['workers']} worker(s): RSS MB per process idle {idle}; "
                     f"with {m['instances']:,} instances {loaded}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/load/scaling.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=parse_counts, default=[1, 2],
                   help="comma list of node worker counts, a fresh node each (default 1,2)")
    p.add_argument("--generators", type=int, default=1, help="native generator processes (default 1)")
    p.add_argument("--connections", type=int, default=100, help="connections in all (default 100)")
    p.add_argument("--services", type=int, default=100, help="services (default 100)")
    p.add_argument("--instances", type=int, default=100, help="instances per service (default 100)")
    p.add_argument("--query-ops", type=int, default=100_000, help="ServiceQueryRequests per round (default 100000)")
    p.add_argument("--window", type=int, default=8, help="calls in flight per connection (default 8)")
    p.add_argument("--repeat", type=int, default=3, help="rounds per node; medians reported (default 3)")
    p.add_argument("--duration", type=float, default=120.0, help="cap in seconds on every phase (default 120)")
    p.add_argument("--memory", action="store_true",
                   help="also RSS per node process, idle and with --memory-services x --memory-instances instances")
    p.add_argument("--memory-services", type=int, default=1000, help="services of the memory run (default 1000)")
    p.add_argument("--memory-instances", type=int, default=100, help="instances per service there (default 100)")
    p.add_argument("--no-rates", action="store_true", help="skip the rate phases (with --memory: memory only)")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds for every worker to listen")
    p.add_argument("--replication-timeout", type=float, default=60.0,
                   help="seconds for every worker to hold the registered instances (default 60)")
    p.add_argument("--server-arg", action="append", default=[], metavar="PROPERTY=VALUE",
                   help="passed to every node as -D PROPERTY=VALUE (repeatable)")
    p.add_argument("--server-log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--out", help="also write the JSON report to this file")
    return p


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.generators < 1 or args.connections < args.generators:
        parser.error("--generators must be at least 1 and at most --connections")
    shapes = [] if args.no_rates else [(args.services, args.instances)]
    if args.memory:
        shapes.append((args.memory_services, args.memory_instances))
    for services, instances in shapes:
        if services < 1 or instances < 1:
            parser.error("services and instances must be at least 1")
        if services * instances > args.connections * services:
            parser.error(f"{instances} instances per service need at least {instances} connections "
                         "(a connection holds one instance per service)")
    if args.no_rates and not args.memory:
        parser.error("--no-rates leaves nothing to run without --memory")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check(parser, args)

    run.stop_on_sigterm()
    report: dict[str, Any] = {
        **run.report_header("bench/load/scaling.py", args, loadavg()),
        "rounds": [],
        "memory": [],
    }
    status = 0
    try:
        for workers in args.workers:
            if not args.no_rates:
                run.log(f"scaling: a fresh node with {workers} worker(s)")
                report["rounds"].append(node_round(args, workers))
            if args.memory:
                run.log(f"memory: a fresh node with {workers} worker(s)")
                report["memory"].append(memory_round(args, workers))
    except KeyboardInterrupt as exc:
        report["error"], status = f"interrupted ({exc})", 130
    except Exception as exc:
        report["error"], status = f"{type(exc).__name__}: {exc}", 1
    report["summary"] = summarise(report["rounds"])
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["host"]["loadavg_at_end"] = loadavg()
    print_table(report["summary"], report["memory"])
    text = json.dumps(report, indent=2, default=run._json_default)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
