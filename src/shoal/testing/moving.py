"""Clients that behave as the SDKs do when rebalancing moves them, and a subscriber that records
what it is pushed; shared by the rebalancing tests and ``bench/rebalance``.

A Java-like client follows ConnectResetRequest to the server it names and registers its
instance again ``redo_delay`` seconds later (the Java SDK's redo task runs every 3 s); a
Python-like one (nacos-sdk-python 3.2.0 cannot parse the reset) is closed by the server,
reconnects to a server of its list and registers again after ``redo_delay`` (the real SDK's
redo tick is 30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from typing import Any

from shoal.testing.http import http_get
from shoal.testing.rawclient import RawClient, register_body

JAVA = "Nacos-Java-Client:v2.5.1"
PYTHON = "Nacos-Python-Client:v3.2.0"


class MovingClient:
    """One SDK-like connection that follows resets (Java) or reconnects when closed (Python).

    With ``instance`` (an InstanceRequest body) it registers when started and again on every new
    connection, ``redo_delay`` seconds after connecting; with ``reconnect=False`` it never comes back once moved.
    """

    def __init__(self, ports: list[int], first: int, version: str, instance: dict[str, Any] | None = None,
                 redo_delay: float = 0.0, reconnect: bool = True) -> None:
        self.ports = ports
        self.version = version
        self.port = first
        self.instance = instance
        self.redo_delay = redo_delay
        self.reconnect = reconnect
        self.client: RawClient | None = None
        self.connection_id = ""
        self.moves = 0
        self.registered_at: list[float] = []  #: time.monotonic() of each successful registration
        self._task: asyncio.Task[None] | None = None
        self._redo: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        await self._connect(self.port)
        if self.instance is not None:
            await self._register()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _connect(self, port: int) -> None:
        client = RawClient(port + 1000)
        try:
            kind, body = await client.call("ServerCheckRequest", {"headers": {}, "module": "internal"})
            assert kind == "ServerCheckResponse"
            await client.open_stream()
            await client.send("ConnectionSetupRequest", {
                "headers": {}, "clientVersion": self.version, "tenant": "",
                "labels": {"source": "sdk", "module": "naming"}, "abilityTable": {}, "module": "internal"})
            kind, _ = await client.receive()
            assert kind == "SetupAckRequest"
        except BaseException:
            with contextlib.suppress(Exception):
                await client.close()
            raise
        self.client, self.port, self.connection_id = client, port, str(body["connectionId"])

    async def _register(self) -> None:
        assert self.client is not None and self.instance is not None
        kind, body = await self.client.call("InstanceRequest", self.instance)
        if kind == "InstanceResponse" and body.get("resultCode") == 200:
            self.registered_at.append(time.monotonic())

    async def _redo_later(self) -> None:
        await asyncio.sleep(self.redo_delay)
        with contextlib.suppress(Exception):
            await self._register()

    async def _run(self) -> None:
        while not self._stopped:
            client = self.client
            assert client is not None
            target: int | None = None
            try:
                kind, body = await client.receive(timeout=3600)
                if "requestId" in body:
                    await client.send(kind.replace("Request", "Response"), {
                        "resultCode": 200, "errorCode": 0, "success": True, "requestId": body["requestId"]})
                if kind != "ConnectResetRequest" or self.version == PYTHON:
                    continue
                target = int(body["serverPort"]) if body.get("serverPort") else random.choice(self.ports)
            except asyncio.CancelledError:
                raise
            except Exception:  # the server closed the stream: reconnect to a server of the list
                target = random.choice(self.ports)
            with contextlib.suppress(Exception):
                await client.close()
            self.moves += 1
            if not self.reconnect:
                return
            for _ in range(200):
                try:
                    await self._connect(target)
                    break
                except Exception:
                    await asyncio.sleep(0.1)
                    target = random.choice(self.ports)
            if self.instance is not None:
                if self.redo_delay:
                    self._redo = asyncio.get_running_loop().create_task(self._redo_later())
                else:
                    with contextlib.suppress(Exception):
                        await self._register()

    async def stop(self) -> None:
        self._stopped = True
        for task in (self._task, self._redo):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()


class PushRecorder:
    """A raw gRPC subscriber of one service on one node, recording every push it is sent."""

    def __init__(self, port: int, service: str) -> None:
        self.port = port
        self.service = service
        self.pushes: list[tuple[float, frozenset[str]]] = []  #: (time.monotonic(), {"ip:port", ...})
        self.client = RawClient(port + 1000)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.client.connect()
        kind, body = await self.client.call("SubscribeServiceRequest", {
            "headers": {}, "namespace": "public", "serviceName": self.service, "groupName": "DEFAULT_GROUP",
            "subscribe": True, "clusters": "", "module": "naming"})
        assert kind == "SubscribeServiceResponse", body
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            kind, body = await self.client.receive(timeout=3600)
            if kind == "NotifySubscriberRequest":
                hosts = body.get("serviceInfo", {}).get("hosts") or []
                self.pushes.append((time.monotonic(), frozenset(f"{h['ip']}:{h['port']}" for h in hosts)))
            if "requestId" in body:
                await self.client.send(kind.replace("Request", "Response"), {
                    "resultCode": 200, "errorCode": 0, "success": True, "requestId": body["requestId"]})

    def latest(self) -> frozenset[str]:
        return self.pushes[-1][1] if self.pushes else frozenset()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.client.close()


def listed(port: int, service: str) -> frozenset[str]:
    """The instances a node answers for ``service`` on the v1 Open API."""
    status, text = http_get(f"http://127.0.0.1:{port}/nacos/v1/ns/instance/list?serviceName={service}", timeout=5)
    assert status == 200, text
    return frozenset(f"{h['ip']}:{h['port']}" for h in json.loads(text)["hosts"])


def client_ids(port: int) -> list[str]:
    """Every naming client a node holds (its own and replicated)."""
    status, text = http_get(f"http://127.0.0.1:{port}/nacos/v2/ns/client/list", timeout=5)
    assert status == 200, text
    return list(json.loads(text)["data"])


def loader(port: int, path: str) -> Any:
    status, text = http_get(f"http://127.0.0.1:{port}/nacos/v2/core/loader/{path}", timeout=5)
    assert status == 200, text
    try:
        return json.loads(text)
    except ValueError:
        return text


def counts(port: int) -> dict[int, int]:
    summary = loader(port, "cluster")
    return {int(d["address"].rpartition(":")[2]): int(d["metric"]["sdkConCount"]) for d in summary["detail"]}


async def aloader(port: int, path: str) -> Any:
    """:func:`loader` off the loop, so the clients keep answering while the test waits."""
    return await asyncio.to_thread(loader, port, path)


async def acounts(port: int) -> dict[int, int]:
    return await asyncio.to_thread(counts, port)


async def python_connections(ports: list[int]) -> dict[str, int]:
    """Connection id -> node port of every nacos-sdk-python connection on the nodes of ``ports``."""
    found: dict[str, int] = {}
    for port in ports:
        for conn_id, conn in (await aloader(port, "current")).items():
            if conn["metaInfo"]["version"].startswith("Nacos-Python-Client"):
                found[conn_id] = port
    return found


def instance_body(service: str, ip: str, port: int) -> dict[str, Any]:
    return register_body(service, ip=ip, port=port)
