"""Distro sync throughput of a three-node cluster, native cluster port against grpcio, side by side.

For each gRPC server transport (``shoal.remote.transport``: ``native`` and ``grpcio``, both gRPC
ports of every node) and each ``--repeat`` round, interleaved:

1. three real ``shoal server`` processes on free 127.0.0.1 ports (``--members``, default settings
   otherwise) until every node sees every member UP;
2. ``--generators`` processes open ``--connections`` SDK connections each to node A; every
   connection registers and deregisters its own instance in a closed loop (one request in flight)
   for ``--duration`` seconds: every acknowledged request changes one connection client, which A
   queues for both peers (changes of one client within ``sync.delayMs`` merge into one record);
3. meanwhile this process scrapes A, B and C's Prometheus page every ``--scrape-interval`` s
   (``shoal_distro_sync_records_total`` on A, ``shoal_distro_sync_{received_batches,
   received_records,applied_records}_total`` on B and C) and a probe connection on A registers
   a fresh instance every ``--probe-interval-ms`` while pollers on B and C query the probe service
   back to back: **convergence lag** = first answer on B (C) listing it − A's ack;
4. after the load, until A's sync queues are empty (bounded), the totals are read once more.

Figures per round: SDK ops acknowledged by A per second; per peer the client records received
and applied per second (over the load window, and in total until drained), batches per second,
mean records per batch (and the spread of the per-interval means); A's CPU per acknowledged op
and per record synced; each peer's CPU per record received; convergence lag p50/p99 on B and C.
With ``--baseline`` (default) the same load also runs against a standalone node on the same
transport, so ``a_replication_cpu_us_per_op`` (cluster A minus standalone, per op) isolates what
Distro costs the owner. The summary holds the median over the rounds per transport, and the
native / grpcio ratios. The peers' *client* side is the node's default in both columns
(``shoal.cluster.client.transport``: native when built; ``--server-arg`` chooses); the transport
switch changes the cluster port's (and the SDK port's) server side.

Prints a table on stderr and one JSON document on stdout, and saves it under ``bench/results/``
(ignored by git) unless ``--out`` names another file.

    .venv/bin/python -m bench.distro.sync_throughput                     # 3 rounds x 2 transports, 10 s each
    .venv/bin/python -m bench.distro.sync_throughput --repeat 1 --duration 5 --no-baseline   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.distro._common import (
    TRANSPORTS,
    add_output_args,
    host_info,
    install_signal_handlers,
    loadavg,
    log,
    median,
    parse_transports,
    run_main,
    save_report,
    server_options,
    settings,
    stop_processes,
    summary_ms,
    work_root,
)
from bench.load import nacos_client
from shoal.testing import OPEN, ServerProcess, ServerSet, free_port_block, poll_until
from shoal.testing.procs import metric_sum

PROBE_SERVICE = "sync-probe"


#: Runs ``shoal`` as ``python -m shoal`` would, after ``sys.setswitchinterval(<argv[1]> ms)``: a
#: diagnostic for how long the loop's thread holds the GIL against grpc.aio's own threads.
SWITCH_INTERVAL_ENTRY = """
import runpy, sys
sys.setswitchinterval(float(sys.argv.pop(1)) / 1000)
sys.argv[0] = "shoal"
runpy.run_module("shoal", run_name="__main__", alter_sys=True)
"""


# --- the load generator (a process of its own) ----------------------------------------------
def generator_main(index: int, target: str, connections: int, services: int, go: Any, stop_at: Any,
                   results: Any) -> None:
    """One generator process: ``connections`` connections to ``target``, each registering and
    deregistering its own instance back to back once ``go`` is set, until ``stop_at`` (epoch s)."""
    try:
        results.put(("ok", index, asyncio.run(_generate(index, target, connections, services, go, stop_at, results))))
    except BaseException as exc:  # reported to the parent, which stops the run
        results.put(("error", index, f"{type(exc).__name__}: {exc}"))


async def _generate(index: int, target: str, connections: int, services: int, go: Any, stop_at: Any,
                    results: Any) -> dict[str, Any]:
    nc = nacos_client
    conns: list[Any] = []
    try:
        for start in range(0, connections, 50):
            batch = [nc.NacosConnection(target) for _ in range(min(50, connections - start))]
            outcome = await asyncio.gather(*(c.connect(10) for c in batch), return_exceptions=True)
            conns.extend(c for c, r in zip(batch, outcome, strict=True) if not isinstance(r, BaseException))
            failed = [r for r in outcome if isinstance(r, BaseException)]
            if failed:
                raise RuntimeError(f"{len(failed)} connections to {target} failed: {failed[0]}")
        results.put(("ready", index, len(conns)))
        while not go.is_set():  # the parent snapshots the counters, then sets go
            await asyncio.sleep(0.01)
        deadline = stop_at.value
        acked = 0
        errors: dict[str, int] = {}
        c0 = time.process_time()

        async def lane(ci: int, conn: Any) -> None:
            nonlocal acked
            g = index * connections + ci
            service = f"sync-{g % services:05d}"
            inst = nc.instance(f"10.{(g >> 16) & 255}.{(g >> 8) & 255}.{g & 255}", 8080)
            bodies = [json.dumps(nc.instance_request(kind, service, inst), separators=(",", ":"))
                      for kind in ("registerInstance", "deregisterInstance")]
            turn = 0
            while time.time() < deadline:
                try:
                    await conn.call_ok("InstanceRequest", bodies[turn], timeout_s=10)
                    acked += 1
                    turn ^= 1
                except Exception as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    await asyncio.sleep(0.05)

        t0 = time.time()
        await asyncio.gather(*(lane(i, c) for i, c in enumerate(conns)))
        return {"acked": acked, "errors": errors, "wall_s": time.time() - t0,
                "cpu_s": time.process_time() - c0, "connections": len(conns)}
    finally:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


# --- counters -------------------------------------------------------------------------------
def scrape(a: ServerProcess, peers: list[ServerProcess]) -> dict[str, Any]:
    """The sync counters of A and its peers, and every node's CPU seconds, at one moment."""
    now = time.time()
    text_a = a.prometheus()
    out: dict[str, Any] = {"t": now, "a_cpu_s": a.cpu_s(),
                           "a_queue": metric_sum(text_a, "shoal_distro_sync_queue_depth"), "peers": {}}
    for peer in peers:
        text = peer.prometheus()
        out["peers"][peer.addr] = {
            "sent_records": metric_sum(text_a, "shoal_distro_sync_records_total", peer=peer.addr),
            "sent_batches": metric_sum(text_a, "shoal_distro_sync_batches_total", peer=peer.addr, result="success"),
            "failed_batches": metric_sum(text_a, "shoal_distro_sync_batches_total", peer=peer.addr, result="failed"),
            "batches": metric_sum(text, "shoal_distro_sync_received_batches_total", peer=a.addr),
            "records": metric_sum(text, "shoal_distro_sync_received_records_total", peer=a.addr),
            "applied": metric_sum(text, "shoal_distro_sync_applied_records_total", peer=a.addr),
            # the peer's own handling time of sync requests (the cluster port's request timer)
            "handled": metric_sum(text, "grpc_server_requests_seconds_count", requestClass="DistroSyncRequest"),
            "handled_s": metric_sum(text, "grpc_server_requests_seconds_sum", requestClass="DistroSyncRequest"),
            "cpu_s": peer.cpu_s(),
        }
    return out


