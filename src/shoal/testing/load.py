"""A node's ordinary traffic, in the background, for tests that need a node *under load*.

:class:`MixedLoad` runs on its own asyncio loop in a daemon thread (the tests around it are
synchronous and send their faults from threads of their own), against every node of a cluster,
with real clients only, as the soak does (``bench/soak``) on a smaller scale:

* ``beating`` ip:port instances registered over HTTP and beating every ``beat_s``;
* ``writers`` closed-loop HTTP register/deregister writers;
* ``churners`` loops opening a real nacos-sdk-python 3.x client on some node, registering one
  instance, keeping it a moment and shutting it down;
* one SDK subscriber per node and console reads (``catalog/services``, ``catalog/instances``)
  every ``console_s``.

Errors are counted, never raised: a fault under test may refuse some of the traffic.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from shoal.testing.procs import ServerProcess


class MixedLoad:
    """Start with :meth:`start` (returns once the load runs), end with :meth:`stop`; ``ok`` and
    ``errors`` count the answered and the failed calls."""

    def __init__(self, nodes: Sequence[ServerProcess], tmp: Path, *, beating: int = 50, writers: int = 4,
                 churners: int = 3, beat_s: float = 2.0, console_s: float = 1.0, service: str = "load") -> None:
        self.nodes, self.tmp, self.service = list(nodes), tmp, service
        self.beating, self.writers, self.churners = beating, writers, churners
        self.beat_s, self.console_s = beat_s, console_s
        self.ok = 0
        self.errors = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mixed-load", daemon=True)
        self._stop: asyncio.Event | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._started = threading.Event()

    def __enter__(self) -> MixedLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> MixedLoad:
        self._thread.start()
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        if not self._started.wait(timeout):
            raise TimeoutError("the load did not start")
        return self

    def stop(self, timeout: float = 60.0) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            with contextlib.suppress(Exception):
                self._main.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        # The loop is left open: the SDK's grpc.aio objects still call into it when they are
        # finalized later ("Event loop is closed" otherwise); it holds no socket any more.

    # --- the load ----------------------------------------------------------------------------
    def _count(self, ok: bool) -> None:
        if ok:
            self.ok += 1
        else:
            self.errors += 1

    async def _call(self, session: aiohttp.ClientSession, method: str, node: int, path: str,
                    params: dict[str, Any]) -> bool:
        try:
            async with session.request(method, self.nodes[node % len(self.nodes)].url(path), params=params,
                                       timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
                ok = resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        self._count(ok)
        return ok

    async def _wait(self, seconds: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _beating(self, session: aiohttp.ClientSession, n: int) -> None:
        assert self._stop is not None
        params = {"serviceName": self.service, "ip": f"10.90.{n // 250}.{n % 250 + 1}", "port": 9000}
        await self._call(session, "POST", n, "/nacos/v1/ns/instance", params)
        await self._wait(self.beat_s * (n % 50) / 50)  # spread the beats
        while not self._stop.is_set():
            await self._call(session, "PUT", n, "/nacos/v1/ns/instance/beat", params)
            await self._wait(self.beat_s)

    async def _writer(self, session: aiohttp.ClientSession, w: int) -> None:
        assert self._stop is not None
        n = 0
        while not self._stop.is_set():
            n += 1
            params = {"serviceName": f"{self.service}-write-{w}", "ip": f"10.91.{w}.{n % 250 + 1}", "port": 7000}
            for method in ("POST", "DELETE"):
                if not await self._call(session, method, w + n, "/nacos/v1/ns/instance", params):
                    await self._wait(0.2)

    async def _console(self, session: aiohttp.ClientSession) -> None:
        assert self._stop is not None
        n = 0
        while not self._stop.is_set():
            n += 1
            await self._call(session, "GET", n, "/nacos/v1/ns/catalog/services", {"pageNo": 1, "pageSize": 50})
            await self._call(session, "GET", n, "/nacos/v1/ns/catalog/instances",
                             {"serviceName": self.service, "pageNo": 1, "pageSize": 100})
            await self._wait(self.console_s)

    async def _sdk(self, n: int) -> Any:
        from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService  # type: ignore[import-untyped]

        first = n % len(self.nodes)
        order = [first, *[i for i in range(len(self.nodes)) if i != first]]
        config = (ClientConfigBuilder().server_address(",".join(self.nodes[i].addr for i in order))
                  .log_level("ERROR").log_dir(str(self.tmp / "sdk-logs")).cache_dir(str(self.tmp / "sdk-cache"))
                  .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
        return await NacosNamingService.create_naming_service(config)

    async def _churner(self, c: int) -> None:
        from v2.nacos import RegisterInstanceParam

        assert self._stop is not None
        rnd = random.Random(c)
        n = 0
        while not self._stop.is_set():
            n += 1
            client = None
            try:
                client = await asyncio.wait_for(self._sdk(c + n), 20)
                ok = await client.register_instance(RegisterInstanceParam(
                    service_name=f"{self.service}-conn", ip=f"10.92.{c}.{n % 250 + 1}", port=9200))
                self._count(bool(ok))
                await self._wait(rnd.uniform(1, 4))
            except Exception:  # a refused or dropped connection: counted, the loop goes on
                self._count(False)
                await self._wait(0.5)
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.shutdown(), 10)

    async def _run(self) -> None:
        from v2.nacos import SubscribeServiceParam

        self._stop = asyncio.Event()

        async def pushed(_instances: list[Any]) -> None:
            self.ok += 1

        self._loop.set_exception_handler(lambda _loop, _context: None)  # SDK streams cut at shutdown
        subscribers = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            try:
                for n in range(len(self.nodes)):
                    client = await self._sdk(n)
                    subscribers.append(client)
                    await client.subscribe(SubscribeServiceParam(service_name=self.service, subscribe_callback=pushed))
                tasks = [*(asyncio.create_task(self._beating(session, n)) for n in range(self.beating)),
                         *(asyncio.create_task(self._writer(session, w)) for w in range(self.writers)),
                         *(asyncio.create_task(self._churner(c)) for c in range(self.churners)),
                         asyncio.create_task(self._console(session))]
                self._started.set()
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                self._started.set()
                for client in subscribers:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.shutdown(), 10)
