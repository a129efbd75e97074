"""Load pieces shared by ``bench/faults`` and ``bench/soak``: live clients that keep renewing, a
closed-loop write churn, an observer that polls every node's view, and what the nodes themselves
logged (expirations, tracebacks).

Everything runs on one asyncio loop in the bench process (aiohttp for HTTP, the real
nacos-sdk-python 3.x gRPC client for connection clients); the cluster is a
:class:`shoal.testing.FaultCluster` of real ``shoal server`` processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from shoal.testing import FaultCluster, poll_until
from shoal.testing.faults import tracebacks
from shoal.testing.nodes import FAST_MEMBERS

log = logging.getLogger("bench.faults")

#: Log lines of a node that remove (or disable) an instance or a client it was not told to remove.
EXPIRY_PATTERNS = {
    "auto_delete_ip": re.compile(r"\[AUTO-DELETE-IP\] (\S+) of (\S+)"),
    "ip_disabled": re.compile(r"\[IP-DISABLED\] (\S+) of (\S+)"),
    "synced_expired": re.compile(r"expired (\d+) synced clients not renewed"),
}


def expirations(cluster: FaultCluster, services: Iterable[str] = ()) -> dict[str, Any]:
    """What every node logged about expiring: per pattern the count over all nodes, and for the
    per-instance patterns the lines about ``services`` (the live ones: each of those is false)."""
    wanted = set(services)
    out: dict[str, Any] = {"per_node": {}, "false": []}
    for i in sorted(cluster.nodes):
        text = cluster.nodes[i].log()
        counts: dict[str, int] = {}
        for name, pattern in EXPIRY_PATTERNS.items():
            found = pattern.findall(text)
            counts[name] = sum(int(n) for n in found) if name == "synced_expired" else len(found)
            if name != "synced_expired":
                out["false"].extend(f"node {i} {name} {cid} of {svc}" for cid, svc in found
                                    if any(svc.endswith(f"@@{w}") or svc == w for w in wanted))
        counts["tracebacks"] = tracebacks(text)
        out["per_node"][i] = counts
    return out


@contextlib.contextmanager
def three_nodes(prefix: str) -> Iterator[tuple[FaultCluster, Path]]:
    """Three open nodes on 127.0.0.x (:class:`FaultCluster`) with every member UP everywhere, and
    their scratch folder; the nodes are killed when the block ends, however it ends (SIGTERM
    unwinds like Ctrl-C, so a run stopped from outside leaves no node behind either)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = FaultCluster(Path(tmp), 3, base=FAST_MEMBERS)
        try:
            cluster.start_all()
            poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in range(3)),
                       60, 0.2, "every member UP everywhere")
            yield cluster, Path(tmp)
        finally:
            cluster.kill_all()


def quiet_client_noise(loop: asyncio.AbstractEventLoop, counter: dict[str, int]) -> None:
    """Count, instead of printing, what the SDK clients' grpc.aio streams leave behind when they
    are shut down mid-call (``Task was destroyed but it is pending``, ``aclose()`` races): the
    load generator's noise, not the nodes'."""
    def handler(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        counter["client_loop_errors"] = counter.get("client_loop_errors", 0) + 1

    loop.set_exception_handler(handler)


def http_url(cluster: FaultCluster, i: int, path: str) -> str:
    return str(cluster.nodes[i].url(path))


@dataclass
class Stats:
    ok: int = 0
    errors: int = 0
    reregistered: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, ok: bool, ms: float) -> None:
        if ok:
            self.ok += 1
        else:
            self.errors += 1
        if len(self.latencies_ms) < 200_000:
            self.latencies_ms.append(ms)

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 2)) if lat else (lambda q: None)
        return {"ok": self.ok, "errors": self.errors, "per_s": round(self.ok / max(seconds, 1e-9), 1),
                "p50_ms": pick(0.5), "p99_ms": pick(0.99), "reregistered": self.reregistered}


class HttpInstances:
    """``count`` ip:port instances of ``service``, each registered through a node and beating
    every ``beat_s`` (light beats, as the 2.x HTTP clients send); a beat answered 20404 means the
    node had dropped it: the instance registers again (counted) as the SDKs do."""

    def __init__(self, cluster: FaultCluster, session: aiohttp.ClientSession, service: str, count: int,
                 beat_s: float = 5.0, subnet: str = "10.60") -> None:
        self.cluster, self.session, self.service, self.beat_s = cluster, session, service, beat_s
        self.addrs = [(f"{subnet}.{n // 250}.{n % 250 + 1}", 9000) for n in range(count)]
        self.stats = Stats()
        self.up: list[int] = sorted(cluster.nodes)  #: nodes to talk to (the faults change it)
        self.live: set[tuple[str, int]] = set()  #: registered and acknowledged

    def node_for(self, n: int) -> int:
        up = self.up
        return up[n % len(up)]

    async def _request(self, method: str, i: int, path: str, params: dict[str, Any]) -> tuple[int, str]:
        async with self.session.request(method, http_url(self.cluster, i, path), params=params,
                                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status, await resp.text()

    async def register(self, n: int) -> bool:
        ip, port = self.addrs[n]
        try:
            status, _ = await self._request("POST", self.node_for(n), "/nacos/v1/ns/instance",
                                            {"serviceName": self.service, "ip": ip, "port": port})
        except (TimeoutError, aiohttp.ClientError):
            return False
        if status == 200:
            self.live.add((ip, port))
        return status == 200

    async def run_one(self, n: int, stop: asyncio.Event) -> None:
        while not stop.is_set() and not await self.register(n):
            await asyncio.sleep(0.5)
        ip, port = self.addrs[n]
        await asyncio.sleep(self.beat_s * (n % 50) / 50)  # spread the beats
        while not stop.is_set():
            started = time.monotonic()
            try:
                status, text = await self._request("PUT", self.node_for(n), "/nacos/v1/ns/instance/beat",
                                                   {"serviceName": self.service, "ip": ip, "port": port})
                ok = status == 200
                if ok and '"code":20404' in text.replace(" ", ""):
                    self.stats.reregistered += 1
                    await self.register(n)
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            self.stats.add(ok, (time.monotonic() - started) * 1000)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.beat_s)

    def tasks(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self.run_one(n, stop)) for n in range(len(self.addrs))]


