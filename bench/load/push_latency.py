"""Push latency on one node, by gRPC transport and push coalescing window, side by side.

For each ``--repeat`` round, for each transport (``shoal.remote.transport``) and each push delay
(``nacos.naming.push.pushTaskDelay``; ``default`` = the node's own default, not passed), in
turn, a fresh standalone ``shoal server`` on free 127.0.0.1 ports and two phases:

* **quiet**: ``--subscribers`` connections subscribe to one service; one writer connection
  changes it ``--changes`` times, one change every ``--interval-ms`` (each change registers the
  writer's instance on a fresh port, which replaces its previous one). A sample is the time the
  first NotifySubscriberRequest listing that port reached a subscriber, minus the writer's ack
  (``from_ack``) and minus the moment the request was written (``from_send``). The first
  ``--warmup`` changes are not counted (a state skipped by coalescing counts as received with
  the next newer one). Its target is push p99 ≤ 10 ms on a quiet box. With a delay of 0
  the push can overtake the writer's own ack, so ``from_ack`` may be negative.
* **storm** (``--storm-seconds`` > 0): ``--storm-writers`` connections register and deregister
  their own instances of one service back to back while ``--storm-subscribers`` connections
  (in a process of their own, so they ack at once) subscribe to it: changes acknowledged per
  second, pushes received per subscriber per change (< 1: the coalescing merged changes), and
  the server's CPU per change. What a lower delay costs when the service churns.

Everything runs in this process (a grpc.aio client, as the SDKs' own); latencies use
``time.time()`` on both sides. Prints a table on stderr and one JSON document on stdout, and saves
it under ``bench/results/`` (ignored by git) unless ``--out`` names another file.

    .venv/bin/python -m bench.load.push_latency                          # native+grpcio x default,0,2,5 ms, 3 rounds
    .venv/bin/python -m bench.load.push_latency --delays default,0 --repeat 1 --storm-seconds 0   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

from bench.distro import _common as common
from bench.load import nacos_client
from shoal.config import Config
from shoal.testing import OPEN, ServerProcess, ServerSet

SERVICE = "push-latency"
STORM_SERVICE = "push-storm"
TARGET_P99_MS = 10.0


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))


async def connect_all(target: str, count: int, on_push: Any = None) -> list[Any]:
    conns = [nacos_client.NacosConnection(target, on_push=on_push) for _ in range(count)]
    outcome = await asyncio.gather(*(c.connect(10) for c in conns), return_exceptions=True)
    failed = [r for r in outcome if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        raise RuntimeError(f"{len(failed)} of {count} connections to {target} failed: {failed[0]}")
    return conns


async def subscribe(conns: list[Any], service: str) -> None:
    for conn in conns:
        _, reply = await conn.request("SubscribeServiceRequest", nacos_client.subscribe_request(service))
        if reply.get("resultCode") != 200:
            raise RuntimeError(f"subscribe failed: {reply}")


# --- quiet: one writer, paced changes --------------------------------------------------------
async def quiet_phase(args: argparse.Namespace, target: str) -> dict[str, Any]:
    nc = nacos_client
    sent: dict[int, float] = {}
    acked: dict[int, float] = {}
    seen: dict[tuple[int, int], float] = {}  # (subscriber, port) → first push listing it
    pushes = [0]

    def on_push(conn: Any, received: float, info: dict[str, Any]) -> None:
        pushes[0] += 1
        sub = ids[id(conn)]
        for host in info.get("hosts") or []:
            port = int(host.get("port", 0))
            if port in sent and (sub, port) not in seen:
                seen[(sub, port)] = received
                # each change replaces the previous instance: coalescing may skip a state, whose
                # news then arrived with this newer one
                for earlier in range(port - 1, 9_999, -1):
                    if (sub, earlier) in seen:
                        break
                    seen[(sub, earlier)] = received

    subs = await connect_all(target, args.subscribers, on_push)
    ids = {id(c): i for i, c in enumerate(subs)}
    writer: list[Any] = []
    try:
        writer = await connect_all(target, 1)
        await subscribe(subs, SERVICE)
        total = args.warmup + args.changes
        started = time.monotonic()
        for i in range(total):
            delay = started + i * args.interval_ms / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            port = 10_000 + i
            body = _dumps(nc.instance_request("registerInstance", SERVICE, nc.instance("10.9.0.1", port)))
            sent[port] = time.time()
            await writer[0].call_ok("InstanceRequest", body, timeout_s=10)
            acked[port] = time.time()
        deadline = time.monotonic() + args.settle_s
        expected = [(s, p) for s in range(len(subs)) for p in acked]
        while time.monotonic() < deadline and not all(k in seen for k in expected):
            await asyncio.sleep(0.01)
    finally:
        await asyncio.gather(*(c.close() for c in (*subs, *writer)), return_exceptions=True)
    measured = [10_000 + i for i in range(args.warmup, args.warmup + args.changes)]
    from_ack = [seen[(s, p)] - acked[p] for s in range(len(subs)) for p in measured if (s, p) in seen]
    from_send = [seen[(s, p)] - sent[p] for s in range(len(subs)) for p in measured if (s, p) in seen]
    write_rtt = [acked[p] - sent[p] for p in measured if p in acked]
    return {"from_ack": common.summary_ms(from_ack), "from_send": common.summary_ms(from_send),
            "write_rtt": common.summary_ms(write_rtt), "missed": len(subs) * len(measured) - len(from_ack),
            "pushes_received": pushes[0]}


# --- storm: many writers as fast as they can ------------------------------------------------------
def storm_subscribers_main(target: str, count: int, ready: Any, stop: Any, results: Any) -> None:
    """A process of its own: ``count`` subscribers of the storm service that ack every push at once
    (the generator's writers do not slow them down); reports the pushes they received."""

    async def run() -> int:
        pushes = [0]

        def on_push(conn: Any, received: float, info: dict[str, Any]) -> None:
            pushes[0] += 1

        subs = await connect_all(target, count, on_push)
        try:
            await subscribe(subs, STORM_SERVICE)
            settle = time.monotonic() + 2.0  # the first-subscription pushes are not the storm's
            while pushes[0] < len(subs) and time.monotonic() < settle:
                await asyncio.sleep(0.01)
            pushes[0] = 0
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            return pushes[0]
        finally:
            await asyncio.gather(*(c.close() for c in subs), return_exceptions=True)

    try:
        results.put(("ok", asyncio.run(run())))
    except BaseException as exc:  # reported to the parent
        results.put(("error", f"{type(exc).__name__}: {exc}"))


async def storm_phase(args: argparse.Namespace, target: str, server: ServerProcess) -> dict[str, Any]:
    nc = nacos_client
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding grpc state
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=storm_subscribers_main, args=(target, args.storm_subscribers, ready, stop, results),
                       daemon=True, name="push-storm-subscribers")
    proc.start()
    writers: list[Any] = []
    try:
        writers = await connect_all(target, args.storm_writers)
        deadline = time.monotonic() + args.startup_timeout
        while not ready.is_set():
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError("the storm's subscriber process did not get ready")
            await asyncio.sleep(0.01)
        changes = [0]

        async def lane(w: int, conn: Any, stop_at: float) -> None:
            inst = nc.instance(f"10.8.{w >> 8}.{w & 255}", 9000)
            bodies = [_dumps(nc.instance_request(kind, STORM_SERVICE, inst))
                      for kind in ("registerInstance", "deregisterInstance")]
            turn = 0
            while time.time() < stop_at:
                await conn.call_ok("InstanceRequest", bodies[turn], timeout_s=10)
                changes[0] += 1
                turn ^= 1

        cpu0, t0 = server.cpu_s() or 0.0, time.time()
        stop_at = t0 + args.storm_seconds
        await asyncio.gather(*(lane(w, c, stop_at) for w, c in enumerate(writers)))
        wall = time.time() - t0
        cpu1 = server.cpu_s() or 0.0
        await asyncio.sleep(0.5)  # the last coalesced pushes (bounded: one push per subscriber)
        stop.set()
        kind, value = await asyncio.to_thread(results.get, True, 30)
        if kind != "ok":
            raise RuntimeError(f"storm subscribers: {value}")
        pushes = int(value)
    finally:
        stop.set()
        await asyncio.gather(*(c.close() for c in writers), return_exceptions=True)
        common.stop_processes([proc])
    n = changes[0]
    per_sub = pushes / args.storm_subscribers
    return {"changes": n, "changes_per_s": round(n / wall, 1),
            "pushes_per_subscriber": round(per_sub, 1),
            "pushes_per_subscriber_per_change": round(per_sub / n, 3) if n else None,
            "server_cpu_us_per_change": round((cpu1 - cpu0) / n * 1e6, 1) if n else None,
            "server_cpu_utilisation": round((cpu1 - cpu0) / wall, 3)}


