"""Distro-call throughput and CPU per call of the two peer clients, side by side in one run.

The clients (``shoal.cluster.client.transport``): **native** (``NativePeerTransport``, libnghttp2
in ``shoal._ext.h2client``) and **grpcio** (``GrpcPeerTransport``, grpc.aio). Each calls the same
cluster port: a real ``ClusterServer`` (``shoal.testing.peers.ClusterPort``) in a child process,
whose dispatch answers at once (``DistroDataResponse``, as a sync batch's ack), on each server
transport (``--servers``, default both). The client runs in this process on uvloop, as a node does.

A round: ``--concurrency`` callers, each a closed loop (one call in flight), call for
``--duration`` s with a body of ``--body-bytes`` (a mid-sized sync batch) after one second of
warm-up on a fresh client. Figures per round: calls per second; the client's and the server's
CPU per call (µs, process CPU time over the window / calls); call latency p50 and p99. Rounds
are interleaved (client, server, concurrency) ``--repeat`` times; the summary is the median per
cell, with the native / grpcio ratios, and the load average before and after.

    flock /tmp/shoal-heavy.lock .venv/bin/python -m bench.distro.peer_client            # 3 x 5 s per cell
    flock /tmp/shoal-heavy.lock .venv/bin/python -m bench.distro.peer_client --repeat 1 --duration 2
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from multiprocessing.connection import Connection
from typing import Any

import uvloop

from bench.distro._common import host_info, loadavg, log, median, percentile, run_main, save_report
from shoal.testing.peers import CLUSTER_OFFSET, ClusterPort
from shoal.transport.grpc.native_peer_client import NativePeerTransport
from shoal.transport.grpc.peer_client import GrpcPeerTransport

CLIENTS = ("native", "grpcio")
SELF = "127.0.0.1:18848"
ANSWER = b'{"resultCode":200}'


def _serve(transport: str, pipe: Connection) -> None:
    """The child: one cluster port answering every call at once, until the parent says stop."""

    async def dispatch(sender: str, type_name: str, body: bytes) -> tuple[str, bytes]:
        return "DistroDataResponse", ANSWER

    async def main() -> None:
        port = await ClusterPort(dispatch, transport).start()
        pipe.send(port.address)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, pipe.recv)
        await port.stop()

    uvloop.run(main())


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(name: str) -> Any:
    return (NativePeerTransport if name == "native" else GrpcPeerTransport)(SELF, CLUSTER_OFFSET)


async def _round(client_name: str, address: str, server_pid: int, concurrency: int, duration: float,
                 body: bytes) -> dict[str, Any]:
    client = _client(client_name)
    latencies: list[float] = []
    calls = 0
    stop_at = 0.0

    async def caller(record: bool) -> None:
        nonlocal calls
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await client.call(address, "DistroDataRequest", body, 5000)
            if record:
                latencies.append(time.perf_counter() - started)
                calls += 1

    try:
        stop_at = time.perf_counter() + 1.0  # warm-up: connection made, caches warm
        await asyncio.gather(*(caller(False) for _ in range(concurrency)))
        cpu0, server0 = time.process_time(), _process_cpu(server_pid)
        started = time.perf_counter()
        stop_at = started + duration
        await asyncio.gather(*(caller(True) for _ in range(concurrency)))
        wall = time.perf_counter() - started
        cpu1, server1 = time.process_time(), _process_cpu(server_pid)
    finally:
        await client.close()
    latencies.sort()
    server_cpu = server1 - server0
    return {"calls_per_s": round(calls / wall), "client_cpu_us_per_call": round((cpu1 - cpu0) / calls * 1e6, 1),
            "server_cpu_us_per_call": round(server_cpu / calls * 1e6, 1),
            "p50_ms": round((percentile(latencies, 0.5) or 0) * 1000, 3),
            "p99_ms": round((percentile(latencies, 0.99) or 0) * 1000, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="native,grpcio", help="server transports of the cluster port")
    parser.add_argument("--concurrency", default="1,64", help="callers in flight, comma-separated")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per round")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--body-bytes", type=int, default=600)
    parser.add_argument("--out", help="write the JSON here (default bench/results/peer_client-<time>.json)")
    args = parser.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    body = bytes(range(256)) * (args.body_bytes // 256) + b"x" * (args.body_bytes % 256)
    report: dict[str, Any] = {"bench": "peer_client", "host": host_info(),
                              "settings": {**vars(args), "servers": servers, "concurrency": levels}}
    ctx = multiprocessing.get_context("spawn")
    children: dict[str, tuple[Any, Connection, str]] = {}
    rounds: dict[str, list[dict[str, Any]]] = {}
    try:
        for name in servers:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(name, child), daemon=True)
            proc.start()
            if not parent.poll(30):
                raise RuntimeError(f"the {name} cluster port did not start")
            children[name] = (proc, parent, parent.recv())
        for r in range(args.repeat):
            for concurrency in levels:
                for server in servers:
                    proc, _, address = children[server]
                    for client in CLIENTS:
                        figures = uvloop.run(_round(client, address, proc.pid, concurrency,
                                                    args.duration, body))
                        key = f"server={server} client={client} concurrency={concurrency}"
                        rounds.setdefault(key, []).append(figures)
                        log(f"round {r + 1}: {key}: {figures}")
    finally:
        for proc, pipe, _ in children.values():
            pipe.send("stop")
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    summary: dict[str, Any] = {}
    for key, values in rounds.items():
        summary[key] = {name: median([v[name] for v in values]) for name in values[0]}
    ratios: dict[str, Any] = {}
    for concurrency in levels:
        for server in servers:
            native = summary[f"server={server} client=native concurrency={concurrency}"]
            grpcio = summary[f"server={server} client=grpcio concurrency={concurrency}"]
            ratios[f"server={server} concurrency={concurrency}"] = {
                "calls_per_s": round(native["calls_per_s"] / grpcio["calls_per_s"], 2),
                "client_cpu_per_call": round(native["client_cpu_us_per_call"] / grpcio["client_cpu_us_per_call"], 2),
            }
    report.update(rounds=rounds, median=summary, native_over_grpcio=ratios, loadavg_at_end=loadavg())
    log(f"{'cell':<45} {'calls/s':>9} {'client µs':>10} {'server µs':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for key, m in summary.items():
        log(f"{key:<45} {m['calls_per_s']:>9} {m['client_cpu_us_per_call']:>10} {m['server_cpu_us_per_call']:>10} "
            f"{m['p50_ms']:>8} {m['p99_ms']:>8}")
    log(f"load average at start {report['host']['loadavg_at_start']}, at end {report['loadavg_at_end']}")
    save_report(report, args.out, "peer_client")
    return 0


if __name__ == "__main__":
    run_main(main)
