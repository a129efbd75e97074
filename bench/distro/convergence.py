"""Convergence latency of a three-node cluster: register on A → visible on B.

Starts three real `shoal server` processes on free 127.0.0.1 ports with ``--members`` and
default settings (only ports and data dirs are passed), waits until every node sees every
member UP, then opens on A one writer connection per instance (each registers exactly one
instance, as an application would) and on B a reader subscribed to every service plus a poller.
Instances are registered one at a time at a fixed pace; for each the clock starts just before
its InstanceRequest is written to A and stops

* **push**: when the NotifySubscriberRequest carrying it arrives on B's stream, and
* **poll**: when a ServiceQueryRequest answer from B first lists it (the answer's arrival:
  an upper bound; ``poll_rtt`` shows the resolution).

A subscriber on A itself gives ``local_push_on_a``: the same path without replication, so the
difference to ``push`` is what Distro adds.

Prints one JSON document: p50/p95/p99/max of both, register RTT on A, missed samples, the
target (p99 ≤ 100 ms) and whether it was met. Every loop is bounded in count and time; the
servers are always stopped.

    .venv/bin/python -m bench.distro.convergence              # 500 instances, 20 ms apart
    .venv/bin/python -m bench.distro.convergence --instances 2000 --interval-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

from bench.distro._common import (
    add_output_args,
    emit,
    gc_pauses,
    host_info,
    install_signal_handlers,
    log,
    run_main,
    server_options,
    summary_ms,
    work_root,
)
from bench.load import nacos_client
from shoal.testing import OPEN, ServerSet, free_port_block, poll_until

TARGET_P99_MS = 100.0


def instance_address(i: int) -> tuple[str, int]:
    """A distinct ip:port for registration ``i``."""
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 8000 + i % 1000


class Convergence:
    def __init__(self, args: argparse.Namespace, nc: Any) -> None:
        self.args = args
        self.nc = nc
        self.sent: dict[tuple[str, str, int], float] = {}  # (service, ip, port) → send time
        self.push_seen: dict[tuple[str, str, int], float] = {}
        self.local_seen: dict[tuple[str, str, int], float] = {}  # push on A's own subscriber
        self.poll_seen: dict[tuple[str, str, int], float] = {}
        self.poll_rtts: list[float] = []
        self.register_rtts: list[float] = []
        self.errors: dict[str, int] = {}
        self.pushes = 0

    def service_of(self, i: int) -> str:
        return f"conv-{i % self.args.services}"

    def key_of(self, i: int) -> tuple[str, str, int]:
        ip, port = instance_address(i)
        return self.service_of(i), ip, port

    # --- B side -------------------------------------------------------------------------------
    def on_push(self, conn: Any, received: float, info: dict[str, Any]) -> None:
        self.pushes += 1
        self._seen(self.push_seen, received, info)

    def on_local_push(self, conn: Any, received: float, info: dict[str, Any]) -> None:
        self._seen(self.local_seen, received, info)

    def _seen(self, seen: dict[tuple[str, str, int], float], received: float, info: dict[str, Any]) -> None:
        name = str(info.get("name", ""))
        service = name.rpartition("@@")[2] or name
        for host in info.get("hosts") or []:
            key = (service, str(host.get("ip")), int(host.get("port", 0)))
            if key in self.sent and key not in seen:
                seen[key] = received

    async def poller(self, conn: Any, stop: asyncio.Event) -> None:
        """Query B for every service that still has an instance the poll has not seen."""
        interval = self.args.poll_interval_ms / 1000
        while not stop.is_set():
            waiting = {k[0] for k in self.sent if k not in self.poll_seen}
            if not waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
                continue
            for service in sorted(waiting):
                t0 = time.time()
                try:
                    _, body = await conn.request("ServiceQueryRequest", self.nc.query_request(service), timeout_s=5)
                except Exception as exc:
                    self.errors[f"poll {type(exc).__name__}"] = self.errors.get(f"poll {type(exc).__name__}", 0) + 1
                    continue
                t1 = time.time()
                self.poll_rtts.append(t1 - t0)
                for host in (body.get("serviceInfo") or {}).get("hosts") or []:
                    key = (service, str(host.get("ip")), int(host.get("port", 0)))
                    if key in self.sent and key not in self.poll_seen:
                        self.poll_seen[key] = t1
            await asyncio.sleep(interval)

    # --- A side -------------------------------------------------------------------------------
    async def register(self, conn: Any, key: tuple[str, str, int]) -> None:
        service, ip, port = key
        body = self.nc.instance_request("registerInstance", service, self.nc.instance(ip, port))
        raw = json.dumps(body, separators=(",", ":"))
        t0 = time.time()
        self.sent[key] = t0
        try:
            await conn.call_ok("InstanceRequest", raw, timeout_s=5)
        except Exception as exc:
            self.errors[f"register {type(exc).__name__}"] = self.errors.get(f"register {type(exc).__name__}", 0) + 1
            del self.sent[key]
            return
        self.register_rtts.append(time.time() - t0)


async def open_connections(nc: Any, target: str, count: int, chunk: int = 50) -> list[Any]:
    conns: list[Any] = []
    try:
        for start in range(0, count, chunk):
            batch = [nc.NacosConnection(target) for _ in range(min(chunk, count - start))]
            results = await asyncio.gather(*(c.connect(10) for c in batch), return_exceptions=True)
            for conn, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    raise RuntimeError(f"connect to {target} failed: {result}")
                conns.append(conn)
    except BaseException:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        raise
    return conns


async def measure(args: argparse.Namespace, grpc_a: int, grpc_b: int) -> dict[str, Any]:
    nc = nacos_client
    bench = Convergence(args, nc)
    conns: list[Any] = []
    stop = asyncio.Event()
    poll_task: asyncio.Task[None] | None = None
    try:
        reader = nc.NacosConnection(f"127.0.0.1:{grpc_b}", on_push=bench.on_push)
        await reader.connect(10)
        conns.append(reader)
        poller = nc.NacosConnection(f"127.0.0.1:{grpc_b}")
        await poller.connect(10)
        conns.append(poller)
        local = nc.NacosConnection(f"127.0.0.1:{grpc_a}", on_push=bench.on_local_push)
        await local.connect(10)
        conns.append(local)
        for s in range(args.services):
            for subscriber in (reader, local):
                _, reply = await subscriber.request("SubscribeServiceRequest", nc.subscribe_request(f"conv-{s}"))
                if reply.get("resultCode") != 200:
                    raise RuntimeError(f"subscribe failed: {reply}")
        total = args.warmup + args.instances
        log(f"opening {total} writer connections on A")
        writers = await open_connections(nc, f"127.0.0.1:{grpc_a}", total)
        conns.extend(writers)
        poll_task = asyncio.create_task(bench.poller(poller, stop))

        interval = args.interval_ms / 1000
        log(f"registering {args.warmup} warm-up + {args.instances} measured instances, one every {args.interval_ms} ms")
        started = time.monotonic()
        deadline = started + args.max_seconds
        for i in range(total):
            if time.monotonic() > deadline:
                log("time budget spent: stopping the registrations early")
                break
            next_at = started + i * interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await bench.register(writers[i], bench.key_of(i))
        # let the last ones arrive, bounded
        settle_deadline = time.monotonic() + args.settle_s
        while time.monotonic() < settle_deadline:
            if all(k in bench.push_seen and k in bench.poll_seen for k in bench.sent):
                break
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        if poll_task is not None:
            poll_task.cancel()
            await asyncio.gather(poll_task, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    measured = [bench.key_of(i) for i in range(args.warmup, args.warmup + args.instances)]
    warm = [bench.key_of(i) for i in range(args.warmup)]

    def lat(seen: dict[tuple[str, str, int], float], keys: list[tuple[str, str, int]]) -> list[float]:
        return [seen[k] - bench.sent[k] for k in keys if k in seen and k in bench.sent]

    push = lat(bench.push_seen, measured)
    first = min((bench.sent[k] for k in measured if k in bench.sent), default=0.0)

    def ms(seen: dict[tuple[str, str, int], float], k: tuple[str, str, int]) -> float | None:
        return round((seen[k] - bench.sent[k]) * 1000, 1) if k in seen else None

    slowest = sorted((k for k in measured if k in bench.push_seen and k in bench.sent),
                     key=lambda k: bench.push_seen[k] - bench.sent[k], reverse=True)[:args.slowest]
    poll = lat(bench.poll_seen, measured)
    sent_measured = sum(1 for k in measured if k in bench.sent)
    return {
        "first_send_epoch": first,
        "registered": sent_measured,
        "elapsed_s": round(elapsed, 2),
        "push": {**summary_ms(push), "missed": sent_measured - len(push)},
        "poll": {**summary_ms(poll), "missed": sent_measured - len(poll)},
        "warmup_push": summary_ms(lat(bench.push_seen, warm)),
        "local_push_on_a": summary_ms(lat(bench.local_seen, measured)),
        "register_rtt_on_a": summary_ms(bench.register_rtts),
        "poll_rtt": summary_ms(bench.poll_rtts),
        "pushes_received_on_b": bench.pushes,
        # when the slowest happened (s after the first measured send) and what A's own subscriber saw:
        # a slow push on B with a slow local push on A is the host, not replication
        "slowest_push": [{"at_s": round(bench.sent[k] - first, 2), "push_ms": ms(bench.push_seen, k),
                          "local_push_on_a_ms": ms(bench.local_seen, k), "poll_ms": ms(bench.poll_seen, k)}
                         for k in slowest],
        "errors": bench.errors,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=500, help="measured registrations (default 500)")
    p.add_argument("--warmup", type=int, default=20, help="registrations before the measured ones (default 20)")
    p.add_argument("--services", type=int, default=10,
                   help="services the instances are spread over; B subscribes to all (default 10)")
    p.add_argument("--interval-ms", type=float, default=20.0, help="pace: one registration every N ms (default 20)")
    p.add_argument("--poll-interval-ms", type=float, default=5.0,
                   help="pause between polling sweeps of B (default 5)")
    p.add_argument("--settle-s", type=float, default=10.0, help="wait at most this long for the last ones (default 10)")
    p.add_argument("--gc-log", action="store_true",
                   help="diagnostic: run the servers through a wrapper that logs every GC pause >= 5 ms, and "
                        "report them on the same time axis as the slowest samples")
    p.add_argument("--slowest", type=int, default=10, help="list this many slowest samples (default 10)")
    p.add_argument("--max-seconds", type=float, default=300.0, help="time budget of the registration loop")
    p.add_argument("--startup-timeout", type=float, default=90.0, help="seconds for the cluster to form")
    add_output_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not (1 <= args.instances <= 20_000 and 0 <= args.warmup <= 1000 and args.services >= 1):
        raise SystemExit("--instances must be 1..20000, --warmup 0..1000, --services >= 1")
    install_signal_handlers()
    report: dict[str, Any] = {"benchmark": "distro-convergence", "host": host_info(),
                              "settings": {k: v for k, v in vars(args).items() if k != "keep_logs"}}
    with contextlib.ExitStack() as stack:
        root = work_root(stack, args.keep_logs)
        servers = stack.enter_context(ServerSet(root, auth=OPEN))
        ports: list[int] = []
        for _ in range(3):
            ports.append(free_port_block(avoid=ports))
        members = ",".join(f"127.0.0.1:{p}" for p in ports)
        nodes = [servers.start(p, ["--members", members], **server_options(args.gc_log)) for p in ports]
        for node in nodes:
            node.wait_ready(args.startup_timeout)

        def all_up() -> bool:
            for node in nodes:
                states = {m.get("address"): m.get("state") for m in node.members()}
                if len(states) != 3 or any(s != "UP" for s in states.values()):
                    return False
            return True

        poll_until(all_up, args.startup_timeout, 0.2, "every node to see every member UP")
        log(f"cluster up: {members}")
        a, b = nodes[0], nodes[1]
        report["cluster"] = {"a": a.addr, "b": b.addr, "c": nodes[2].addr}
        report["result"] = asyncio.run(measure(args, a.grpc_port, b.grpc_port))
        for node in nodes:
            node.check_alive()
        report["server_cpu_s"] = {name: n.cpu_s() for name, n in zip("abc", nodes, strict=True)}
        if args.gc_log:
            first = report["result"]["first_send_epoch"]
            report["gc_pauses_ms_during_measurement"] = {
                name: [{"at_s": round(t - first, 2), "gen": g, "ms": ms} for t, g, ms in gc_pauses(n, first)]
                for name, n in zip("abc", nodes, strict=True)}
        report["extensions_loaded"] = {name: n.extensions_loaded() for name, n in zip("abc", nodes, strict=True)}
    result = report["result"]
    report["targets"] = {
        "push_p99_ms": {"target": TARGET_P99_MS, "measured": result["push"]["p99_ms"],
                        "met": result["push"]["p99_ms"] is not None and result["push"]["p99_ms"] <= TARGET_P99_MS
                        and result["push"]["missed"] == 0},
        "poll_p99_ms": {"target": TARGET_P99_MS, "measured": result["poll"]["p99_ms"],
                        "met": result["poll"]["p99_ms"] is not None and result["poll"]["p99_ms"] <= TARGET_P99_MS
                        and result["poll"]["missed"] == 0},
    }
    emit(report)
    return 0


if __name__ == "__main__":
    run_main(main)