# --- one node ------------------------------------------------------------------------------------
def run_one(args: argparse.Namespace, transport: str, delay: str, root: Path) -> dict[str, Any]:
    extra = ["--log-level", "warning", "-D", f"shoal.remote.transport={transport}"]
    if delay != "default":
        extra += ["-D", f"nacos.naming.push.pushTaskDelay={delay}"]
    for setting in args.server_arg:
        extra += ["-D", setting]
    with ServerSet(root / f"{transport}-{delay}-{time.monotonic_ns()}", auth=OPEN) as servers:
        server = servers.start(None, extra, **common.server_options())
        server.wait_ready(args.startup_timeout)
        target = f"127.0.0.1:{server.grpc_port}"

        async def both() -> dict[str, Any]:
            out: dict[str, Any] = {"quiet": await quiet_phase(args, target)}
            if args.storm_seconds > 0:
                out["storm"] = await storm_phase(args, target, server)
            return out

        result = asyncio.run(both())
        server.check_alive()
    q = result["quiet"]["from_ack"]
    common.log(f"{transport}, delay {delay}: push from ack p50 {q['p50_ms']} ms, p99 {q['p99_ms']} ms"
        + (f"; storm {result['storm']['pushes_per_subscriber_per_change']} pushes/change, "
           f"{result['storm']['server_cpu_us_per_change']} us CPU/change" if "storm" in result else ""))
    return {"transport": transport, "push_task_delay_ms": delay, **result,
            "loadavg": common.loadavg()}


