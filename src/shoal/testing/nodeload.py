"""Load on one node's public ports, seen from the clients: which worker answered each request, on
which connection, and how long it took (the workers' fault tests, ``tests/faults/test_worker_faults.py``).

Everything runs on the test's event loop:

* :class:`KeepAliveHttp`: one HTTP/1.1 keep-alive connection, opened again after an error, as a
  pooled HTTP client does; every :class:`Answer` says which worker answered (``Shoal-Worker``)
  and which worker held the connection before the request (None: a new connection, which the
  kernel may give any worker listening on the port).
* :class:`Writers`: closed-loop writers, each at a steady rate (register, then deregister, a
  short-lived ip:port instance), on a connection of its own.
* :class:`Beaters`: ip:port instances registered once and beating every few seconds (light
  beats, as the 2.x HTTP clients send), each on a connection of its own.
* :class:`SdkFleet`: real nacos-sdk-python 3.x gRPC clients (``v2.nacos``, the ``dev`` extra),
  one instance each.
* :class:`Listings`: polls every worker's list of the watched services on its private port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from shoal.testing.procs import ServerProcess
from shoal.transport.sharing import WORKER_HEADER

INSTANCE = "/nacos/v1/ns/instance"
BEAT = "/nacos/v1/ns/instance/beat"
LIST = "/nacos/v1/ns/instance/list"


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as its client saw it."""

    at: float  #: time.monotonic() when it was sent
    took: float  #: seconds until its answer (or its error)
    status: int  #: the HTTP status; 0 when no answer came
    worker: int | None  #: the worker that answered (None: no answer)
    held_by: int | None  #: the worker that had answered on this connection before (None: a new connection)
    error: str = ""  #: what went wrong ("timeout", "ConnectionResetError", ...); empty when answered
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == 200


class KeepAliveHttp:
    """One keep-alive HTTP/1.1 connection to ``host:port`` (plain HTTP); after an error or a
    timeout the connection is dropped and the next request opens a new one."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._worker: int | None = None
        self.opened = 0  #: connections opened so far

    @property
    def held_by(self) -> int | None:
        """The worker that answered last on the current connection (None: no connection yet)."""
        return self._worker if self._writer is not None else None

    async def request(self, method: str, path: str, params: dict[str, Any]) -> Answer:
        target = f"{path}?{urllib.parse.urlencode(params)}"
        held_by = self.held_by
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                if self._writer is None:
                    self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
                    self._worker = None
                    self.opened += 1
                assert self._reader is not None
                self._writer.write(f"{method} {target} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                                   "Content-Length: 0\r\n\r\n".encode())
                await self._writer.drain()
                status, headers, body = await _read_answer(self._reader)
        except TimeoutError:
            self.close()
            return Answer(started, time.monotonic() - started, 0, None, held_by, "timeout")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            return Answer(started, time.monotonic() - started, 0, None, held_by, type(exc).__name__)
        took = time.monotonic() - started
        worker = headers.get(WORKER_HEADER.lower())
        self._worker = int(worker) if worker is not None and worker.isdigit() else None
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Answer(started, took, status, self._worker, held_by, "", body)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.transport.abort()
        self._reader = self._writer = None


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:])
               if name}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, headers, bytes(body)
            body += chunk[:-2]
    headers["connection"] = "close"
    return status, headers, await reader.read()


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds`` or until ``stop`` is set (a rate's pacing, not a sleep-and-hope)."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


@dataclass
class Writers:
    """``count`` closed-loop writers on ``node``'s public HTTP port, each registering then
    deregistering a short-lived ip:port instance of ``service`` ``rate`` times a second (so
    ``2 * rate`` writes a second each), never faster, slower when the node is."""

    node: ServerProcess
    count: int
    rate: float = 5.0
    service: str = "churn"
    subnet: str = "10.80"
    timeout: float = 5.0
    answers: list[tuple[int, str, Answer]] = field(default_factory=list)  #: (writer, ip:port tag, answer)
    conns: dict[int, KeepAliveHttp] = field(default_factory=dict)  #: each writer's connection

    def held_by(self) -> dict[int, int | None]:
        """Which worker holds each writer's connection now (None: none open, or not answered yet)."""
        return {w: conn.held_by for w, conn in self.conns.items()}

    async def _run(self, w: int, stop: asyncio.Event) -> None:
        conn = self.conns[w] = KeepAliveHttp(self.node.host, self.node.port, self.timeout)
        start, n = time.monotonic(), 0
        try:
            while not stop.is_set():
                ip = f"{self.subnet}.{w}.{n % 250 + 1}"
                params = {"serviceName": self.service, "ip": ip, "port": 7000}
                for method in ("POST", "DELETE"):
                    self.answers.append((w, f"{ip}:7000", await conn.request(method, INSTANCE, params)))
                n += 1
                late = time.monotonic() - (start + n / self.rate)
                if late > 0:  # closed loop: a slow answer delays the next write, it never brings a burst
                    start += late
                await _pause(stop, -late)
        finally:
            conn.close()

    def tasks(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._run(w, stop), name=f"writer-{w}") for w in range(self.count)]


