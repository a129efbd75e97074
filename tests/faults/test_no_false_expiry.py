"""Issue 22 ("Also build"): no false expiry under load, the short variant (the 10-minute run is
``bench/faults/no_false_expiry.py``).

Three real nodes take closed-loop register/deregister writes as fast as they answer, while live
clients keep renewing: ip:port instances beating every second with short per-instance timeouts
(unhealthy after 3 s, removed after 6 s without a beat, so a beat delayed or lost under load shows
up within the run) and real nacos-sdk-python 3.x gRPC clients. Every node's list of the live
services is polled throughout: a live instance must never be missing, a beat must never be
answered 20404, and no node may log the removal (or disabling) of a live instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shoal.testing import poll_until
from shoal.testing.faults import tracebacks
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster

pytestmark = pytest.mark.faults

LOAD_S = 40.0  #: how long the load runs (the point of the test: a window, not a sleep)
HTTP_LIVE, SDK_LIVE, WRITERS = 60, 6, 12
HTTP_SVC, SDK_SVC = "live-http", "live-grpc"
SHORT = json.dumps({"preserved.heart.beat.interval": "1000", "preserved.heart.beat.timeout": "3000",
                    "preserved.ip.delete.timeout": "6000"})
REMOVED = re.compile(r"\[(AUTO-DELETE-IP|IP-DISABLED)\] \S+ of \S*live-(http|grpc)")


async def test_live_instances_are_never_expired_under_write_load(fault_cluster: Callable[..., FaultCluster],
                                                                 tmp_path: Path) -> None:
    from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService, RegisterInstanceParam

    cluster = fault_cluster(3, *FAST_MEMBERS)
    cluster.start_all()
    nodes = [0, 1, 2]
    poll_until(lambda: all(all(s == "UP" for s in cluster.member_states(i).values()) for i in nodes), 30,
          what="every member UP everywhere")
    http_live = [(f"10.22.1.{n + 1}", 9000) for n in range(HTTP_LIVE)]
    sdk_live = [(f"10.22.2.{n + 1}", 9100) for n in range(SDK_LIVE)]
    stop = asyncio.Event()
    counts: dict[str, int] = {"writes": 0, "write_errors": 0, "beats": 0, "beat_errors": 0, "beat_20404": 0,
                              "polls": 0}
    missing: list[str] = []
    clients: list[Any] = []

    def url(i: int, path: str) -> str:
        return cluster.nodes[i].url(path)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async def send(method: str, i: int, path: str, params: dict[str, Any]) -> tuple[int, str]:
            async with session.request(method, url(i, path), params=params) as resp:
                return resp.status, await resp.text()

        for n, (ip, port) in enumerate(http_live):
            assert (await send("POST", n % 3, "/nacos/v1/ns/instance",
                               {"serviceName": HTTP_SVC, "ip": ip, "port": port, "metadata": SHORT}))[0] == 200
        for n, (ip, port) in enumerate(sdk_live):
            config = (ClientConfigBuilder().server_address(cluster.addr(n % 3)).log_level("ERROR")
                      .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
                      .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
            client = await NacosNamingService.create_naming_service(config)
            clients.append(client)
            assert await client.register_instance(RegisterInstanceParam(service_name=SDK_SVC, ip=ip, port=port))

        async def beater(n: int) -> None:
            ip, port = http_live[n]
            await asyncio.sleep(n / HTTP_LIVE)  # spread over the second
            while not stop.is_set():
                try:
                    status, text = await send("PUT", n % 3, "/nacos/v1/ns/instance/beat",
                                              {"serviceName": HTTP_SVC, "ip": ip, "port": port})
                    counts["beats"] += 1
                    counts["beat_errors"] += status != 200
                    counts["beat_20404"] += '"code":20404' in text.replace(" ", "")
                except (TimeoutError, aiohttp.ClientError):
                    counts["beat_errors"] += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

        async def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                params = {"serviceName": f"churn-{w % 4}", "ip": f"10.23.{w}.{n % 250 + 1}", "port": 7000}
                for method in ("POST", "DELETE"):
                    try:
                        status, _ = await send(method, (w + n) % 3, "/nacos/v1/ns/instance", params)
                        counts["writes" if status == 200 else "write_errors"] += 1
                    except (TimeoutError, aiohttp.ClientError):
                        counts["write_errors"] += 1

        async def observer(t0: float) -> None:
            while not stop.is_set():
                for i in nodes:
                    for service, live in ((HTTP_SVC, http_live), (SDK_SVC, sdk_live)):
                        status, text = await send("GET", i, "/nacos/v1/ns/instance/list",
                                                  {"serviceName": service, "healthyOnly": "false"})
                        assert status == 200, text
                        counts["polls"] += 1
                        seen = {(h["ip"], int(h["port"])) for h in json.loads(text)["hosts"]
                                if h.get("healthy", True)}
                        gone = sorted(f"{a}:{p}" for a, p in set(live) - seen)
                        if gone:
                            missing.append(f"{time.monotonic() - t0:.1f} s node {i} {service}: {gone[:5]} "
                                           f"({len(gone)} missing or unhealthy)")
                await asyncio.sleep(0.5)

        poll_until(lambda: all(len(cluster.instance_ips(i, HTTP_SVC)) == HTTP_LIVE
                          and len(cluster.instance_ips(i, SDK_SVC)) == SDK_LIVE for i in nodes), 20,
              what="every live instance on every node")
        t0 = time.monotonic()
        tasks = [*(asyncio.create_task(beater(n)) for n in range(HTTP_LIVE)),
                 *(asyncio.create_task(writer(w)) for w in range(WRITERS)), asyncio.create_task(observer(t0))]
        try:
            await asyncio.sleep(LOAD_S)
        finally:
            stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for client in clients:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.shutdown(), 10)
        for result in results:
            if isinstance(result, BaseException):
                raise result
    elapsed = time.monotonic() - t0
    logs = {i: cluster.nodes[i].log() for i in nodes}
    removed = [m.group(0) for text in logs.values() for m in REMOVED.finditer(text)]
    print(f"no false expiry: {elapsed:.0f} s, writes {counts['writes'] / elapsed:.0f}/s "
          f"({counts['write_errors']} errors), beats {counts['beats'] / elapsed:.0f}/s ({counts['beat_errors']} "
          f"errors, {counts['beat_20404']} answered 20404), {counts['polls']} polls, {len(missing)} with a live "
          f"instance missing, {len(removed)} removals of live instances in the node logs")
    assert counts["writes"] > 0 and counts["polls"] > 0
    assert not missing, "\n".join(missing[:20])
    assert not removed, removed[:20]
    assert counts["beat_20404"] == 0
    assert sum(tracebacks(text) for text in logs.values()) == 0
