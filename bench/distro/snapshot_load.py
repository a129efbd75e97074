"""Snapshot load time of a node joining a loaded cluster (default 1,000,000 instances).

1. Starts node A alone on free 127.0.0.1 ports; its member list also names B, which is not
   started yet (so A waits out its own snapshot load timeout before it serves). With
   ``--bootstrap grow`` A starts as a one-node cluster instead and B is added to its
   cluster.conf once A is loaded.
2. Loads A through ``--connections`` raw Nacos gRPC connections with BatchInstanceRequest
   (``--services`` × ``--instances-per-service``) and waits until A's ``shoal_instances`` gauge
   reads the total. The connections stay open (their clients are A's connection clients).
3. Starts B and measures, from B's process start: its readiness (GET readiness == 200), the
   time of its log line "loaded a snapshot of N clients", and its instances gauge; meanwhile a
   HealthCheckRequest pings A every ``--ping-ms`` (A's longest event-loop stall while it serves
   the pages shows as the ping's max latency) and /proc is sampled for both nodes' RSS.
4. After ``--settle-s`` reads both gauges again (verify rounds have run by then) and reports the
   snapshot pages A served (its shoal_requests_total for DistroSnapshotRequest).

Prints one JSON document; the target is B ready within 10 s of its start for 1,000,000
instances. Servers are always stopped, also on errors and signals.

    .venv/bin/python -m bench.distro.snapshot_load
    .venv/bin/python -m bench.distro.snapshot_load --services 200 --instances-per-service 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from bench.distro._common import (
    PySpy,
    emit,
    gc_pauses,
    host_info,
    install_signal_handlers,
    log,
    loop_stalls,
    run_main,
    server_options,
    summary_ms,
    work_root,
)
from bench.load import nacos_client
from shoal.testing import OPEN, ServerProcess, ServerSet, free_port_block, http_get, metric_values, poll_until

TARGET_LOAD_S = 10.0
LOADED_RE = re.compile(r"^(\S+ \S+) \S+\s+shoal\.distro\.protocol: loaded a snapshot of (\d+) clients from (\S+)",
                       re.MULTILINE)
#: The gc policy's log line for each freeze (shoal/gcpolicy.py).
FREEZE_MARK = "shoal.gcpolicy: froze"
SERVING_RE = re.compile(r"^(\S+ \S+) \S+\s+shoal\.app: node serving", re.MULTILINE)


def log_time(stamp: str) -> float:
    """``2024-01-02 03:04:05,678`` (local time, logging's asctime) → epoch seconds."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def line_time(line: str) -> float:
    """The timestamp of a log line, or 0 for lines without one (tracebacks)."""
    try:
        return log_time(" ".join(line.split()[:2]))
    except ValueError:
        return 0.0


def snapshot_pages(server: ServerProcess) -> float | None:
    """Snapshot pages this node has served (None if it does not answer in time)."""
    try:
        samples = metric_values(server.prometheus(), "shoal_requests_total")
    except (OSError, RuntimeError):
        return None
    return float(sum(v for labels, v in samples
                     if labels.get("transport") == "cluster" and labels.get("type") == "DistroSnapshotRequest"))


def member_state(server: ServerProcess, address: str) -> str | None:
    for member in server.members():
        if member.get("address") == address:
            return str(member.get("state"))
    return None


# --- loading A ---------------------------------------------------------------------------------
def batch_body(nc: Any, s: int, per_service: int) -> str:
    instances = [nc.instance(f"10.{s // 250}.{s % 250}.{i // 250}", 1000 + i % 250, {"app": "bulk"})
                 for i in range(per_service)]
    return json.dumps(nc.batch_instance_request(f"bulk-{s}", instances), separators=(",", ":"))


async def load_a(nc: Any, conns: list[Any], services: int, per_service: int, budget_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + budget_s
    rtts: list[float] = []

    async def worker(k: int) -> None:
        for s in range(k, services, len(conns)):
            if time.monotonic() > deadline:
                raise TimeoutError("time budget for loading A spent")
            body = batch_body(nc, s, per_service)
            t0 = time.perf_counter()
            await conns[k].call_ok("BatchInstanceRequest", body, timeout_s=60)
            rtts.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(len(conns))))
    elapsed = time.perf_counter() - t0
    return {"seconds": round(elapsed, 2), "instances_per_s": round(services * per_service / elapsed),
            "batch_rtt": summary_ms(rtts)}