@dataclass
class Beaters:
    """``count`` ip:port instances of ``service``, registered through ``node``'s public HTTP port
    and beating every ``beat_s`` seconds (a failed beat is tried again after a second, a beat
    answered 20404 registers the instance again, counted in ``reregistered``)."""

    node: ServerProcess
    count: int
    service: str = "beating"
    beat_s: float = 5.0
    subnet: str = "10.81"
    timeout: float = 3.0
    answers: list[tuple[int, Answer]] = field(default_factory=list)
    reregistered: int = 0

    @property
    def ips(self) -> set[str]:
        return {self.ip(n) for n in range(self.count)}

    def ip(self, n: int) -> str:
        return f"{self.subnet}.{n // 250}.{n % 250 + 1}"

    def _params(self, n: int) -> dict[str, Any]:
        return {"serviceName": self.service, "ip": self.ip(n), "port": 9000}

    async def register_all(self, deadline_s: float = 30.0) -> None:
        """Register every instance (through new connections), each until it is acknowledged."""
        async def one(n: int) -> None:
            conn = KeepAliveHttp(self.node.host, self.node.port, self.timeout)
            try:
                end = time.monotonic() + deadline_s
                while not (await conn.request("POST", INSTANCE, self._params(n))).ok:
                    if time.monotonic() > end:
                        raise AssertionError(f"instance {self.ip(n)} was never registered")
                    await asyncio.sleep(0.2)
            finally:
                conn.close()
        await asyncio.gather(*(one(n) for n in range(self.count)))

    async def _run(self, n: int, stop: asyncio.Event) -> None:
        conn = KeepAliveHttp(self.node.host, self.node.port, self.timeout)
        try:
            await _pause(stop, self.beat_s * n / self.count)  # spread the beats over the interval
            while not stop.is_set():
                answer = await conn.request("PUT", BEAT, self._params(n))
                self.answers.append((n, answer))
                if answer.ok and b'"code":20404' in answer.body.replace(b" ", b""):
                    self.reregistered += 1
                    await conn.request("POST", INSTANCE, self._params(n))
                await _pause(stop, self.beat_s if answer.ok else 1.0)
        finally:
            conn.close()

    def tasks(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._run(n, stop), name=f"beater-{n}") for n in range(self.count)]


@dataclass
class SdkFleet:
    """Real nacos-sdk-python 3.x naming clients of ``addr`` (``host:port``, the public port), each
    owning one instance of ``service``; :meth:`close` shuts every one down."""

    addr: str
    service: str
    scratch: Path
    subnet: str = "10.82"
    clients: list[Any] = field(default_factory=list)

    @property
    def ips(self) -> list[str]:
        return [self.ip(n) for n in range(len(self.clients))]

    def ip(self, n: int) -> str:
        return f"{self.subnet}.{n // 250}.{n % 250 + 1}"

    async def add(self, count: int = 1) -> list[Any]:
        """``count`` more clients (a new connection each), each with its instance registered."""
        from v2.nacos import (  # type: ignore[import-untyped]
            ClientConfigBuilder,
            GRPCConfig,
            NacosNamingService,
            RegisterInstanceParam,
        )

        added = []
        for _ in range(count):
            config = (ClientConfigBuilder().server_address(self.addr).log_level("ERROR")
                      .log_dir(str(self.scratch / "sdk-logs")).cache_dir(str(self.scratch / "sdk-cache"))
                      .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
            client = await NacosNamingService.create_naming_service(config)
            self.clients.append(client)
            added.append(client)
            ip = self.ip(len(self.clients) - 1)
            if not await client.register_instance(RegisterInstanceParam(service_name=self.service, ip=ip, port=9100)):
                raise AssertionError(f"the SDK client of {ip} could not register")
        return added

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):  # a client whose server is gone may not close cleanly
                await asyncio.wait_for(client.shutdown(), 10)