class Churn:
    """``writers`` closed-loop writers: register a short-lived instance, deregister it, again. As
    fast as the nodes answer, so together they are the highest write rate the box sustains."""

    def __init__(self, cluster: FaultCluster, session: aiohttp.ClientSession, writers: int,
                 prefix: str = "churn") -> None:
        self.cluster, self.session, self.writers, self.prefix = cluster, session, writers, prefix
        self.stats = Stats()
        self.up: list[int] = sorted(cluster.nodes)

    async def _writer(self, w: int, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            up = self.up
            node = up[(w + n) % len(up)]
            params = {"serviceName": f"{self.prefix}-{w % 10}", "ip": f"10.70.{w}.{n % 250 + 1}", "port": 7000}
            for method in ("POST", "DELETE"):
                started = time.monotonic()
                try:
                    async with self.session.request(method, http_url(self.cluster, node, "/nacos/v1/ns/instance"),
                                                    params=params, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                    await asyncio.sleep(0.2)
                self.stats.add(ok, (time.monotonic() - started) * 1000)

    def tasks(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._writer(w, stop)) for w in range(self.writers)]


class SdkInstances:
    """``count`` real nacos-sdk-python 3.x clients, each connected to one node (round robin over
    all of them, failing over to the others) and owning one instance of ``service``."""

    def __init__(self, cluster: FaultCluster, service: str, count: int, tmp: Path, subnet: str = "10.61") -> None:
        self.cluster, self.service, self.count, self.tmp = cluster, service, count, tmp
        self.addrs = [(f"{subnet}.{n // 250}.{n % 250 + 1}", 9100) for n in range(count)]
        self.clients: list[Any] = []
        self.live: set[tuple[str, int]] = set()

    async def client(self, n: int) -> Any:
        from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService

        order = sorted(self.cluster.nodes)
        first = order[n % len(order)]
        servers = ",".join(self.cluster.addr(i) for i in [first, *[i for i in order if i != first]])
        config = (ClientConfigBuilder().server_address(servers).log_level("ERROR")
                  .log_dir(str(self.tmp / "sdk-logs")).cache_dir(str(self.tmp / "sdk-cache"))
                  .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
        return await NacosNamingService.create_naming_service(config)

    async def start(self) -> None:
        from v2.nacos import RegisterInstanceParam

        for n, (ip, port) in enumerate(self.addrs):
            client = await self.client(n)
            self.clients.append(client)
            if await client.register_instance(RegisterInstanceParam(service_name=self.service, ip=ip, port=port)):
                self.live.add((ip, port))

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.shutdown(), 10)



async def listed(session: aiohttp.ClientSession, url: str, service: str) -> set[tuple[str, int]] | None:
    """The ``(ip, port)`` a node's ``instance/list`` at ``url`` answers for ``service`` (None: no answer)."""
    try:
        async with session.get(url, params={"serviceName": service, "healthyOnly": "false"},
                               timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            body = json.loads(await resp.text())
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    return {(h["ip"], int(h["port"])) for h in body.get("hosts", [])}

class Observer:
    """Polls every node's list of each watched service every ``interval`` s: an instance whose
    client is alive and renewing must always be there. Records every poll where one is missing."""

    def __init__(self, cluster: FaultCluster, session: aiohttp.ClientSession,
                 watched: dict[str, Any], interval: float = 1.0) -> None:
        self.cluster, self.session, self.watched, self.interval = cluster, session, watched, interval
        self.polls = 0
        self.errors = 0
        self.missing: list[dict[str, Any]] = []
        self.up: list[int] = sorted(cluster.nodes)

    async def listed(self, i: int, service: str) -> set[tuple[str, int]] | None:
        return await listed(self.session, http_url(self.cluster, i, "/nacos/v1/ns/instance/list"), service)

    async def poll_once(self, t0: float) -> None:
        for i in list(self.up):
            for service, source in self.watched.items():
                expected = set(source.live)
                seen = await self.listed(i, service)
                self.polls += 1
                if seen is None:
                    self.errors += 1
                    continue
                gone = expected - seen
                if gone:
                    self.missing.append({"t_s": round(time.monotonic() - t0, 1), "node": i, "service": service,
                                         "missing": sorted(f"{ip}:{port}" for ip, port in gone)[:10],
                                         "count": len(gone)})

    async def run(self, stop: asyncio.Event, t0: float) -> None:
        while not stop.is_set():
            await self.poll_once(t0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