# --- watching B's join ---------------------------------------------------------------------------
class Sampler:
    """RSS of both nodes every ``interval`` s and a HealthCheck ping to A every ``ping_ms``."""

    def __init__(self, a: ServerProcess, b: ServerProcess, ping_conn: Any, ping_ms: float) -> None:
        self.a, self.b = a, b
        self.ping_conn = ping_conn
        self.ping_s = ping_ms / 1000
        self.rss_peak: dict[str, int] = {"a": 0, "b": 0}
        self.pings: list[tuple[float, float]] = []  # (send time, latency)
        self.ping_errors = 0

    async def rss_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for name, server in (("a", self.a), ("b", self.b)):
                if server.proc is not None:
                    rss = server.proc_status().get("VmRSS", 0)
                    self.rss_peak[name] = max(self.rss_peak[name], rss)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def ping_loop(self, stop: asyncio.Event) -> None:
        next_at = time.perf_counter()
        while not stop.is_set():
            t0 = time.time()
            p0 = time.perf_counter()
            try:
                await self.ping_conn.health_check(timeout_s=30)
            except Exception:
                self.ping_errors += 1
            self.pings.append((t0, time.perf_counter() - p0))  # a failed ping counts its wait
            next_at += self.ping_s
            delay = next_at - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            else:
                next_at = time.perf_counter()

    def pings_between(self, start: float, end: float) -> list[float]:
        return [lat for t, lat in self.pings if start <= t <= end]


async def wait_ready_async(server: ServerProcess, timeout_s: float, interval_s: float = 0.02) -> float:
    deadline = time.monotonic() + timeout_s
    url = server.url("/nacos/v1/console/health/readiness")
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            status, _ = await asyncio.to_thread(http_get, url, 0.5)
        except OSError:
            status = 0
        if status == 200:
            return time.time()
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"B not ready within {timeout_s:.0f} s:\n{server.log_tail()}")


