"""Push fan-out: one change to a service with many subscribers, until the last one acked (issue 21).

For each count in ``--workers`` (default ``1,2``), a fresh ``shoal server --workers N`` (left out for
1 on a node without the flag; the tool waits until N sockets listen on the SDK port, so the kernel spreads
the connections over the workers), then:

* ``--subscribers`` connections (1,000), opened by ``--procs`` native generator processes
  (``native/nacos_load.c``, one epoll loop each: the cheapest client per subscriber), each
  subscribe to one service (SubscribeServiceRequest);
* one more native connection, the writer, changes the service ``--warmup`` + ``--changes`` times:
  every change registers the writer's instance on a fresh port, which replaces its previous
  instance, so the port in a push names the change;
* the subscribers answer every NotifySubscriberRequest at once and record when they read it
  (CLOCK_MONOTONIC, the same clock as this process's ``time.monotonic()``; the ack is written in
  the same loop pass). A change is done when every subscriber has read a push with its port
  (or ``--settle`` seconds passed: the rest are ``missed``); then ``--gap-ms`` of quiet and the next.

Per worker count: change → last subscriber's ack p50/p99/max over the timed changes (from the
moment the writer's request was handed to its process), change → each ack p50/p99, the writer's
own request latency, pushes read, and pushes per node CPU-second (the node's utime + stime,
summed over all its processes, over the timed changes, the writer's registrations included).
Prints a table on stderr and one JSON document on stdout (and ``--out``).

    .venv/bin/python bench/load/push_fanout.py --workers 1,2 --out /tmp/fanout.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nacos_client as nc
import native_gen  # siblings: this file is run as a script, so its folder is on the path
import run
import scaling

SERVICE = "fanout-svc"
WRITER_IP = "10.250.0.1"
FIRST_PORT = 20_000


def subscribe_plan(count: int) -> list[list[tuple[str, bytes]]]:
    body = json.dumps(nc.subscribe_request(SERVICE)).encode()
    return [[("SubscribeServiceRequest", body)] for _ in range(count)]


def change_plan(port: int) -> list[list[tuple[str, bytes]]]:
    body = nc.instance_request("registerInstance", SERVICE, nc.instance(WRITER_IP, port))
    return [[("InstanceRequest", json.dumps(body).encode())]]


_ACK_LINE = re.compile(r'^shoal_push_ack_seconds_(bucket|count|sum)\{([^}]*)\}\s+(\S+)', re.M)
_LE = re.compile(r'le="([^"]+)"')


def push_ack_histogram(http_port: int) -> dict[str, Any] | None:
    """The node's (or worker's) ``shoal_push_ack_seconds``, summed over its label sets."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/nacos/actuator/prometheus", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: dict[str, Any] = {"count": 0.0, "sum": 0.0, "buckets": {}}
    for kind, labels, value in _ACK_LINE.findall(text):
        if kind == "bucket":
            le = _LE.search(labels)
            if le:
                out["buckets"][le.group(1)] = out["buckets"].get(le.group(1), 0.0) + float(value)
        else:
            out[kind] += float(value)
    return out