@dataclass(frozen=True, slots=True)
class Listing:
    """One poll of one worker's list of one service."""

    at: float  #: time.monotonic() of the answer
    worker: int
    service: str
    hosts: dict[str, bool] | None  #: ip → healthy; None when the worker did not answer 200


@dataclass
class Listings:
    """Polls every worker of ``node`` in ``watching`` (all at first: a test takes a killed worker
    out and puts it back once restarted) for each of ``services``, every ``interval`` seconds,
    on the workers' private ports (``healthyOnly=false``)."""

    node: ServerProcess
    services: tuple[str, ...]
    interval: float = 0.5
    polls: list[Listing] = field(default_factory=list)
    watching: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ports = self.node.worker_ports()  # private ports are kept across restarts
        self.watching = set(range(len(self.ports))) if not self.watching else self.watching

    async def poll(self, session: aiohttp.ClientSession, worker: int, service: str) -> Listing:
        url = f"http://{self.node.host}:{self.ports[worker]}{LIST}"
        try:
            async with session.get(url, params={"serviceName": service, "healthyOnly": "false"}) as resp:
                body = await resp.read() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError):
            body = None
        hosts = None if body is None else {h["ip"]: bool(h.get("healthy")) for h in json.loads(body)["hosts"]}
        return Listing(time.monotonic(), worker, service, hosts)

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            while not stop.is_set():
                began = time.monotonic()
                polls = [self.poll(session, w, s) for w in sorted(self.watching) for s in self.services]
                self.polls.extend(await asyncio.gather(*polls))
                await _pause(stop, self.interval - (time.monotonic() - began))


class NodeLoad:
    """The load of the workers' fault tests on one node, all on its public ports: ``sdk`` SDK
    clients (:class:`SdkFleet`, service ``sdk-held``), ``beating`` beating ip:port instances
    (:class:`Beaters`, ``beating``), ``writers`` closed-loop writers at ``rate`` pairs a second
    each (:class:`Writers`, ``churn``), and :class:`Listings` of the two live services on every
    worker. :meth:`start` registers every instance before the load runs; :meth:`stop_writes`
    ends the writes alone, :meth:`stop` everything (the SDK clients shut down)."""

    def __init__(self, node: ServerProcess, scratch: Path, *, sdk: int = 20, beating: int = 50, writers: int = 8,
                 rate: float = 5.0, write_timeout: float = 2.0) -> None:
        self.node = node
        self.sdk_count = sdk
        self.writers = Writers(node, writers, rate, timeout=write_timeout)
        self.beaters = Beaters(node, beating)
        self.sdk = SdkFleet(node.addr, "sdk-held", scratch)
        self.listings = Listings(node, (self.beaters.service, self.sdk.service))
        self._stop = asyncio.Event()
        self._stop_writes = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._writes: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.beaters.register_all()
        await self.sdk.add(self.sdk_count)
        self._writes = self.writers.tasks(self._stop_writes)
        self._tasks = [*self.beaters.tasks(self._stop), asyncio.create_task(self.listings.run(self._stop))]

    def writes(self, since: float = 0.0, until: float = float("inf")) -> list[tuple[int, str, Answer]]:
        """The writes sent in [``since``, ``until``) (time.monotonic())."""
        return [(w, tag, a) for w, tag, a in self.writers.answers if since <= a.at < until]

    async def stop_writes(self) -> None:
        self._stop_writes.set()
        await asyncio.gather(*self._writes, return_exceptions=True)

    async def stop(self) -> None:
        self._stop.set()
        await self.stop_writes()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.sdk.close()


def p99(values: list[float]) -> float:
    """The 99th percentile of ``values`` (0 for none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def loadavg() -> str:
    """The box's load averages (``/proc/loadavg``'s first three figures), for a test's report."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


__all__ = ["Answer", "Beaters", "KeepAliveHttp", "Listing", "Listings", "NodeLoad", "SdkFleet", "Writers", "loadavg",
           "p99"]