async def measure(args: argparse.Namespace, servers: ServerSet, ports: list[int], members: str,
                  extra: list[str]) -> dict[str, Any]:
    nc = nacos_client
    out: dict[str, Any] = {}
    b_addr = f"127.0.0.1:{ports[1]}"
    conf = servers.root / "cluster.conf"
    if args.bootstrap == "members":
        a = servers.start(ports[0], ["--members", members, *extra], **server_options(args.gc_log))
        log(f"A started on {a.addr} (members {members}); it serves after its own load timeout")
    else:  # grow: A starts as a one-node cluster (so it is loaded) and learns of B from its cluster.conf
        await asyncio.to_thread(conf.write_text, f"127.0.0.1:{ports[0]}\n")
        a = servers.start(ports[0], ["--cluster-conf", str(conf), *extra], **server_options(args.gc_log))
        log(f"A started on {a.addr} alone; B is added to its cluster.conf after the load")
    ready_a = await asyncio.to_thread(a.wait_ready, args.startup_timeout)
    out["a_ready_after_s"] = round(ready_a - a.started_at, 2)
    if args.bootstrap == "members":
        await asyncio.to_thread(poll_until, lambda: member_state(a, b_addr) == "DOWN", 15, 0.2, "A to see B DOWN")

    conns: list[Any] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for _ in range(args.connections):
            conn = nc.NacosConnection(f"127.0.0.1:{a.grpc_port}")
            await conn.connect(10)
            conns.append(conn)
        total = args.services * args.instances_per_service
        log(f"loading A with {total} instances ({args.services} services x {args.instances_per_service}) "
            f"over {args.connections} connections")
        cpu0 = a.cpu_s() or 0.0
        out["load_a"] = await load_a(nc, conns, args.services, args.instances_per_service, args.load_budget_s)
        out["load_a"]["server_cpu_s"] = round((a.cpu_s() or 0.0) - cpu0, 2)
        gauge = await asyncio.to_thread(poll_until, lambda: a.try_gauge("instances") == total, 120, 0.5,
                                        f"A's instances gauge to read {total}")
        out["a_instances_gauge"] = a.gauge("instances")
        out["a_clients_gauge"] = a.gauge("clients")
        del gauge
        if args.bootstrap == "grow":
            await asyncio.to_thread(conf.write_text, f"127.0.0.1:{ports[0]}\n127.0.0.1:{ports[1]}\n")
            await asyncio.to_thread(poll_until, lambda: member_state(a, b_addr) == "DOWN", 30, 0.2,
                                    "A to reload its cluster.conf and see B DOWN")
        a_rss_loaded = a.proc_status()
        log(f"A holds {out['a_instances_gauge']:.0f} instances; RSS {a_rss_loaded.get('VmRSS', 0) / 2**20:.0f} MiB")
        pages_before = snapshot_pages(a)
        a_cpu_before = a.cpu_s() or 0.0

        ping_conn = nc.NacosConnection(f"127.0.0.1:{a.grpc_port}")
        await ping_conn.connect(10)
        conns.append(ping_conn)
        b = ServerProcess(ports[1], servers.root / f"node-{ports[1]}", ["--members", members, *extra],
                          **server_options(args.gc_log))
        sampler = Sampler(a, b, ping_conn, args.ping_ms)
        tasks = [asyncio.create_task(sampler.rss_loop(stop)), asyncio.create_task(sampler.ping_loop(stop))]
        await asyncio.sleep(1.0)  # a baseline of pings before B starts
        baseline_end = time.time()
        servers.add(b)
        profilers: dict[str, PySpy] = {}
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            profilers["a"] = PySpy(a.pid, Path(args.profile) / "a-during-join.txt")
            profilers["a"].start()
        b.start()
        log(f"B started on {b.addr}")
        if args.profile:
            await asyncio.sleep(0.5)  # let the interpreter come up before attaching
            profilers["b"] = PySpy(b.pid, Path(args.profile) / "b-join.txt")
            profilers["b"].start()
        try:
            ready_b = await wait_ready_async(b, args.join_timeout)
        finally:
            for profiler in profilers.values():
                await asyncio.to_thread(profiler.stop)
        b_instances_at_ready = await asyncio.to_thread(b.try_gauge, "instances")
        b_clients_at_ready = await asyncio.to_thread(b.try_gauge, "clients")
        a_cpu_join = (a.cpu_s() or 0.0) - a_cpu_before
        b_cpu_join = b.cpu_s()
        window_pings = sampler.pings_between(b.started_at, ready_b)
        log(f"B ready after {ready_b - b.started_at:.2f} s with {b_instances_at_ready} instances; settling")
        timeline: list[tuple[float, float | None]] = []  # (s after B's start, B's instances gauge)
        settle_end = time.monotonic() + args.settle_s
        while time.monotonic() < settle_end:
            value = await asyncio.to_thread(b.try_gauge, "instances")
            timeline.append((round(time.time() - b.started_at, 2), value))
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks = []

        pages_after = snapshot_pages(a)
        b_log = b.log()
        loaded = LOADED_RE.search(b_log)
        serving = SERVING_RE.search(b_log)
        a_log = a.log()
        out["join"] = {
            "b_ready_after_start_s": round(ready_b - b.started_at, 3),
            "b_log_loaded_after_start_s": round(log_time(loaded.group(1)) - b.started_at, 3) if loaded else None,
            "b_log_loaded_clients": int(loaded.group(2)) if loaded else None,
            "b_log_loaded_from": loaded.group(3) if loaded else None,
            "b_log_serving_after_start_s": round(log_time(serving.group(1)) - b.started_at, 3) if serving else None,
            "b_instances_gauge_at_ready": b_instances_at_ready,
            "b_clients_gauge_at_ready": b_clients_at_ready,
            "b_instances_gauge_after_settle": b.try_gauge("instances"),
            "b_instances_gauge_min_while_settling": min((v for _, v in timeline if v is not None), default=None),
            "b_instances_gauge_timeline": timeline if any(v != total for _, v in timeline) else "constant",
            "a_instances_gauge_after_settle": a.try_gauge("instances"),
            "pages_served_by_a": None if pages_after is None or pages_before is None else pages_after - pages_before,
            "pages_served_by_b": snapshot_pages(b),
            "a_cpu_s_during_join": round(a_cpu_join, 2),
            "b_cpu_s_until_ready": b_cpu_join,
            "peak_rss_mib": {"a": round(max(sampler.rss_peak["a"], a.proc_status().get("VmHWM", 0)) / 2**20, 1),
                             "b": round(max(sampler.rss_peak["b"], b.proc_status().get("VmHWM", 0)) / 2**20, 1)},
            "a_rss_mib_loaded_before_join": round(a_rss_loaded.get("VmRSS", 0) / 2**20, 1),
            "a_ping_during_join": {**summary_ms(window_pings), "interval_ms": args.ping_ms,
                                   "errors": sampler.ping_errors},
            "a_ping_baseline": summary_ms(sampler.pings_between(baseline_end - 1.0, baseline_end)),
            "a_log_lines_after_join": [line for line in a_log.splitlines()
                                       if ("snapshot" in line or "previous run" in line or "verify" in line)
                                       and line_time(line) >= b.started_at][:20],
            "b_log_warnings": [line for line in b_log.splitlines() if " WARNING " in line or " ERROR " in line][:20],
        }
        if args.gc_log:
            pauses = gc_pauses(a, b.started_at)
            out["join"]["a_gc_pauses_ms_during_join"] = {
                "count": len([p for p in pauses if p[0] <= ready_b]),
                "max_ms": max((ms for t, _g, ms in pauses if t <= ready_b), default=0.0),
                "pauses": [{"at_s": round(t - b.started_at, 2), "gen": g, "ms": ms} for t, g, ms in pauses][:40]}
            # A's late loop wake-ups during the join: CPU ~ wall is A's loop busy, CPU << wall a
            # machine too loaded to give A a core
            stalls = [(t, w, c) for t, w, c in loop_stalls(a, b.started_at) if t <= ready_b]
            out["join"]["a_loop_stalls_during_join"] = {
                "count_20ms_or_more": len(stalls),
                "max_wall_ms": max((w for _t, w, _c in stalls), default=0.0),
                "max_cpu_ms": max((c for _t, _w, c in stalls), default=0.0),
                "worst": [{"at_s": round(t - b.started_at, 2), "wall_ms": w, "cpu_ms": c}
                          for t, w, c in sorted(stalls, key=lambda s: -s[1])[:8]]}
            # B's collections from its start to its readiness: the collector's share of the load
            b_pauses = [ms for t, _g, ms in gc_pauses(b, b.started_at) if t <= ready_b]
            out["join"]["b_gc_pauses_ms_until_ready"] = {"count": len(b_pauses), "sum_ms": round(sum(b_pauses), 1),
                                                         "max_ms": max(b_pauses, default=0.0)}
            # A's freezes (shoal/gcpolicy.py), in seconds after B's start (negative: before it)
            out["join"]["a_gc_freezes"] = [
                f"{line_time(line) - b.started_at:+.2f} s: {line.split(FREEZE_MARK, 1)[1].strip()}"
                for line in a_log.splitlines() if FREEZE_MARK in line]
        out["extensions_loaded"] = {"a": a.extensions_loaded(), "b": b.extensions_loaded()}
        if profilers:
            out["profile"] = {name: profiler.top(args.profile_top) for name, profiler in profilers.items()}
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--services", type=int, default=1000, help="services loaded into A (default 1000)")
    p.add_argument("--instances-per-service", type=int, default=1000, help="instances per service (default 1000)")
    p.add_argument("--connections", type=int, default=8, help="loader connections to A (default 8)")
    p.add_argument("--bootstrap", choices=["members", "grow"], default="members",
                   help="members: A starts with --members naming A and B (the issue's set-up; A never loaded "
                        "a snapshot itself); grow: A starts as a one-node cluster from a cluster.conf that "
                        "names B only once A is loaded (scale-out of a loaded cluster)")
    p.add_argument("--ping-ms", type=float, default=10.0, help="HealthCheck ping period to A during the join")
    p.add_argument("--settle-s", type=float, default=15.0,
                   help="wait after B is ready before the final gauges (default 15: covers verify rounds)")
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds for A to become ready")
    p.add_argument("--load-budget-s", type=float, default=900.0, help="time budget for loading A")
    p.add_argument("--join-timeout", type=float, default=300.0, help="seconds allowed for B to become ready")
    p.add_argument("--server-arg", action="append", default=[], metavar="PROPERTY=VALUE",
                   help="extra -D setting for both nodes (repeatable)")
    p.add_argument("--keep-logs", metavar="DIR", help="write the servers' data dirs and logs here")
    p.add_argument("--profile", metavar="DIR",
                   help="py-spy A and B from B's start to its readiness (raw stacks in DIR; top frames in the JSON)")
    p.add_argument("--gc-log", action="store_true",
                   help="A and B log their collections of 5 ms or more (gc.callbacks); A's during the join, "
                        "B's until it is ready, and A's freezes are reported")
    p.add_argument("--profile-top", type=int, default=15, help="frames listed per profile (default 15)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (1 <= args.services <= 100_000 and 1 <= args.instances_per_service <= 10_000
            and 1 <= args.connections <= 256):
        raise SystemExit("--services 1..100000, --instances-per-service 1..10000, --connections 1..256")
    install_signal_handlers()
    extra: list[str] = []
    # one batch must fit the SDK port's inbound limit (default 10 MiB); ~230 bytes per instance
    if args.instances_per_service * 260 > 8 * 1024 * 1024:
        extra += ["-D", f"nacos.remote.server.grpc.sdk.max-inbound-message-size={64 * 1024 * 1024}"]
    for setting in args.server_arg:
        extra += ["-D", setting]
    report: dict[str, Any] = {"benchmark": "distro-snapshot-load", "host": host_info(),
                              "settings": {k: v for k, v in vars(args).items() if k != "keep_logs"},
                              "server_args": extra}
    with contextlib.ExitStack() as stack:
        root = work_root(stack, args.keep_logs)
        servers = stack.enter_context(ServerSet(root, auth=OPEN))
        ports = [free_port_block()]
        ports.append(free_port_block(avoid=ports))
        members = ",".join(f"127.0.0.1:{p}" for p in ports)
        report["result"] = asyncio.run(measure(args, servers, ports, members, extra))
    join = report["result"]["join"]
    total = args.services * args.instances_per_service
    report["targets"] = {
        "snapshot_load_s": {"target": TARGET_LOAD_S, "instances": total,
                            "measured_ready_s": join["b_ready_after_start_s"],
                            "measured_log_loaded_s": join["b_log_loaded_after_start_s"],
                            "met": join["b_ready_after_start_s"] <= TARGET_LOAD_S
                            and join["b_instances_gauge_at_ready"] == total},
    }
    emit(report)
    return 0


if __name__ == "__main__":
    run_main(main)