def histogram_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Acks counted between two reads: how many, the mean, and the bucket bounds p50/p99 fall in."""
    if before is None or after is None:
        return None
    count = after["count"] - before["count"]
    buckets = sorted(((float(le), n - before["buckets"].get(le, 0.0)) for le, n in after["buckets"].items()),
                     key=lambda b: b[0])

    def bound(q: float) -> float | None:
        return next((le * 1000 for le, n in buckets if count and n >= q * count), None)

    return {"acks": int(count), "mean_ms": round((after["sum"] - before["sum"]) / count * 1000, 3) if count else None,
            "p50_le_ms": bound(0.5), "p99_le_ms": bound(0.99)}


def ms(values: Sequence[float]) -> dict[str, Any]:
    return run.latency_ms(values)


class Fanout:
    """The subscriber processes and the writer against one node."""

    def __init__(self, target: str, subscribers: int, procs: int) -> None:
        binary = native_gen.build()
        per = [subscribers // procs + (1 if i < subscribers % procs else 0) for i in range(procs)]
        self.subs = [native_gen.NativeProcess(i, binary, target) for i in range(procs)]
        self.writer = native_gen.NativeProcess(procs, binary, target)
        self.per = per

    def open(self, server: run.Server) -> dict[str, Any]:
        alive = server.check_alive
        for i, proc in enumerate(self.subs):
            proc.start("connect", {"count": self.per[i], "first_global": sum(self.per[:i]), "timeout": 60.0})
        opened = [p.finish("connect", time.monotonic() + 120, alive) for p in self.subs]
        self.writer.start("connect", {"count": 1, "first_global": 0})
        self.writer.finish("connect", time.monotonic() + 60, alive)
        subscribed = [p.run_plan(subscribe_plan(p.opened), 1, 60.0) for p in self.subs]
        return {
            "opened": sum(r["opened"] for r in opened),
            "open_failures": sum(r["failed"] for r in opened),
            "open_errors": run.merge_errors(opened),
            "subscribed": sum(r["ops"] for r in subscribed),
            "subscribe_errors": run.merge_errors(subscribed),
        }

    def change(self, port: int, settle_s: float, server: run.Server) -> dict[str, Any]:
        """One change; every subscriber's first push with ``port`` (seconds after the change)."""
        plan = Path(self.writer._path("change.plan"))
        plan.write_bytes(native_gen.encode_plan(change_plan(port)))
        t0 = time.monotonic()
        self.writer.send(f"run {plan} 1 30 {self.writer._path('run.lat')}")
        for proc in self.subs:
            proc.start_await(port, proc.opened, settle_s)
        wrote = self.writer.finish("run", time.monotonic() + 60, server.check_alive)
        if wrote["ops"] != 1:
            raise RuntimeError(f"the writer's change failed: {wrote['errors']}")
        first: dict[tuple[int, int], float] = {}
        pushes = 0
        timed_out = False
        for proc in self.subs:
            got = proc.finish_await(time.monotonic() + settle_s + 30, server.check_alive)
            timed_out |= got["timed_out"]
            pushes += len(got["records"])
            for conn, p, t in got["records"]:
                if p == port and (proc.index, conn) not in first:
                    first[(proc.index, conn)] = t - t0
        return {"acks": sorted(first.values()), "pushes": pushes, "timed_out": timed_out,
                "writer_s": wrote["latency_s"][0] if len(wrote["latency_s"]) else None}

    def close(self) -> None:
        for proc in [*self.subs, self.writer]:
            proc.close()