# --- summary -------------------------------------------------------------------------------------
def summarise(runs: list[dict[str, Any]], delays: list[str], transports: list[str]) -> list[dict[str, Any]]:
    rows = []
    for delay in delays:
        for transport in transports:
            mine = [r for r in runs if r["transport"] == transport and r["push_task_delay_ms"] == delay]
            row: dict[str, Any] = {
                "push_task_delay_ms": delay, "transport": transport, "rounds": len(mine),
                "from_ack_p50_ms": common.median([r["quiet"]["from_ack"]["p50_ms"] for r in mine]),
                "from_ack_p99_ms": common.median([r["quiet"]["from_ack"]["p99_ms"] for r in mine]),
                "from_send_p99_ms": common.median([r["quiet"]["from_send"]["p99_ms"] for r in mine]),
                "missed": sum(r["quiet"]["missed"] for r in mine),
            }
            if all("storm" in r for r in mine) and mine:
                row["storm_changes_per_s"] = common.median([r["storm"]["changes_per_s"] for r in mine])
                row["storm_pushes_per_change"] = common.median(
                    [r["storm"]["pushes_per_subscriber_per_change"] for r in mine])
                row["storm_cpu_us_per_change"] = common.median([r["storm"]["server_cpu_us_per_change"] for r in mine])
            row["p99_target_met"] = row["from_ack_p99_ms"] is not None and row["from_ack_p99_ms"] <= TARGET_P99_MS
            rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], load: dict[str, Any]) -> None:
    cols = [("delay ms", "push_task_delay_ms"), ("transport", "transport"), ("p50 ack ms", "from_ack_p50_ms"),
            ("p99 ack ms", "from_ack_p99_ms"), ("p99 send ms", "from_send_p99_ms"), ("missed", "missed"),
            ("storm chg/s", "storm_changes_per_s"), ("pushes/chg", "storm_pushes_per_change"),
            ("CPU us/chg", "storm_cpu_us_per_change")]
    lines = ["  ".join(f"{title:>11}" for title, _ in cols)]
    for row in rows:
        lines.append("  ".join(f"{'-' if row.get(key) is None else row[key]!s:>11}" for _, key in cols))
    lines.append(f"medians over rounds; p99 target {TARGET_P99_MS} ms from the writer's ack; "
                 f"load average: start {load['start']}, end {load['end']}")
    common.log("\n" + "\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transports", default=",".join(common.TRANSPORTS),
                   help="comma list of native,grpcio (default both)")
    p.add_argument("--delays", default="default,0,2,5",
                   help="comma list of pushTaskDelay values in ms; 'default' = the node's own (default "
                        "default,0,2,5)")
    p.add_argument("--repeat", type=int, default=3, help="rounds, each over every transport and delay (default 3)")
    p.add_argument("--subscribers", type=int, default=1, help="subscriber connections in the quiet phase (default 1)")
    p.add_argument("--changes", type=int, default=200, help="measured changes in the quiet phase (default 200)")
    p.add_argument("--warmup", type=int, default=10, help="changes before the measured ones (default 10)")
    p.add_argument("--interval-ms", type=float, default=20.0, help="one quiet change every N ms (default 20)")
    p.add_argument("--settle-s", type=float, default=5.0, help="most seconds to wait for the last pushes (default 5)")
    p.add_argument("--storm-seconds", type=float, default=3.0, help="seconds of the storm phase; 0 = none (default 3)")
    p.add_argument("--storm-writers", type=int, default=32, help="writer connections in the storm (default 32)")
    p.add_argument("--storm-subscribers", type=int, default=10, help="subscribers in the storm (default 10)")
    p.add_argument("--server-arg", action="append", default=[], metavar="PROP=VALUE",
                   help="-D PROP=VALUE for the node (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=60.0, help="seconds for a node to be ready")
    common.add_output_args(p, "push_latency")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    transports = common.parse_transports(args.transports)
    delays = [d.strip() for d in args.delays.split(",") if d.strip()]
    if not delays or any(d != "default" and not (d.isdigit() and int(d) <= 10_000) for d in delays):
        raise SystemExit("--delays takes a comma list of 'default' and whole milliseconds 0..10000")
    if not (1 <= args.repeat <= 20 and 1 <= args.subscribers <= 1000 and 1 <= args.changes <= 100_000
            and args.interval_ms > 0 and 0 <= args.storm_seconds <= 600 and 1 <= args.storm_writers <= 1000
            and 1 <= args.storm_subscribers <= 1000):
        raise SystemExit("--repeat 1..20, --subscribers 1..1000, --changes 1..100000, --interval-ms > 0, "
                         "--storm-seconds 0..600, --storm-writers and --storm-subscribers 1..1000")
    common.install_signal_handlers()
    report: dict[str, Any] = {"benchmark": "push-latency", "host": common.host_info(),
                              "node_default_push_task_delay_ms": Config().push_task_delay_ms,
                              "settings": common.settings(args)}
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        root = common.work_root(stack, args.keep_logs)
        for r in range(args.repeat):
            common.log(f"round {r + 1}/{args.repeat}")
            for delay in delays:
                for transport in transports:
                    runs.append(run_one(args, transport, delay, root))
    report["runs"] = runs
    report["summary"] = summarise(runs, delays, transports)
    host = report["host"]
    host["loadavg_at_end"] = common.loadavg()
    print_table(report["summary"], {"start": host["loadavg_at_start"], "end": host["loadavg_at_end"]})
    common.save_report(report, args.out, "push_latency")
    return 0


if __name__ == "__main__":
    common.run_main(main)
