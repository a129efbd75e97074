"""Persistent registrations on three real nodes with managed etcd members.

Starts three ``shoal server`` processes with ``--members`` (each runs its etcd member), then:

* **register**: ``--count`` persistent registrations over HTTP v1 to node A, ``--concurrency``
  at a time, timing each answer (the answer comes once A's view holds the write);
* **visible**: for a sample of them, the time until node C lists the instance (watch to
  visible on another node), polled every 5 ms;
* **etcd puts**: the same number of raw puts through etcd's v3 JSON gateway of A's member,
  same concurrency, in the same run, so the store's own rate is the reference.

Prints ops/s and p50/p99 of each, with the load average. Never part of the test suite::

    PYTHONPATH=src python bench/cp/persistent_register.py --count 500 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from shoal.testing import OPEN, ServerSet, free_port_block

OFFSETS = (-1000, -999, 0, 1000, 1001)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def timed(n: int, concurrency: int, one: object) -> tuple[float, list[float]]:
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def run(i: int) -> None:
        async with slots:
            t0 = time.perf_counter()
            await one(i)  # type: ignore[operator]
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(n)))
    return n / (time.perf_counter() - start), latencies


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="cp-bench-"))
    ports: list[int] = []
    for _ in range(3):
        ports.append(free_port_block(OFFSETS, avoid=ports))
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    with ServerSet(root, auth=OPEN) as servers:
        nodes = [servers.start(p, ["--members", members]) for p in ports]
        for node in nodes:
            node.wait_ready(60)
        a, _b, c = nodes
        async with aiohttp.ClientSession() as http:
            async def register(i: int) -> None:
                params = {"serviceName": f"bench-{i % 50}", "ip": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                          "port": "9000", "ephemeral": "false"}
                async with http.post(a.url("/nacos/v1/ns/instance"), params=params) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"register {i}: {resp.status} {await resp.text()}")

            reg_rate, reg_lat = await timed(args.count, args.concurrency, register)

            visible: list[float] = []
            for i in range(args.count, args.count + args.sample):
                service, ip = f"vis-{i}", f"10.200.{i // 256 % 256}.{i % 256}"
                t0 = time.perf_counter()
                await register_one(http, a, service, ip)
                while True:
                    async with http.get(c.url("/nacos/v1/ns/instance/list"), params={"serviceName": service}) as r:
                        if json.loads(await r.text())["hosts"]:
                            break
                    await asyncio.sleep(0.005)
                visible.append(time.perf_counter() - t0)

            etcd_url = f"http://127.0.0.1:{a.port - 1000}/v3/kv/put"

            async def put(i: int) -> None:
                body = {"key": base64.b64encode(f"/bench/{i}".encode()).decode(),
                        "value": base64.b64encode(b'{"ip":"10.0.0.1","port":9000}').decode()}
                async with http.post(etcd_url, json=body) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"etcd put {i}: {resp.status}")

            put_rate, put_lat = await timed(args.count, args.concurrency, put)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.count} ops, concurrency {args.concurrency}")
    print(f"persistent register (HTTP v1 on A): {reg_rate:8.0f} ops/s  p50 {pct(reg_lat, .5):6.1f} ms  "
          f"p99 {pct(reg_lat, .99):6.1f} ms")
    print(f"etcd v3 gateway put (A's member):   {put_rate:8.0f} ops/s  p50 {pct(put_lat, .5):6.1f} ms  "
          f"p99 {pct(put_lat, .99):6.1f} ms")
    print(f"register on A -> listed on C ({args.sample} samples): p50 {statistics.median(visible) * 1000:6.1f} ms  "
          f"p99 {pct(visible, .99):6.1f} ms")


async def register_one(http: aiohttp.ClientSession, node: object, service: str, ip: str) -> None:
    params = {"serviceName": service, "ip": ip, "port": "9000", "ephemeral": "false"}
    async with http.post(node.url("/nacos/v1/ns/instance"), params=params) as resp:  # type: ignore[attr-defined]
        if resp.status != 200:
            raise RuntimeError(f"register {service}: {resp.status}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sample", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
