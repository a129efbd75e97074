"""The body of one load-generator process: an asyncio loop driving many Nacos connections.

The orchestrator (run.py) talks to each worker over a multiprocessing pipe: it sends
``(command, params)`` and gets back ``("ok", result)`` or ``("error", traceback)``. The loop
keeps running while a command is awaited, so the connections' stream readers answer the
server's ClientDetectionRequest and NotifySubscriberRequest at any time. Every phase is
bounded by an op count and a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import time
import traceback
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

import nacos_client as nc  # a sibling: imported by run.py, whose folder is on the path

_dumps = json.JSONEncoder(separators=(",", ":")).encode

#: metadata on every benchmark instance: a few keys, as real services carry.
INSTANCE_METADATA = {
    "version": "1.4.2",
    "zone": "zone-a",
    "protocol": "http",
    "preserved.register.source": "SPRING_CLOUD",
}


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def conn_ip(g: int, first: int = 10) -> str:
    return f"{first}.{(g >> 16) & 255}.{(g >> 8) & 255}.{g & 255}"


def service_name(prefix: str, k: int) -> str:
    return f"{prefix}-{k:05d}"


#: one request of a plan: (Payload metadata.type, JSON body)
Op = tuple[str, bytes]


def register_plan(
    p: dict[str, Any], kind: str, first_global: int, n_conns: int, registered: list[list[int]] | None = None
) -> list[list[Op]]:
    """Per connection, its InstanceRequests: connection g (global index) has one instance (ip from g,
    port 8080) and registers it into ``per_conn`` services; deregister undoes ``registered[ci]``
    (the services that connection registered) or, without it, every service register would use."""
    plan: list[list[Op]] = []
    for ci in range(n_conns):
        g = first_global + ci
        inst = nc.instance(conn_ip(g), 8080, INSTANCE_METADATA)
        ops: list[Op] = []
        if kind == "registerInstance" or registered is None:
            services: list[int] = [(g * p["per_conn"] + j) % p["services"] for j in range(p["per_conn"])]
        else:
            services = registered[ci]
        for k in services:
            body = nc.instance_request(kind, service_name(p["prefix"], k), inst)
            ops.append(("InstanceRequest", _dumps(body).encode()))
        plan.append(ops)
    return plan


def query_plan(p: dict[str, Any], index: int, n_conns: int) -> list[list[Op]]:
    """``p["ops"]`` ServiceQueryRequests for random services (seeded by seed and worker index),
    spread evenly over ``n_conns`` connections."""
    rng = random.Random(p["seed"] * 1000 + index)
    n = n_conns
    per_conn = [p["ops"] // n + (1 if i < p["ops"] % n else 0) for i in range(n)] if n else []
    bodies = [_dumps(nc.query_request(service_name(p["prefix"], k))).encode() for k in range(p["services"])]
    return [[("ServiceQueryRequest", bodies[rng.randrange(p["services"])]) for _ in range(m)] for m in per_conn]


class Worker:
    def __init__(self, index: int, target: str) -> None:
        self.index = index
        self.target = target
        self.conns: list[nc.NacosConnection] = []
        self.first_global = 0
        self.registered: list[list[int]] = []  # per connection: service indexes it registered
        self.push_events: list[tuple[int, str, str, int, str, float]] = []
        self.push_state: dict[tuple[int, str], set[tuple[str, int]]] = {}
        self.push_count = 0
        self.push_unchanged = 0  # pushes whose host set equals the previous one for that service
        self._ping: asyncio.Task[dict[str, Any]] | None = None
        self._ping_stop = asyncio.Event()

    # --- plumbing -------------------------------------------------------------------------
    async def serve(self, pipe: Any) -> None:
        while True:
            try:
                command, params = await asyncio.to_thread(pipe.recv)
            except (EOFError, OSError):
                break  # the orchestrator is gone
            if command == "exit":
                await self.close_all({})
                pipe.send(("ok", {}))
                break
            try:
                result = await getattr(self, command.replace("-", "_"))(params)
                pipe.send(("ok", result))
            except Exception:
                pipe.send(("error", f"worker {self.index} {command}: {traceback.format_exc()}"))

    async def _open(
        self,
        count: int,
        concurrency: int,
        first_global: int,
        on_push: nc.PushCallback | None = None,
        timeout_s: float = 30.0,
    ) -> tuple[list[nc.NacosConnection], dict[str, Any]]:
        """Open ``count`` connections, ``concurrency`` handshakes at a time."""
        opened: list[nc.NacosConnection | None] = [None] * count
        errors: dict[str, int] = {}
        sem = asyncio.Semaphore(concurrency)
        times = array("d")

        async def one(i: int) -> None:
            async with sem:
                conn = nc.NacosConnection(self.target, on_push=on_push)
                started = time.perf_counter()
                try:
                    await conn.connect(timeout_s)
                except Exception as exc:
                    key = exc.code if isinstance(exc, nc.NacosError) else type(exc).__name__
                    errors[key] = errors.get(key, 0) + 1
                    return
                times.append(time.perf_counter() - started)
                opened[i] = conn

        started = time.time()
        await asyncio.gather(*(one(i) for i in range(count)))
        ended = time.time()
        conns = [c for c in opened if c is not None]
        return conns, {
            "opened": len(conns),
            "failed": count - len(conns),
            "errors": errors,
            "start": started,
            "end": ended,
            "connect_s": times,
        }

    # --- connections for the rate phases ----------------------------------------------------
    async def connect(self, p: dict[str, Any]) -> dict[str, Any]:
        raise_fd_limit()
        self.first_global = p["first_global"]
        conns, info = await self._open(p["count"], p["concurrency"], self.first_global)
        self.conns.extend(conns)
        self.registered = [[] for _ in self.conns]
        return info

    async def close_all(self, p: dict[str, Any]) -> dict[str, Any]:
        conns, self.conns = self.conns, []
        if self._ping is not None:
            self._ping_stop.set()
            with contextlib.suppress(Exception):
                await self._ping
            self._ping = None
        sem = asyncio.Semaphore(500)

        async def one(c: nc.NacosConnection) -> None:
            async with sem:
                with contextlib.suppress(Exception):
                    await c.close()

        await asyncio.gather(*(one(c) for c in conns))
        return {"closed": len(conns)}

    async def _run_ops(
        self,
        per_conn: list[list[tuple[str, bytes]]],
        window: int,
        deadline_s: float,
        on_ok: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]:
        """Run each connection's op list with ``window`` requests in flight per connection."""
        lat = array("d")
        errors: dict[str, int] = {}
        done = 0
        cpu0 = time.process_time()
        started = time.time()
        deadline = time.monotonic() + deadline_s
        truncated = False

        async def lane(ci: int, conn: nc.NacosConnection, ops: list[tuple[str, bytes]], cursor: list[int]) -> None:
            nonlocal done, truncated
            call_ok = conn.call_ok
            perf = time.perf_counter
            while cursor[0] < len(ops):
                if time.monotonic() > deadline:
                    truncated = True
                    return
                j = cursor[0]
                cursor[0] += 1
                type_name, body = ops[j]
                t = perf()
                try:
                    await call_ok(type_name, body)
                except Exception as exc:
                    key = exc.code if isinstance(exc, nc.NacosError) else type(exc).__name__
                    errors[key] = errors.get(key, 0) + 1
                    continue
                lat.append(perf() - t)
                done += 1
                if on_ok is not None:
                    on_ok(ci, j)

        lanes: list[Awaitable[None]] = []
        for ci, (conn, ops) in enumerate(zip(self.conns, per_conn, strict=False)):
            cursor = [0]
            lanes.extend(lane(ci, conn, ops, cursor) for _ in range(max(1, window)))
        await asyncio.gather(*lanes)
        return {
            "ops": done,
            "errors": errors,
            "start": started,
            "end": time.time(),
            "latency_s": lat,
            "client_cpu_s": time.process_time() - cpu0,
            "truncated": truncated,
        }

    def _register_plan(self, p: dict[str, Any], kind: str) -> list[list[tuple[str, bytes]]]:
        return register_plan(p, kind, self.first_global, len(self.conns), self.registered)

    async def register(self, p: dict[str, Any]) -> dict[str, Any]:
        plan = self._register_plan(p, "registerInstance")
        svc_of = [
            [(self.first_global + ci) * p["per_conn"] + j for j in range(p["per_conn"])]
            for ci in range(len(self.conns))
        ]

        def ok(ci: int, j: int) -> None:
            self.registered[ci].append(svc_of[ci][j] % p["services"])

        return await self._run_ops(plan, p["window"], p["duration"], ok)

    async def deregister(self, p: dict[str, Any]) -> dict[str, Any]:
        plan = self._register_plan(p, "deregisterInstance")
        result = await self._run_ops(plan, p["window"], p["duration"])
        self.registered = [[] for _ in self.conns]
        return result

    async def query(self, p: dict[str, Any]) -> dict[str, Any]:
        plan = query_plan(p, self.index, len(self.conns))
        return await self._run_ops(plan, p["window"], p["duration"])

    async def verify(self, p: dict[str, Any]) -> dict[str, Any]:
        """Query every service once (not timed); total hosts seen and services answered."""
        conn = self.conns[0]
        hosts = 0
        counts: dict[int, int] = {}
        for k in range(p["services"]):
            _, body = await conn.request("ServiceQueryRequest", nc.query_request(service_name(p["prefix"], k)))
            if body.get("resultCode") != 200:
                raise RuntimeError(f"verify: query of service {k} failed: {body}")
            n = len(body.get("serviceInfo", {}).get("hosts") or [])
            hosts += n
            counts[n] = counts.get(n, 0) + 1
        return {"hosts": hosts, "services": p["services"], "hosts_per_service": counts}

    # --- push latency ----------------------------------------------------------------------
    def _on_push(self, conn: nc.NacosConnection, received: float, info: dict[str, Any]) -> None:
        sub = getattr(conn, "bench_id", -1)
        name = str(info.get("name", ""))
        new = {(str(h.get("ip")), int(h.get("port", 0))) for h in (info.get("hosts") or [])}
        key = (sub, name)
        old = self.push_state.get(key, set())
        self.push_state[key] = new
        self.push_count += 1
        if new == old:
            self.push_unchanged += 1
        for ip, port in new - old:
            self.push_events.append((sub, name, ip, port, "up", received))
        for ip, port in old - new:
            self.push_events.append((sub, name, ip, port, "down", received))

    async def push_subscribe(self, p: dict[str, Any]) -> dict[str, Any]:
        raise_fd_limit()
        conns, info = await self._open(p["count"], p["concurrency"], p["first_sub"], on_push=self._on_push)
        self.push_events.clear()
        self.push_state.clear()
        self.push_count = 0
        subs: dict[str, list[int]] = {}
        for i, conn in enumerate(conns):
            sub = p["first_sub"] + i
            conn.bench_id = sub  # type: ignore[attr-defined]
            svc = service_name(p["prefix"], sub % p["services"])
            _, body = await conn.request("SubscribeServiceRequest", nc.subscribe_request(svc))
            if body.get("resultCode") != 200:
                raise RuntimeError(f"subscribe failed: {body}")
            hosts = body.get("serviceInfo", {}).get("hosts") or []
            self.push_state[(sub, svc)] = {(str(h.get("ip")), int(h.get("port", 0))) for h in hosts}
            subs.setdefault(svc, []).append(sub)
        self.conns.extend(conns)
        info.pop("connect_s")
        info["subscribers"] = subs
        return info

    async def push_collect(self, p: dict[str, Any]) -> dict[str, Any]:
        events, self.push_events = self.push_events, []
        counts = {"pushes": self.push_count, "unchanged": self.push_unchanged}
        self.push_count = self.push_unchanged = 0
        return {"events": events, **counts}

    async def publish(self, p: dict[str, Any]) -> dict[str, Any]:
        """Register/deregister at ``rate`` per second; every register uses a fresh port so
        subscribers can tell which change a push carries. Slot (connection, service) alternates
        register → deregister, so a connection never replaces its own instance."""
        conns = self.conns
        n_slots = len(conns) * p["services"]
        live: dict[int, tuple[str, int]] = {}
        ops: list[tuple[str, str, int, str, float]] = []  # kind, service, port, ip, sent
        errors: dict[str, int] = {}
        lat = array("d")
        sem = asyncio.Semaphore(200)
        tasks: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        deadline = started + p["duration"]
        t0 = time.time()

        async def do(conn: nc.NacosConnection, kind: str, svc: str, ip: str, port: int) -> None:
            async with sem:
                body = _dumps(nc.instance_request(kind, svc, nc.instance(ip, port, INSTANCE_METADATA))).encode()
                sent = time.time()
                ops.append((kind, svc, port, ip, sent))
                try:
                    await conn.call_ok("InstanceRequest", body)
                    lat.append(time.time() - sent)
                except Exception as exc:
                    key = exc.code if isinstance(exc, nc.NacosError) else type(exc).__name__
                    errors[key] = errors.get(key, 0) + 1

        k = 0
        for k in range(p["changes"]):
            due = started + k / p["rate"]
            now = time.monotonic()
            if now > deadline:
                break
            if due > now:
                await asyncio.sleep(due - now)
            slot = k % n_slots
            ci, t = divmod(slot, p["services"])
            svc = service_name(p["prefix"], t)
            if slot in live:
                ip, port = live.pop(slot)
                kind = "deregisterInstance"
            else:
                ip, port = conn_ip(ci, 11), 20000 + k
                live[slot] = (ip, port)
                kind = "registerInstance"
            task = asyncio.create_task(do(conns[ci], kind, svc, ip, port))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return {"ops": ops, "errors": errors, "request_latency_s": lat, "start": t0, "end": time.time()}

    # --- idle connections -------------------------------------------------------------------
    async def idle_open(self, p: dict[str, Any]) -> dict[str, Any]:
        limit = raise_fd_limit()
        conns, info = await self._open(p["count"], p["concurrency"], p["first_global"], timeout_s=p["timeout"])
        self.conns.extend(conns)
        info["fd_limit"] = limit
        info["client_rss_bytes"] = _rss_self()
        return info

    async def idle_check(self, p: dict[str, Any]) -> dict[str, Any]:
        """Which connections survived: stream still open and a HealthCheck answered 200."""
        alive = sum(1 for c in self.conns if c.alive)
        stream_errors: dict[str, int] = {}
        for c in self.conns:
            if not c.alive:
                stream_errors[str(c.stream_error)] = stream_errors.get(str(c.stream_error), 0) + 1
        detections = sum(c.detections for c in self.conns)
        probed = sum(1 for c in self.conns if c.detections)
        errors: dict[str, int] = {}
        ok = 0
        sem = asyncio.Semaphore(p.get("concurrency", 200))

        async def one(c: nc.NacosConnection) -> None:
            nonlocal ok
            async with sem:
                try:
                    await c.health_check(10.0)
                    ok += 1
                except Exception as exc:
                    key = exc.code if isinstance(exc, nc.NacosError) else type(exc).__name__
                    errors[key] = errors.get(key, 0) + 1

        await asyncio.gather(*(one(c) for c in self.conns))
        return {
            "connections": len(self.conns),
            "stream_open": alive,
            "health_ok": ok,
            "health_errors": errors,
            "stream_errors": stream_errors,
            "detections_answered": detections,
            "connections_probed": probed,
        }

    async def ping_start(self, p: dict[str, Any]) -> dict[str, Any]:
        """Query one service every ``interval`` s on a connection of its own until ping_stop."""
        conn = nc.NacosConnection(self.target)
        await conn.connect()
        self._ping_stop.clear()
        body = _dumps(nc.query_request(p["service"])).encode()

        async def loop() -> dict[str, Any]:
            lat = array("d")
            errors: dict[str, int] = {}
            try:
                end = time.monotonic() + p["max_s"]
                while not self._ping_stop.is_set() and time.monotonic() < end:
                    t = time.perf_counter()
                    try:
                        await conn.call_ok("ServiceQueryRequest", body, timeout_s=10)
                        lat.append(time.perf_counter() - t)
                    except Exception as exc:
                        key = exc.code if isinstance(exc, nc.NacosError) else type(exc).__name__
                        errors[key] = errors.get(key, 0) + 1
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(p["interval"]):
                            await self._ping_stop.wait()
            finally:
                await conn.close()
            return {"latency_s": lat, "errors": errors}

        self._ping = asyncio.create_task(loop())
        return {}

    async def ping_stop(self, p: dict[str, Any]) -> dict[str, Any]:
        if self._ping is None:
            return {"latency_s": array("d"), "errors": {}}
        self._ping_stop.set()
        result = await self._ping
        self._ping = None
        return result

    async def one_query(self, p: dict[str, Any]) -> dict[str, Any]:
        """Open a connection, run one ServiceQuery, close: proves the server still serves."""
        conn = nc.NacosConnection(self.target)
        started = time.perf_counter()
        try:
            await conn.connect()
            connected = time.perf_counter()
            type_name, body = await conn.request("ServiceQueryRequest", nc.query_request(p["service"]))
            return {
                "ok": body.get("resultCode") == 200,
                "type": type_name,
                "connect_ms": (connected - started) * 1000,
                "query_ms": (time.perf_counter() - connected) * 1000,
            }
        finally:
            await conn.close()


def _rss_self() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def worker_main(index: int, target: str, pipe: Any) -> None:
    """Process entry point (multiprocessing, spawn)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator handles Ctrl-C and stops us
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    raise_fd_limit()
    worker = Worker(index, target)
    try:
        import uvloop
    except ImportError:
        asyncio.run(worker.serve(pipe))
    else:
        uvloop.run(worker.serve(pipe))
