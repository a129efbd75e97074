"""CPU a standalone node spends health-checking ``--count`` persistent instances.

Registers the instances (over HTTP v1, ``ephemeral=false``) spread over 100 services, all on one
loopback TCP listener this script keeps open (every check is a real connect that succeeds),
waits until the checker has run a full round, then reads the node's CPU time (``/proc``) and
its ``shoal_health_checks_total`` over ``--seconds``. Prints CPU per second and checks per
second, with the load average. Never part of the test suite::

    PYTHONPATH=src python bench/cp/health_cpu.py --count 10000 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import time
from pathlib import Path

import aiohttp

from shoal.testing import OPEN, ServerSet


async def main(args: argparse.Namespace) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = int(listener.getsockname()[1])
    accepted = 0

    async def drain() -> None:  # accept and close, so the backlog never fills
        nonlocal accepted
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.close()
            accepted += 1

    acceptor = asyncio.get_running_loop().create_task(drain())
    with ServerSet(Path(tempfile.mkdtemp(prefix="cp-health-")), auth=OPEN) as servers:
        node = servers.start(args=["-D", f"shoal.health.check-concurrency={args.concurrency}"])
        node.wait_ready(30)
        slots = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as http:
            async def register(i: int) -> None:
                params = {"serviceName": f"hc-{i % 100}", "ip": "127.0.0.1", "port": str(port),
                          "clusterName": f"c{i // 100}", "ephemeral": "false"}
                async with slots, http.post(node.url("/nacos/v1/ns/instance"), params=params) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"register {i}: {resp.status} {await resp.text()}")

            t0 = time.perf_counter()
            await asyncio.gather(*(register(i) for i in range(args.count)))
            reg_s = time.perf_counter() - t0
        await asyncio.sleep(8)  # one full round (interval 2 s + jitter up to 5 s) before measuring
        cpu0, checks0 = node.cpu_s() or 0.0, node.metric("health_checks_total")
        t0 = time.perf_counter()
        await asyncio.sleep(args.seconds)
        elapsed = time.perf_counter() - t0
        cpu1, checks1 = node.cpu_s() or 0.0, node.metric("health_checks_total")
    acceptor.cancel()
    listener.close()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.count} persistent instances "
          f"(registered in {reg_s:.1f} s)")
    print(f"health checks: {(checks1 - checks0) / elapsed:8.0f} /s; node CPU {100 * (cpu1 - cpu0) / elapsed:5.1f}% "
          f"of one core over {elapsed:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
