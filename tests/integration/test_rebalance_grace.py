"""The grace period of clients moved by rebalancing, on real processes (beyond Nacos).

A client moved by the loader keeps its instances listed until it has registered again on its
new node or ``shoal.rebalance.grace-ms`` passes, so a subscriber on another node never sees a
false removal; a client that simply disconnects is removed at once, as in Nacos.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from v2.nacos import RegisterInstanceParam

from shoal.testing import ServerProcess, wait_until
from shoal.testing.moving import (
    JAVA,
    PYTHON,
    MovingClient,
    PushRecorder,
    aloader,
    client_ids,
    instance_body,
    listed,
    python_connections,
)


class Watch:
    """Polls one node's instance list and records its subscriber's pushes throughout a move."""

    def __init__(self, port: int, service: str) -> None:
        self.port = port
        self.service = service
        self.recorder = PushRecorder(port, service)
        self.polls: list[frozenset[str]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, instance: str) -> None:
        await self.recorder.start()
        await wait_until(lambda: instance in self.recorder.latest(), timeout=15, what="the first push")
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            self.polls.append(await asyncio.to_thread(listed, self.port, self.service))
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.recorder.stop()

    def assert_never_lacked(self, instance: str) -> None:
        first = next(i for i, (_, hosts) in enumerate(self.recorder.pushes) if instance in hosts)
        missing_pushes = [hosts for _, hosts in self.recorder.pushes[first:] if instance not in hosts]
        missing_polls = [hosts for hosts in self.polls if instance not in hosts]
        assert self.polls, "the subscriber's node was never polled"
        assert not missing_pushes, f"pushed without {instance}: {missing_pushes}"
        assert not missing_polls, f"listed without {instance} in {len(missing_polls)} of {len(self.polls)} polls"


@contextlib.asynccontextmanager
async def watching(port: int, service: str, instance: str) -> AsyncIterator[Watch]:
    watch = Watch(port, service)
    try:
        await watch.start(instance)
        yield watch
    finally:
        await watch.stop()


async def gone_everywhere(ports: list[int], client_id: str) -> bool:
    for port in ports:
        if client_id in await asyncio.to_thread(client_ids, port):
            return False
    return True


async def test_a_java_like_client_moved_by_the_loader_is_never_missing_for_a_subscriber(
        three_nodes: Callable[..., list[ServerProcess]]) -> None:
    a, b, c = (n.port for n in three_nodes())
    service, instance = "graced-java", "10.50.0.1:8080"
    # the Java SDK registers again on its redo task (every 3 s) after following the reset
    mover = MovingClient([a, b, c], a, JAVA, instance_body(service, "10.50.0.1", 8080), redo_delay=2.0)
    await mover.start()
    try:
        old_id = mover.connection_id
        await wait_until(lambda: asyncio.to_thread(lambda: instance in listed(c, service)), timeout=15)
        async with watching(c, service, instance) as watch:
            assert await aloader(a, f"reloadClient?connectionId={old_id}&redirectAddress=127.0.0.1:{b}") \
                == "success"
            await wait_until(lambda: mover.port == b and len(mover.registered_at) == 2, timeout=30,
                             what="the client to register again on b")
            await wait_until(lambda: gone_everywhere([a, b, c], old_id), timeout=30,
                             what="the moved client's old copy to be released")
            await wait_until(lambda: len(watch.polls) > 3, timeout=10)  # a few polls after the release
        watch.assert_never_lacked(instance)
        assert await asyncio.to_thread(listed, a, service) == {instance}
    finally:
        await mover.stop()


async def test_nacos_sdk_python_moved_by_closing_its_stream_is_never_missing_for_a_subscriber(
        three_nodes: Callable[..., list[ServerProcess]], sdk: Any) -> None:
    ports = [n.port for n in three_nodes()]
    service, instance = "graced-python", "10.50.0.2:8080"
    client = await sdk(",".join(f"127.0.0.1:{p}" for p in ports))
    await client.register_instance(RegisterInstanceParam(service_name=service, ip="10.50.0.2", port=8080))

    (old_id, home), = (await wait_until(lambda: python_connections(ports), what="the SDK's connection")).items()
    elsewhere = [p for p in ports if p != home]
    await wait_until(lambda: asyncio.to_thread(lambda: instance in listed(elsewhere[1], service)), timeout=15)
    async with watching(elsewhere[1], service, instance) as watch:
        assert await aloader(home, f"reloadClient?connectionId={old_id}&redirectAddress=127.0.0.1:{elsewhere[0]}") \
            == "success"

        async def registered_again() -> bool:
            now = await python_connections(ports)
            if not now or old_id in now:
                return False
            (new_id, _), = now.items()
            return new_id in await asyncio.to_thread(client_ids, ports[0])

        # it registers again on its new connection on its redo tick (30 s), then the old copy goes
        await wait_until(registered_again, timeout=60, interval=0.5, what="the SDK to reconnect")
        await wait_until(lambda: gone_everywhere(ports, old_id), timeout=60, interval=0.5,
                         what="the moved client's old copy to be released after the SDK's redo")
        await wait_until(lambda: len(watch.polls) > 3, timeout=10)
    watch.assert_never_lacked(instance)


async def test_a_moved_client_that_never_comes_back_is_removed_after_the_grace_period(
        three_nodes: Callable[..., list[ServerProcess]]) -> None:
    nodes = three_nodes("-D", "shoal.rebalance.grace-ms=4000")
    a, b, c = (n.port for n in nodes)
    service, instance = "graced-gone", "10.50.0.3:8080"
    mover = MovingClient([a, b, c], a, PYTHON, instance_body(service, "10.50.0.3", 8080), reconnect=False)
    await mover.start()
    witness = MovingClient([a, b, c], b, JAVA, None)
    await witness.start()
    try:
        old_id = mover.connection_id
        await wait_until(lambda: asyncio.to_thread(lambda: instance in listed(c, service)), timeout=15)
        assert await aloader(a, f"reloadClient?connectionId={old_id}") == "success"
        await wait_until(lambda: mover.moves == 1, timeout=15, what="the server to close the stream")
        # its connection is gone but its instance is still listed everywhere: kept, not released
        assert old_id not in await aloader(a, "current")
        for port in (a, b, c):
            assert instance in await asyncio.to_thread(listed, port, service)
        assert nodes[0].gauge("moved_clients_kept") == 1

        def removed() -> bool:
            return all(instance not in listed(p, service) for p in (a, b, c))

        await wait_until(lambda: asyncio.to_thread(removed), timeout=30, interval=0.2,
                         what="the instance to go after the grace period")
        assert await gone_everywhere([a, b, c], old_id)
        assert nodes[0].gauge("moved_clients_kept") == 0
        # nothing brings it back: a later registration on b reaches every node, the old one stays gone
        marker = await witness.client.call("InstanceRequest", instance_body(service, "10.50.0.4", 1))  # type: ignore[union-attr]
        assert marker[1]["resultCode"] == 200
        await wait_until(lambda: asyncio.to_thread(
            lambda: all(listed(p, service) == {"10.50.0.4:1"} for p in (a, b, c))), timeout=15)
    finally:
        await mover.stop()
        await witness.stop()


async def test_a_client_that_simply_disconnects_is_removed_at_once_and_a_restart_keeps_nothing(
        three_nodes: Callable[..., list[ServerProcess]]) -> None:
    nodes = three_nodes()  # the default grace period (45 s): both removals below come well before it
    a, b, c = (n.port for n in nodes)
    service = "graced-plain"
    plain = MovingClient([a, b, c], a, JAVA, instance_body(service, "10.50.0.5", 8080), reconnect=False)
    moved = MovingClient([a, b, c], a, PYTHON, instance_body(service, "10.50.0.6", 8080), reconnect=False)
    await asyncio.gather(plain.start(), moved.start())
    try:
        await wait_until(lambda: asyncio.to_thread(lambda: len(listed(c, service)) == 2), timeout=15)
        await plain.stop()  # not moved: goes as in Nacos
        await wait_until(lambda: asyncio.to_thread(
            lambda: all(listed(p, service) == {"10.50.0.6:8080"} for p in (a, b, c))), timeout=15,
            what="a plain disconnect to be removed at once")

        assert await aloader(a, f"reloadClient?connectionId={moved.connection_id}") == "success"
        await wait_until(lambda: moved.moves == 1, timeout=15)
        assert "10.50.0.6:8080" in await asyncio.to_thread(listed, b, service)  # kept
        # the node holding it restarts: its kept clients die with it, peers are told on its load
        nodes[0].kill()
        nodes[0].start().wait_ready(timeout=30)
        await wait_until(lambda: asyncio.to_thread(
            lambda: all(listed(p, service) == frozenset() for p in (a, b, c))), timeout=30,
            what="the kept client of the restarted node to be removed everywhere")
    finally:
        await moved.stop()
