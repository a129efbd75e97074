"""Nacos 3.x naming fuzzy watch on real processes, spoken by a raw gRPC client on the proto.

The watcher answers every server request on its stream (as a 3.x SDK does) and records it, so a
test reads the sync and change notifications in the order the node sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, ServerProcess, free_port_block, kill, start_server, wait_until
from shoal.testing.rawclient import PYTHON_LABELS, RawClient, register_body

PATTERN_A = "public>>DEFAULT_GROUP>>fz-a*"


def key(name: str, group: str = "DEFAULT_GROUP", namespace: str = "public") -> str:
    return f"{namespace}@@{group}@@{name}"


class Watcher:
    """A raw connection that acks every server request and keeps the fuzzy-watch ones."""

    def __init__(self, grpc_port: int) -> None:
        self.client = RawClient(grpc_port)
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.ack: dict[str, Any] = {}
        self.last_kind = ""
        self._reader: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        kind, _ = await self.client.call("ServerCheckRequest", {"headers": {}, "module": "internal"})
        assert kind == "ServerCheckResponse"
        await self.client.open_stream()
        await self.client.send("ConnectionSetupRequest", {
            "headers": {}, "clientVersion": "Nacos-Java-Client:v3.0.3", "tenant": "", "labels": PYTHON_LABELS,
            "abilityTable": {}, "module": "internal"})
        kind, self.ack = await self.client.receive()
        assert kind == "SetupAckRequest"
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(EOFError, asyncio.CancelledError):
            while True:
                kind, body = await self.client.receive(timeout=3600)
                if "requestId" in body:
                    await self.client.send(kind.replace("Request", "Response"), {
                        "resultCode": 200, "errorCode": 0, "success": True, "requestId": body["requestId"]})
                if kind.startswith("NamingFuzzyWatch"):
                    self.received.append((kind, body))

    async def watch(self, pattern: str, received: list[str] | None = None, initializing: bool = True,
                    watch_type: str = "WATCH") -> dict[str, Any]:
        kind, reply = await self.client.call("NamingFuzzyWatchRequest", {
            "headers": {}, "module": "naming", "namespace": "public", "groupKeyPattern": pattern,
            "watchType": watch_type, "receivedGroupKeys": received or [], "initializing": initializing})
        self.last_kind = kind
        return reply

    def syncs(self, pattern: str) -> list[dict[str, Any]]:
        return [b for k, b in self.received if k == "NamingFuzzyWatchSyncRequest" and b["groupKeyPattern"] == pattern]

    def changes(self) -> list[tuple[str, str]]:
        return [(b["serviceKey"], b["changedType"]) for k, b in self.received
                if k == "NamingFuzzyWatchChangeNotifyRequest"]

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.client.close()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., Any]]:
    made: list[Any] = []

    async def factory(port: int, watcher: bool = False) -> Any:
        client = Watcher(port) if watcher else RawClient(port)
        made.append(client)
        await client.connect()
        return client

    yield factory
    for client in made:
        await client.close()


async def register(client: RawClient, service: str, port: int = 80) -> None:
    kind, reply = await client.call("InstanceRequest", register_body(service, port=port))
    assert kind == "InstanceResponse" and reply["resultCode"] == 200, reply


async def test_initial_sync_in_batches_then_changes_then_cancel(servers: Callable[..., ServerProcess],
                                                                 clients: Callable[..., Any]) -> None:
    server = servers("-D", "shoal.naming.fuzzy-watch.sync-batch-size=2")
    publisher = await clients(server.grpc_port)
    for name in ("fz-a1", "fz-a2", "fz-a3", "fz-b1"):
        await register(publisher, name)
    watcher: Watcher = await clients(server.grpc_port, watcher=True)
    assert watcher.ack["abilityTable"].get("fuzzyWatch") is True

    reply = await watcher.watch(PATTERN_A)
    assert watcher.last_kind == "NamingFuzzyWatchResponse" and reply["resultCode"] == 200
    await wait_until(lambda: any(s["syncType"] == "FINISH_FUZZY_WATCH_INIT_NOTIFY" for s in watcher.syncs(PATTERN_A)))
    syncs = watcher.syncs(PATTERN_A)
    inits = [s for s in syncs if s["syncType"] == "FUZZY_WATCH_INIT_NOTIFY"]
    assert [(s["currentBatch"], s["totalBatch"]) for s in inits] == [(1, 2), (2, 2)]
    assert syncs[-1]["syncType"] == "FINISH_FUZZY_WATCH_INIT_NOTIFY"
    synced = {(c["serviceKey"], c["changedType"]) for s in inits for c in s["contexts"]}
    assert synced == {(key(n), "ADD_SERVICE") for n in ("fz-a1", "fz-a2", "fz-a3")}

    # A reconnecting client sends what it has: it gets only the difference.
    await watcher.watch(PATTERN_A, [key("fz-a1"), key("fz-a2"), key("fz-gone")], initializing=False)
    await wait_until(lambda: any(s["syncType"] == "FUZZY_WATCH_DIFF_SYNC_NOTIFY" for s in watcher.syncs(PATTERN_A)))
    diff = [c for s in watcher.syncs(PATTERN_A) if s["syncType"] == "FUZZY_WATCH_DIFF_SYNC_NOTIFY"
            for c in s["contexts"]]
    assert sorted((c["serviceKey"], c["changedType"]) for c in diff) == [
        (key("fz-a3"), "ADD_SERVICE"), (key("fz-gone"), "DELETE_SERVICE")]

    # A new matching service is added; one that does not match is not reported.
    await register(publisher, "fz-b2")
    await register(publisher, "fz-a4")
    await wait_until(lambda: (key("fz-a4"), "ADD_SERVICE") in watcher.changes())
    assert all(k != key("fz-b2") for k, _ in watcher.changes())
    change = next(b for k, b in watcher.received if k == "NamingFuzzyWatchChangeNotifyRequest")
    assert change["syncType"] == "FUZZY_WATCH_RESOURCE_CHANGED" and change["module"] == "naming"

    # The publisher goes: every service it held is removed.
    await publisher.close()
    await wait_until(lambda: {(key(n), "DELETE_SERVICE") for n in ("fz-a1", "fz-a2", "fz-a3", "fz-a4")}
                     <= set(watcher.changes()))

    # Cancelled: a new match is no longer reported (a later watched pattern's change proves the order).
    assert (await watcher.watch(PATTERN_A, watch_type="CANCEL_WATCH"))["resultCode"] == 200
    other = "public>>DEFAULT_GROUP>>fz-c*"
    await watcher.watch(other)
    publisher2 = await clients(server.grpc_port)
    await register(publisher2, "fz-a5")
    await register(publisher2, "fz-c1")
    await wait_until(lambda: (key("fz-c1"), "ADD_SERVICE") in watcher.changes())
    assert (key("fz-a5"), "ADD_SERVICE") not in watcher.changes()


async def test_pattern_and_match_limits_answer_nacos_codes(servers: Callable[..., ServerProcess],
                                                            clients: Callable[..., Any]) -> None:
    server = servers("-D", "nacos.naming.fuzzy.watch.max.pattern.count=2",
                     "-D", "nacos.naming.fuzzy.watch.max.pattern.match.service.count=2")
    publisher = await clients(server.grpc_port)
    for name in ("fz-a1", "fz-a2", "fz-a3"):
        await register(publisher, name)
    watcher: Watcher = await clients(server.grpc_port, watcher=True)

    over_match = await watcher.watch(PATTERN_A)
    # A limit is the typed response with resultCode 500 (NamingFuzzyWatchResponse.setErrorInfo).
    assert watcher.last_kind == "NamingFuzzyWatchResponse"
    assert (over_match["resultCode"], over_match["errorCode"]) == (500, 50311)
    assert over_match["message"] == "fuzzy watch pattern matched count over limit"
    # The watch is kept and synced with what it could track.
    await wait_until(lambda: any(s["syncType"] == "FINISH_FUZZY_WATCH_INIT_NOTIFY" for s in watcher.syncs(PATTERN_A)))
    assert sum(len(s["contexts"]) for s in watcher.syncs(PATTERN_A)) == 2

    assert (await watcher.watch("public>>G2>>*"))["resultCode"] == 200
    over_patterns = await watcher.watch("public>>G3>>*")
    assert watcher.last_kind == "NamingFuzzyWatchResponse"
    assert (over_patterns["resultCode"], over_patterns["errorCode"]) == (500, 50310)
    # An existing pattern is still accepted, and a cancelled one frees its place.
    assert (await watcher.watch("public>>G2>>*", initializing=False))["resultCode"] == 200
    await watcher.watch("public>>G2>>*", watch_type="CANCEL_WATCH")
    assert (await watcher.watch("public>>G3>>*"))["resultCode"] == 200

    # A malformed request is an ErrorResponse 400, as for any naming request.
    bad = await watcher.watch("no-splitter")
    assert (watcher.last_kind, bad["errorCode"]) == ("ErrorResponse", 400)
    bad_type = await watcher.watch(PATTERN_A, watch_type="SOMETHING")
    assert bad_type["errorCode"] == 400


async def test_services_created_on_another_node_are_reported(tmp_path: Path, clients: Callable[..., Any]) -> None:
    ports = [free_port_block() for _ in range(3)]
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    nodes = [start_server(tmp_path, ["--members", members, "-D", "shoal.member.report-interval-ms=300"],
                          port=p, wait=False, auth=OPEN) for p in ports]
    try:
        for node in nodes:
            node.wait_ready()
        watcher: Watcher = await clients(nodes[0].grpc_port, watcher=True)
        assert (await watcher.watch(PATTERN_A))["resultCode"] == 200
        publisher = await clients(nodes[1].grpc_port)
        await register(publisher, "fz-a-remote")
        await register(publisher, "fz-b-remote")
        await wait_until(lambda: (key("fz-a-remote"), "ADD_SERVICE") in watcher.changes(), timeout=15)
        other = await clients(nodes[2].grpc_port)
        await register(other, "fz-a-third")
        await wait_until(lambda: (key("fz-a-third"), "ADD_SERVICE") in watcher.changes(), timeout=15)
        await publisher.close()  # its instances go from every node, by Distro DELETE
        await wait_until(lambda: (key("fz-a-remote"), "DELETE_SERVICE") in watcher.changes(), timeout=15)
        assert all(k != key("fz-b-remote") for k, _ in watcher.changes())
    finally:
        for node in nodes:
            kill(node)