def delta(later: dict[str, Any], earlier: dict[str, Any], peer: str, key: str) -> float:
    return float(later["peers"][peer][key] - earlier["peers"][peer][key])


# --- convergence lag probe --------------------------------------------------------------------
class LagProbe:
    """Registers a fresh probe instance on A every interval; pollers on the peers record when each
    first shows up there. One probe connection: a new registration replaces its previous instance."""

    def __init__(self, interval_s: float, poll_interval_s: float) -> None:
        self.interval_s = interval_s
        self.poll_interval_s = poll_interval_s
        self.sent: dict[int, float] = {}  # port → send time
        self.acked: dict[int, float] = {}  # port → ack time
        self.seen: dict[str, dict[int, float]] = {}  # peer → port → first answer listing it
        self.poll_rtts: list[float] = []
        self.errors: dict[str, int] = {}

    def _error(self, what: str, exc: BaseException) -> None:
        key = f"{what} {type(exc).__name__}"
        self.errors[key] = self.errors.get(key, 0) + 1

    async def write(self, conn: Any, stop_at: float) -> None:
        nc = nacos_client
        port = 1
        while time.time() < stop_at:
            body = json.dumps(nc.instance_request("registerInstance", PROBE_SERVICE, nc.instance("10.250.0.1", port)),
                              separators=(",", ":"))
            t0 = time.time()
            self.sent[port] = t0
            try:
                await conn.call_ok("InstanceRequest", body, timeout_s=10)
                self.acked[port] = time.time()
            except Exception as exc:
                self._error("probe", exc)
            port += 1
            await asyncio.sleep(max(0.0, t0 + self.interval_s - time.time()))

    async def poll(self, peer: str, conn: Any, stop: asyncio.Event) -> None:
        seen = self.seen.setdefault(peer, {})
        body = json.dumps(nacos_client.query_request(PROBE_SERVICE), separators=(",", ":"))
        while not stop.is_set():
            if all(p in seen for p in self.sent):
                await asyncio.sleep(0.001)
                continue
            t0 = time.time()
            try:
                _, answer = await conn.request_json("ServiceQueryRequest", body, timeout_s=10)
            except Exception as exc:
                self._error(f"poll {peer}", exc)
                await asyncio.sleep(0.05)
                continue
            t1 = time.time()
            self.poll_rtts.append(t1 - t0)
            for host in (answer.get("serviceInfo") or {}).get("hosts") or []:
                port = int(host.get("port", 0))
                if port in self.sent and port not in seen:
                    seen[port] = t1
                    # a later registration replaced the earlier ones: they were visible no later
                    for earlier in self.sent:
                        if earlier < port and earlier not in seen:
                            seen[earlier] = t1
            await asyncio.sleep(self.poll_interval_s)  # the resolution: poll_rtt + this

    def lags(self, peer: str) -> list[float]:
        seen = self.seen.get(peer, {})
        return [seen[p] - self.acked[p] for p in self.acked if p in seen]