def node_round(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    ns = run.build_parser().parse_args([])
    ns.server_arg, ns.server_log_level = args.server_arg, args.server_log_level
    bench = run.Bench(ns)
    out: dict[str, Any] = {"workers": workers, "loadavg_at_start": scaling.loadavg()}
    fan: Fanout | None = None
    try:
        server = scaling.open_node(bench, workers, args.ready_timeout)
        fan = Fanout(server.target, args.subscribers, args.procs)
        out["connections"] = fan.open(server)
        n_subs = out["connections"]["subscribed"]
        run.log(f"fan-out: {n_subs} subscribers on {workers} worker(s); {args.warmup} warm-up changes")
        for k in range(args.warmup):
            fan.change(FIRST_PORT + k, args.settle, server)
        last, each, writer = [], [], []
        missed = pushes = 0
        # the node's own view: shoal_push_ack_seconds of every worker (its private port), or the node's
        ports = sorted(p["private_port"] for p in scaling.node_processes(server) if p["private_port"]) or [
            server.http_port]
        hist0 = {port: push_ack_histogram(port) for port in ports if port}
        cpu0 = server.cpu_s()
        for k in range(args.changes):
            got = fan.change(FIRST_PORT + args.warmup + k, args.settle, server)
            missed += n_subs - len(got["acks"])
            pushes += got["pushes"]
            each.extend(got["acks"])
            if got["acks"]:
                last.append(got["acks"][-1])
            if got["writer_s"] is not None:
                writer.append(got["writer_s"])
            if args.gap_ms > 0:
                time.sleep(args.gap_ms / 1000)
        cpu1 = server.cpu_s()
        server_side = {str(port): histogram_delta(h, push_ack_histogram(port)) for port, h in hist0.items()}
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        out.update({
            "subscribers": n_subs,
            "changes": args.changes,
            "change_to_last_ack_ms": ms(last),
            "change_to_each_ack_ms": ms(each),
            "writer_request_ms": ms(writer),
            "missed_acks": missed,
            "pushes_read": pushes,
            "server_cpu_s": None if cpu is None else round(cpu, 3),
            "pushes_per_server_cpu_s": round(pushes / cpu, 1) if cpu else None,
            "server_cpu_ms_per_change": round(cpu / args.changes * 1000, 3) if cpu else None,
            "server_push_ack_by_http_port": server_side,
            "processes_after": scaling.node_processes(server),
        })
        lat = out["change_to_last_ack_ms"]
        run.log(f"fan-out, {workers} worker(s): change -> last ack p50 {lat['p50']} ms, p99 {lat['p99']} ms; "
                f"{out['pushes_per_server_cpu_s']} pushes per node CPU-s; missed {missed}")
    finally:
        if fan is not None:
            fan.close()
        bench.close_server()
        out["server"] = bench.servers_started[-1] if bench.servers_started else None
        out["loadavg_at_end"] = scaling.loadavg()
    return out


def print_table(rounds: list[dict[str, Any]]) -> None:
    lines = [f"{'workers':>7} {'subs':>5} {'last ack p50':>12} {'p99':>8} {'max':>8} {'each p99':>9} "
             f"{'pushes/CPU-s':>12} {'missed':>6}"]
    for r in rounds:
        if "change_to_last_ack_ms" not in r:
            continue
        last, each = r["change_to_last_ack_ms"], r["change_to_each_ack_ms"]
        lines.append(f"{r['workers']:>7} {r['subscribers']:>5} {last['p50']!s:>12} {last['p99']!s:>8} "
                     f"{last['max']!s:>8} {each['p99']!s:>9} {r['pushes_per_server_cpu_s']!s:>12} "
                     f"{r['missed_acks']:>6}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/load/push_fanout.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=scaling.parse_counts, default=[1, 2],
                   help="comma list of node worker counts, a fresh node each (default 1,2)")
    p.add_argument("--subscribers", type=int, default=1000, help="subscriber connections (default 1000)")
    p.add_argument("--procs", type=int, default=2, help="native processes holding them (default 2)")
    p.add_argument("--changes", type=int, default=100, help="timed changes (default 100)")
    p.add_argument("--warmup", type=int, default=5, help="changes before the timed ones (default 5)")
    p.add_argument("--settle", type=float, default=5.0, help="seconds a change may take to reach everyone")
    p.add_argument("--gap-ms", type=float, default=50.0, help="quiet between changes (default 50 ms)")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds for every worker to listen")
    p.add_argument("--server-arg", action="append", default=[], metavar="PROPERTY=VALUE",
                   help="passed to every node as -D PROPERTY=VALUE (repeatable)")
    p.add_argument("--server-log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--out", help="also write the JSON report to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.subscribers < 1 or not 1 <= args.procs <= args.subscribers or args.changes < 1 or args.warmup < 0:
        parser.error("--subscribers, --changes at least 1; --procs between 1 and --subscribers; --warmup >= 0")

    run.stop_on_sigterm()
    report: dict[str, Any] = {
        **run.report_header("bench/load/push_fanout.py", args, scaling.loadavg()),
        "rounds": [],
    }
    status = 0
    try:
        for workers in args.workers:
            run.log(f"fan-out: a fresh node with {workers} worker(s)")
            report["rounds"].append(node_round(args, workers))
    except KeyboardInterrupt as exc:
        report["error"], status = f"interrupted ({exc})", 130
    except Exception as exc:
        report["error"], status = f"{type(exc).__name__}: {exc}", 1
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["host"]["loadavg_at_end"] = scaling.loadavg()
    print_table(report["rounds"])
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
