"""HTTP Open API load generator for a Shoal node: register, beat and list rates, and the server's
CPU-seconds per 1,000 operations.

    python bench/load/http_load.py                       # starts a server, runs every phase
    python bench/load/http_load.py --instances 20000 --beat-rounds 5 --workers 1 --out /tmp/http.json
    python bench/load/http_load.py --addr 127.0.0.1:8848 --server-pid 1234

It starts `shoal server` itself on a free 127.0.0.1 port (temp data dir; stopped at the end, also on
errors) unless --addr names a running node, then runs the phases in order and prints one JSON
document. All traffic goes to 127.0.0.1 (or --addr); every phase is bounded in count.

phases
  register    POST /nacos/v1/ns/instance: --instances instances (ip 10.x.y.z, port 8080, 2 metadata
              keys, the 1.x SDK's parameters in the query string) spread over --services services.
  beat        PUT /nacos/v1/ns/instance/beat, --beat-rounds rounds over every instance, as *light*
              beats (ip/port only: what Nacos 1.x clients send once the server says
              lightBeatEnabled), then one round of *full* beats carrying the ``beat`` JSON (what the
              Python 1.x SDK always sends).
  list        GET /nacos/v1/ns/instance/list, --list-rounds rounds over every service.

The generator is a raw HTTP/1.1 client on uvloop (pre-built requests, --window requests pipelined
per keep-alive connection, --connections connections per worker, --workers processes), so its own
CPU stays small next to the server's on a 2-core box. Server CPU is utime+stime of the server
process from /proc/<pid>/stat just before and after each phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shoal.testing import OPEN

CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET_BEATS_PER_CPU_S = 20_000.0


# --- requests ------------------------------------------------------------------------------------
def instance(i: int) -> tuple[str, int]:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 8080


def request_bytes(method: str, path: str, params: dict[str, str], host: str) -> bytes:
    query = urllib.parse.urlencode(params)
    return (f"{method} {path}?{query} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: shoal-http-load\r\n"
            f"Content-Length: 0\r\n\r\n").encode()


def phase_requests(phase: str, indices: Iterable[int], instances: int, services: int, host: str) -> list[bytes]:
    out: list[bytes] = []
    for n in indices:
        i = n % instances
        ip, port = instance(i)
        svc = f"svc-{i % services}"
        if phase == "register":
            out.append(request_bytes("POST", "/nacos/v1/ns/instance", {
                "serviceName": svc, "groupName": "DEFAULT_GROUP", "ip": ip, "port": str(port), "weight": "1.0",
                "enable": "True", "healthy": "True", "ephemeral": "True", "clusterName": "DEFAULT",
                "metadata": json.dumps({"version": "1.0", "zone": f"z{i % 3}"})}, host))
        elif phase == "beat":
            out.append(request_bytes("PUT", "/nacos/v1/ns/instance/beat", {
                "serviceName": f"DEFAULT_GROUP@@{svc}", "ip": ip, "port": str(port)}, host))
        elif phase == "beat-full":
            beat = {"serviceName": f"DEFAULT_GROUP@@{svc}", "ip": ip, "port": port, "weight": 1.0,
                    "ephemeral": True, "cluster": "DEFAULT", "metadata": {"version": "1.0", "zone": f"z{i % 3}"}}
            out.append(request_bytes("PUT", "/nacos/v1/ns/instance/beat", {
                "serviceName": f"DEFAULT_GROUP@@{svc}", "beat": json.dumps(beat), "groupName": "DEFAULT_GROUP"}, host))
        elif phase == "list":
            out.append(request_bytes("GET", "/nacos/v1/ns/instance/list", {
                "serviceName": f"svc-{n % services}", "healthyOnly": "false"}, host))
        else:
            raise ValueError(phase)
    return out


# --- the worker: pipelined keep-alive connections -------------------------------------------------
async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        if line[:15].lower() == b"content-length:":
            length = int(line[15:].strip())
    return status, await reader.readexactly(length) if length else b""


async def _connection(host: str, port: int, requests: list[bytes], window: int, check: bytes) -> dict[str, int]:
    reader, writer = await asyncio.open_connection(host, port)
    stats = {"ok": 0, "failed": 0}
    sent = done = 0
    try:
        while done < len(requests):
            while sent - done < window and sent < len(requests):
                writer.write(requests[sent])
                sent += 1
            status, body = await _read_response(reader)
            done += 1
            if status == 200 and check in body:
                stats["ok"] += 1
            else:
                stats["failed"] += 1
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return stats


async def _worker_main(host: str, port: int, batches: list[list[bytes]], window: int,
                       check: bytes) -> dict[str, Any]:
    started = time.time()
    results = await asyncio.gather(*(_connection(host, port, b, window, check) for b in batches if b))
    return {"ok": sum(r["ok"] for r in results), "failed": sum(r["failed"] for r in results),
            "start": started, "end": time.time(), "cpu": time.process_time()}


def _worker(args: tuple[str, str, int, list[int], int, int, int, int, str, bytes]) -> dict[str, Any]:
    phase, host, port, indices, instances, services, connections, window, host_header, check = args
    import uvloop

    requests = phase_requests(phase, indices, instances, services, host_header)
    batches = [requests[c::connections] for c in range(connections)]
    cpu0 = time.process_time()
    result: dict[str, Any] = uvloop.run(_worker_main(host, port, batches, window, check))
    result["cpu"] -= cpu0
    return result


# --- the server ---------------------------------------------------------------------------------------
class Server:
    def __init__(self, addr: str | None, pid: int | None, log_level: str, extra: list[str]) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.tmp: str | None = None
        if addr:
            host, _, port = addr.rpartition(":")
            self.host, self.port, self.pid = host, int(port), pid
            return
        self.host, self.port = "127.0.0.1", _free_port()
        self.tmp = tempfile.mkdtemp(prefix="shoal-http-load-")
        cmd = [sys.executable, "-m", "shoal", "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", self.tmp, "--log-level", log_level, *OPEN.value]  # an open node (no login)
        for item in extra:
            cmd += ["-D", item]
        self.log = open(Path(self.tmp) / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(Path(self.tmp) / 'server.log').read_text()}")
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{self.port}/nacos/v1/console/health/readiness"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready in 30 s")
            time.sleep(0.1)

    def cpu_s(self) -> float | None:
        if self.pid is None:
            return None
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.log.close()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _free_port() -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 1001 < 65536:
            with contextlib.suppress(OSError), socket.socket() as s1, socket.socket() as s2:
                s1.bind(("127.0.0.1", port + 1000))
                s2.bind(("127.0.0.1", port + 1001))
                return port
    raise RuntimeError("no free ports")


# --- phases ----------------------------------------------------------------------------------------------
CHECKS = {"register": b"ok", "beat": b'"code":10200', "beat-full": b'"code":10200', "list": b'"hosts":['}


def run_phase(pool: Any, server: Server, phase: str, total: int, services: int, args: argparse.Namespace
              ) -> dict[str, Any]:
    per_worker = [list(range(w, total, args.workers)) for w in range(args.workers)]
    host_header = f"{server.host}:{server.port}"
    jobs = [(phase, server.host, server.port, idx, args.instances, services, args.connections, args.window,
             host_header, CHECKS[phase]) for idx in per_worker]
    cpu0 = server.cpu_s()
    results = pool.map(_worker, jobs)
    cpu1 = server.cpu_s()
    ok = sum(r["ok"] for r in results)
    failed = sum(r["failed"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    out: dict[str, Any] = {"ops": ok + failed, "failed": failed, "wall_s": round(wall, 3),
                           "ops_per_s": round((ok + failed) / wall, 1),
                           "client_cpu_s": round(sum(r["cpu"] for r in results), 3)}
    if cpu0 is not None and cpu1 is not None:
        cpu = cpu1 - cpu0
        out.update(server_cpu_s=round(cpu, 3),
                   server_cpu_s_per_1000_ops=round(cpu * 1000 / max(ok + failed, 1), 4),
                   ops_per_server_cpu_s=round((ok + failed) / cpu, 1) if cpu > 0 else None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--addr", help="ip:port of a running node's HTTP port (default: start one)")
    parser.add_argument("--server-pid", type=int, help="pid of the --addr node, for its CPU time")
    parser.add_argument("--instances", type=int, default=20_000)
    parser.add_argument("--services", type=int, default=2_000)
    parser.add_argument("--beat-rounds", type=int, default=5)
    parser.add_argument("--list-rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1, help="generator processes (2-core box: 1)")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections per worker")
    parser.add_argument("--window", type=int, default=16, help="pipelined requests per connection")
    parser.add_argument("--server-log-level", default="warning")
    parser.add_argument("--server-arg", action="append", default=[], metavar="PROP=VALUE")
    parser.add_argument("--out", help="also write the JSON document here")
    args = parser.parse_args(argv)
    for name in ("instances", "services", "workers", "connections", "window"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")

    server = Server(args.addr, args.server_pid, args.server_log_level, args.server_arg)
    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "out"},
                              "cpu_count": os.cpu_count(), "loadavg_before": os.getloadavg()}
    try:
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            report["register"] = run_phase(pool, server, "register", args.instances, args.services, args)
            report["beat"] = run_phase(pool, server, "beat", args.instances * args.beat_rounds, args.services, args)
            report["beat_full"] = run_phase(pool, server, "beat-full", args.instances, args.services, args)
            report["list"] = run_phase(pool, server, "list", args.services * args.list_rounds, args.services, args)
    finally:
        server.stop()
    beat_rate = report["beat"].get("ops_per_server_cpu_s")
    report["target"] = {"beats_per_server_cpu_s": TARGET_BEATS_PER_CPU_S,
                        "met": beat_rate is not None and beat_rate >= TARGET_BEATS_PER_CPU_S}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