# --- one round ----------------------------------------------------------------------------------
def start_nodes(servers: ServerSet, transport: str, count: int, args: argparse.Namespace) -> list[ServerProcess]:
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port_block(avoid=[*ports, *(s.port for s in servers.servers)]))
    extra = ["--log-level", "warning", "-D", f"shoal.remote.transport={transport}"]
    for setting in args.server_arg:
        extra += ["-D", setting]
    if count > 1:
        extra += ["--members", ",".join(f"127.0.0.1:{p}" for p in ports)]
    options = server_options()
    if args.switch_interval_ms is not None:
        options["entry"] = ["-c", SWITCH_INTERVAL_ENTRY, str(args.switch_interval_ms)]
    nodes = [servers.start(p, extra, **options) for p in ports]
    for node in nodes:
        node.wait_ready(args.startup_timeout)
    if count > 1:
        def all_up() -> bool:
            for node in nodes:
                states = {m.get("address"): m.get("state") for m in node.members()}
                if len(states) != count or any(s != "UP" for s in states.values()):
                    return False
            return True

        poll_until(all_up, args.startup_timeout, 0.2, "every node to see every member UP")
    return nodes


def run_generators(args: argparse.Namespace, target: str, during: Callable[[float], Any],
                   before_go: Callable[[], Any]) -> tuple[list[dict[str, Any]], Any, Any]:
    """Start the generator processes, wait until connected, call ``before_go()``, let them load
    for ``--duration`` s while ``during(stop_at)`` runs here, and collect their results."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold grpc state
    go = ctx.Event()
    stop_at = ctx.Value("d", 0.0)
    results = ctx.Queue()
    procs = [ctx.Process(target=generator_main, daemon=True, name=f"sync-gen-{i}",
                         args=(i, target, args.connections, args.services, go, stop_at, results))
             for i in range(args.generators)]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + args.startup_timeout
        ready = 0
        while ready < len(procs):
            kind, index, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "error":
                raise RuntimeError(f"generator {index}: {value}")
            ready += kind == "ready"
        before = before_go()
        stop_at.value = time.time() + args.duration
        go.set()
        during_result = during(stop_at.value)
        out: list[dict[str, Any]] = []
        while len(out) < len(procs):
            kind, index, value = results.get(timeout=args.duration + 60)
            if kind == "error":
                raise RuntimeError(f"generator {index}: {value}")
            out.append(value)
        return out, before, during_result
    finally:
        stop_processes(procs)


def cluster_round(args: argparse.Namespace, transport: str, root: Path) -> dict[str, Any]:
    with ServerSet(root / f"cluster-{transport}-{time.monotonic_ns()}", auth=OPEN) as servers:
        a, b, c = start_nodes(servers, transport, 3, args)
        peers = [b, c]
        log(f"{transport}: cluster up ({a.addr}, {b.addr}, {c.addr}); loading A for {args.duration} s")
        samples: list[dict[str, Any]] = []
        probe = LagProbe(args.probe_interval_ms / 1000, args.poll_interval_ms / 1000)

        async def observe(stop_at: float) -> None:
            nc = nacos_client
            conns = [nc.NacosConnection(f"127.0.0.1:{n.grpc_port}") for n in (a, b, c)]
            stop = asyncio.Event()
            try:
                await asyncio.gather(*(conn.connect(10) for conn in conns))
                pollers = [asyncio.create_task(probe.poll(n.addr, conn, stop)) for n, conn in zip(peers, conns[1:],
                                                                                                  strict=True)]
                writer = asyncio.create_task(probe.write(conns[0], stop_at))
                while time.time() < stop_at:
                    await asyncio.sleep(args.scrape_interval)
                    samples.append(await asyncio.to_thread(scrape, a, peers))
                await writer
                # the last probes: until both peers saw every acked one, bounded
                settle = time.monotonic() + args.settle_s
                while time.monotonic() < settle and not all(
                        p in probe.seen.get(n.addr, {}) for n in peers for p in probe.acked):
                    await asyncio.sleep(0.01)
                stop.set()
                await asyncio.gather(*pollers)
            finally:
                stop.set()
                await asyncio.gather(*(conn.close() for conn in conns), return_exceptions=True)

        gens, first, _ = run_generators(args, f"127.0.0.1:{a.grpc_port}", lambda t: asyncio.run(observe(t)),
                                        lambda: scrape(a, peers))
        loaded = samples[-1] if samples else scrape(a, peers)
        # drained: A's queues empty and every peer holds what A sent
        def drained() -> bool:
            s = scrape(a, peers)
            return s["a_queue"] == 0 and all(p["records"] >= p["sent_records"] for p in s["peers"].values())

        t_load_end = time.time()
        with contextlib.suppress(TimeoutError):
            poll_until(drained, args.settle_s, 0.1, "A's sync queues to drain")
        last = scrape(a, peers)
        for node in (a, b, c):
            node.check_alive()
        return summarise_cluster(args, transport, gens, first, samples, loaded, last, probe,
                                 last["t"] - t_load_end, peers)


def summarise_cluster(args: argparse.Namespace, transport: str, gens: list[dict[str, Any]], first: dict[str, Any],
                      samples: list[dict[str, Any]], loaded: dict[str, Any], last: dict[str, Any], probe: LagProbe,
                      drain_s: float, peers: list[ServerProcess]) -> dict[str, Any]:
    acked = sum(g["acked"] for g in gens)
    wall = max(g["wall_s"] for g in gens)
    load_s = loaded["t"] - first["t"]
    a_cpu = (last["a_cpu_s"] or 0.0) - (first["a_cpu_s"] or 0.0)
    records_all = 0.0
    per_peer: dict[str, Any] = {}
    for name, peer in zip("bc", peers, strict=True):
        addr = peer.addr
        records = delta(last, first, addr, "records")
        records_all += records
        batches = delta(last, first, addr, "batches")
        interval_means = []
        prev = first
        for s in samples:
            nb = delta(s, prev, addr, "batches")
            if nb:
                interval_means.append(delta(s, prev, addr, "records") / nb)
            prev = s
        peer_cpu = (last["peers"][addr]["cpu_s"] or 0.0) - (first["peers"][addr]["cpu_s"] or 0.0)
        handled = delta(loaded, first, addr, "handled")
        batches_load = delta(loaded, first, addr, "batches")
        per_peer[name] = {
            "records_per_s_during_load": round(delta(loaded, first, addr, "records") / load_s, 1) if load_s else None,
            "applied_per_s_during_load": round(delta(loaded, first, addr, "applied") / load_s, 1) if load_s else None,
            "batches_per_s_during_load": round(delta(loaded, first, addr, "batches") / load_s, 1) if load_s else None,
            "records_total": int(records),
            "applied_total": int(delta(last, first, addr, "applied")),
            "batches_total": int(batches),
            "failed_batches_on_a": int(delta(last, first, addr, "failed_batches")),
            "records_per_batch_mean": round(records / batches, 1) if batches else None,
            "records_per_batch_interval_min": round(min(interval_means), 1) if interval_means else None,
            "records_per_batch_interval_max": round(max(interval_means), 1) if interval_means else None,
            "cpu_us_per_record_received": round(peer_cpu / records * 1e6, 1) if records else None,
            # one batch's cycle on A's worker (send → answer → next) against the peer's own handling time
            "batch_cycle_ms_during_load": round(load_s / batches_load * 1000, 2) if batches_load else None,
            "handling_ms_per_batch_on_peer": round(delta(loaded, first, addr, "handled_s") / handled * 1000, 2)
            if handled else None,
            "cpu_utilisation": round(peer_cpu / (last["t"] - first["t"]), 3),
            "lag_ack_to_visible": summary_ms(probe.lags(addr)),
        }
    return {
        "transport": transport,
        "generators": len(gens),
        "connections": sum(g["connections"] for g in gens),
        "a_ops_acked": acked,
        "a_ops_per_s": round(acked / wall, 1) if wall else None,
        "generator_errors": {k: v for g in gens for k, v in g["errors"].items()},
        "generator_cpu_s": round(sum(g["cpu_s"] for g in gens), 2),
        "a_cpu_s": round(a_cpu, 2),
        "a_cpu_utilisation": round(a_cpu / (last["t"] - first["t"]), 3),
        "a_cpu_us_per_op": round(a_cpu / acked * 1e6, 1) if acked else None,
        "a_cpu_us_per_synced_record": round(a_cpu / records_all * 1e6, 1) if records_all else None,
        "drain_s": round(drain_s, 2),
        "peers": per_peer,
        "probe": {"sent": len(probe.sent), "acked": len(probe.acked), "poll_rtt": summary_ms(probe.poll_rtts),
                  "errors": probe.errors},
    }


def baseline_round(args: argparse.Namespace, transport: str, root: Path) -> dict[str, Any]:
    """The same load against one standalone node: what the SDK requests alone cost A."""
    with ServerSet(root / f"alone-{transport}-{time.monotonic_ns()}", auth=OPEN) as servers:
        [node] = start_nodes(servers, transport, 1, args)
        log(f"{transport}: standalone baseline, {args.duration} s")
        cpu: dict[str, float] = {}

        def before() -> None:
            cpu["start"] = node.cpu_s() or 0.0

        def wait(stop_at: float) -> None:
            time.sleep(max(0.0, stop_at - time.time()))

        gens, _, _ = run_generators(args, f"127.0.0.1:{node.grpc_port}", wait, before)
        cpu["end"] = node.cpu_s() or 0.0
        node.check_alive()
    acked = sum(g["acked"] for g in gens)
    wall = max(g["wall_s"] for g in gens)
    used = cpu["end"] - cpu["start"]
    return {"transport": transport, "ops_acked": acked, "ops_per_s": round(acked / wall, 1) if wall else None,
            "cpu_us_per_op": round(used / acked * 1e6, 1) if acked else None}


# --- summary ------------------------------------------------------------------------------------
#: (row name, how to read it from one cluster round)
ROWS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("A SDK ops acked /s", lambda r: r["a_ops_per_s"]),
    ("B records received /s", lambda r: r["peers"]["b"]["records_per_s_during_load"]),
    ("C records received /s", lambda r: r["peers"]["c"]["records_per_s_during_load"]),
    ("B client changes applied /s", lambda r: r["peers"]["b"]["applied_per_s_during_load"]),
    ("B batches /s", lambda r: r["peers"]["b"]["batches_per_s_during_load"]),
    ("B records per batch (mean)", lambda r: r["peers"]["b"]["records_per_batch_mean"]),
    ("A CPU us per SDK op", lambda r: r["a_cpu_us_per_op"]),
    ("A CPU us per synced record", lambda r: r["a_cpu_us_per_synced_record"]),
    ("A replication CPU us per op", lambda r: r.get("a_replication_cpu_us_per_op")),
    ("B CPU us per record received", lambda r: r["peers"]["b"]["cpu_us_per_record_received"]),
    ("B batch cycle on A's worker ms", lambda r: r["peers"]["b"]["batch_cycle_ms_during_load"]),
    ("B handling per batch ms", lambda r: r["peers"]["b"]["handling_ms_per_batch_on_peer"]),
    ("lag A ack -> B p50 ms", lambda r: r["peers"]["b"]["lag_ack_to_visible"]["p50_ms"]),
    ("lag A ack -> B p99 ms", lambda r: r["peers"]["b"]["lag_ack_to_visible"]["p99_ms"]),
    ("lag A ack -> C p99 ms", lambda r: r["peers"]["c"]["lag_ack_to_visible"]["p99_ms"]),
    ("drain after load s", lambda r: r["drain_s"]),
]


def summarise(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for name, read in ROWS:
        row: dict[str, Any] = {t: median([read(r) for r in rounds.get(t, [])]) for t in TRANSPORTS}
        n, g = row.get("native"), row.get("grpcio")
        row["native/grpcio"] = round(n / g, 2) if n is not None and g else None
        table[name] = row
    return table


def print_table(table: dict[str, dict[str, Any]], load: dict[str, Any]) -> None:
    width = max(len(n) for n in table)
    lines = [f"{'median over rounds':<{width}}  {'native':>10}  {'grpcio':>10}  {'native/grpcio':>13}"]
    for name, row in table.items():
        cells = ["-" if row[k] is None else f"{row[k]:,}" for k in ("native", "grpcio", "native/grpcio")]
        lines.append(f"{name:<{width}}  {cells[0]:>10}  {cells[1]:>10}  {cells[2]:>13}")
    lines.append(f"load average: start {load['start']}, end {load['end']}")
    log("\n" + "\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transports", default=",".join(TRANSPORTS), help="comma list of native,grpcio (default both)")
    p.add_argument("--repeat", type=int, default=3, help="rounds per transport, interleaved (default 3)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load per round (default 10)")
    p.add_argument("--generators", type=int, default=1, help="generator processes (default 1: 2-core box)")
    p.add_argument("--connections", type=int, default=64, help="connections per generator (default 64)")
    p.add_argument("--services", type=int, default=100, help="services the instances are spread over (default 100)")
    p.add_argument("--probe-interval-ms", type=float, default=50.0,
                   help="one probe registration on A every N ms for the lag (default 50)")
    p.add_argument("--poll-interval-ms", type=float, default=5.0,
                   help="pause between the peers' probe queries while a probe is unseen (default 5; the lag's "
                        "resolution is this plus the query's round trip, and B's CPU pays for the polls)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between counter scrapes (default 1)")
    p.add_argument("--settle-s", type=float, default=20.0, help="most seconds to wait for the drain (default 20)")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the load against a standalone node per transport and round (default on)")
    p.add_argument("--server-arg", action="append", default=[], metavar="PROP=VALUE",
                   help="-D PROP=VALUE for every node (repeatable)")
    p.add_argument("--switch-interval-ms", type=float, default=None,
                   help="diagnostic: start every node with sys.setswitchinterval(N ms) (Python's default: 5)")
    p.add_argument("--startup-timeout", type=float, default=90.0, help="seconds for a cluster to form")
    add_output_args(p, "sync_throughput")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    transports = parse_transports(args.transports)
    if not (1 <= args.repeat <= 20 and 0.5 <= args.duration <= 600 and 1 <= args.generators <= 16
            and 1 <= args.connections <= 2000 and args.services >= 1 and args.probe_interval_ms >= 5):
        raise SystemExit("--repeat 1..20, --duration 0.5..600, --generators 1..16, --connections 1..2000, "
                         "--services >= 1, --probe-interval-ms >= 5")
    install_signal_handlers()
    report: dict[str, Any] = {"benchmark": "distro-sync-throughput", "host": host_info(),
                              "settings": settings(args)}
    rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in transports}
    with contextlib.ExitStack() as stack:
        root = work_root(stack, args.keep_logs)
        for r in range(args.repeat):
            for transport in transports:
                log(f"round {r + 1}/{args.repeat}, {transport}")
                result = cluster_round(args, transport, root)
                if args.baseline:
                    base = baseline_round(args, transport, root)
                    result["standalone"] = base
                    if base["cpu_us_per_op"] is not None and result["a_cpu_us_per_op"] is not None:
                        result["a_replication_cpu_us_per_op"] = round(
                            result["a_cpu_us_per_op"] - base["cpu_us_per_op"], 1)
                result["loadavg"] = loadavg()
                rounds[transport].append(result)
    report["rounds"] = rounds
    report["summary"] = summarise(rounds)
    report["host"]["loadavg_at_end"] = loadavg()
    host = report["host"]
    print_table(report["summary"], {"start": host["loadavg_at_start"], "end": host["loadavg_at_end"]})
    save_report(report, args.out, "sync_throughput")
    return 0


if __name__ == "__main__":
    run_main(main)
