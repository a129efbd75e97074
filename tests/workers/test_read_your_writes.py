"""Read-your-writes across the workers of one node (docs/workers.md, "Writes wait for the sibling
workers"): an HTTP write is answered only once the node's sibling workers have applied it, so a client
whose next call lands on the other worker sees what it has just written; a gRPC client's write is
answered at once (it reads over its own connection) and reaches the other worker within a small bound."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from shoal.testing import ServerProcess, poll_until, wait_until
from shoal.testing.rawclient import RawClient, register_body
from shoal.testing.workers import call_answered_by, worker_holding, worker_listed_ips

pytestmark = pytest.mark.integration

INSTANCE = "/nacos/v1/ns/instance"
LIST = "/nacos/v1/ns/instance/list"
ROUNDS = 50


def _listed(node: ServerProcess, service: str) -> tuple[set[str], str]:
    """The IPs the public port lists for ``service`` on a connection of its own, and who answered."""
    status, text, worker = call_answered_by("GET", node.url(LIST), {"serviceName": service}, context=node.https)
    assert status == 200, text
    return {h["ip"] for h in json.loads(text)["hosts"]}, worker


def test_an_http_write_is_seen_on_the_next_connection_whichever_worker_answers(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    answered: list[tuple[str, str, str]] = []  # (register, list, edit) workers per round
    stale: list[str] = []
    for n in range(ROUNDS):
        service, ip = f"ryw-{n}", f"10.7.{n // 200}.{n % 200 + 1}"
        status, text, wrote = call_answered_by("POST", node.url(INSTANCE),
                                               {"serviceName": service, "ip": ip, "port": 80}, context=node.https)
        assert status == 200, text
        ips, read = _listed(node, service)
        status, text, edited = call_answered_by("PUT", node.url(INSTANCE),
                                                {"serviceName": service, "ip": ip, "port": 80, "weight": 2},
                                                context=node.https)
        if ips != {ip}:
            stale.append(f"round {n}: registered on worker {wrote}, worker {read} listed {ips}")
        if status != 200:
            stale.append(f"round {n}: registered on worker {wrote}, worker {edited} answered the edit {status} {text}")
        answered.append((wrote, read, edited))
    assert {w for round_ in answered for w in round_} == {"0", "1"}, "the kernel never gave a worker a connection"
    assert any(len(set(round_)) > 1 for round_ in answered), "no round crossed workers"
    assert not stale, "\n".join(stale)


def test_an_http_deregister_is_not_listed_on_the_next_connection(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    crossed = 0
    stale: list[str] = []
    for n in range(ROUNDS):
        service, ip = f"ryw-gone-{n}", f"10.8.0.{n + 1}"
        status, text, _ = call_answered_by("POST", node.url(INSTANCE), {"serviceName": service, "ip": ip, "port": 80},
                                           context=node.https)
        assert status == 200, text
        for index in (0, 1):  # both hold it, so a stale copy could be listed
            poll_until(lambda i=index, s=service, a=ip: worker_listed_ips(node, i, s) == {a},  # type: ignore[misc]
                       10, what=f"worker {index} to list {ip}")
        status, text, wrote = call_answered_by("DELETE", node.url(INSTANCE),
                                               {"serviceName": service, "ip": ip, "port": 80}, context=node.https)
        assert status == 200, text
        ips, read = _listed(node, service)
        crossed += wrote != read
        if ips:
            stale.append(f"round {n}: deregistered on worker {wrote}, worker {read} still listed {ips}")
    assert crossed, "no read landed on the other worker than the deregister"
    assert not stale, "\n".join(stale)


CP_ROUNDS = 30


def _hosts(node: ServerProcess, service: str) -> tuple[dict[str, float], str]:
    """``ip → weight`` the public port lists for ``service`` on a connection of its own, and who answered."""
    status, text, worker = call_answered_by("GET", node.url(LIST), {"serviceName": service}, context=node.https)
    assert status == 200, text
    return {h["ip"]: h["weight"] for h in json.loads(text)["hosts"]}, worker


def _write(node: ServerProcess, method: str, params: dict[str, object], stale: list[str]) -> str:
    """The worker that answered a write; one that found nothing to edit (404) is a stale read too."""
    status, text, worker = call_answered_by(method, node.url(INSTANCE), params, context=node.https)
    if status != 200:
        stale.append(f"{method} {params} on worker {worker}: {status} {text}")
    return worker


def test_an_http_cp_write_is_read_back_on_the_next_connection_whichever_worker_answers(
        two_workers: Callable[..., ServerProcess]) -> None:
    """Persistent instances and operators' edits live in the CP store: each worker reads them from its
    own view, so the write waits until the sibling's view has reached its revision."""
    node = two_workers()
    crossed = 0
    stale: list[str] = []
    for n in range(CP_ROUNDS):
        # a persistent instance: registered, then edited
        service, ip = f"ryw-cp-{n}", f"10.11.0.{n + 1}"
        base = {"serviceName": service, "ip": ip, "port": 80, "ephemeral": "false"}
        wrote = _write(node, "POST", base, stale)
        hosts, read = _hosts(node, service)
        crossed += wrote != read
        if hosts != {ip: 1.0}:
            stale.append(f"round {n}: persistent register on worker {wrote}, worker {read} listed {hosts}")
        wrote = _write(node, "PUT", {**base, "weight": 2.5}, stale)
        hosts, read = _hosts(node, service)
        crossed += wrote != read
        if hosts != {ip: 2.5}:
            stale.append(f"round {n}: persistent edit on worker {wrote}, worker {read} listed {hosts}")
        # an ephemeral instance edited by an operator (an InstanceEdits document)
        service = f"ryw-edit-{n}"
        base = {"serviceName": service, "ip": ip, "port": 80}
        _write(node, "POST", base, stale)
        wrote = _write(node, "PUT", {**base, "weight": 4}, stale)
        hosts, read = _hosts(node, service)
        crossed += wrote != read
        if hosts != {ip: 4.0}:
            stale.append(f"round {n}: operator edit on worker {wrote}, worker {read} listed {hosts}")
    assert crossed, "no read landed on another worker than the write"
    assert not stale, f"{len(stale)} stale reads of {crossed} crossed:\n" + "\n".join(stale)


async def _client_on(node: ServerProcess, index: int, opened: list[RawClient]) -> RawClient:
    """A raw SDK connection held by worker ``index`` (new connections until the kernel gives it one)."""
    for _ in range(60):
        client = RawClient(node.grpc_port)
        opened.append(client)
        connection_id = await client.connect()
        if await asyncio.to_thread(worker_holding, node, connection_id) == index:
            return client
    raise AssertionError(f"no connection landed on worker {index}")


def _query_body(service: str) -> dict[str, Any]:
    return {"headers": {}, "namespace": "public", "serviceName": service, "groupName": "DEFAULT_GROUP",
            "cluster": "", "healthyOnly": False, "module": "naming"}


#: How soon a gRPC write must be visible to a connection held by the other worker: a connection
#: client's write is answered at once (its own reads go over its own connection), and the sibling
#: is synced at once, with no sync delay.
GRPC_VISIBLE_S = 0.2


async def test_a_grpc_write_reaches_a_connection_on_the_other_worker_within_a_bound(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = await asyncio.to_thread(two_workers)
    opened: list[RawClient] = []
    try:
        clients = [await _client_on(node, 0, opened), await _client_on(node, 1, opened)]

        async def listed(reader: RawClient, service: str) -> set[str]:
            kind, body = await reader.call("ServiceQueryRequest", _query_body(service))
            assert kind == "QueryServiceResponse", body
            return {h["ip"] for h in body["serviceInfo"]["hosts"]}

        for n in range(ROUNDS):
            writer, reader = clients[n % 2], clients[1 - n % 2]
            service, ip = f"ryw-grpc-{n}", f"10.9.0.{n + 1}"
            kind, body = await writer.call("InstanceRequest", register_body(service, ip=ip, port=80))
            assert kind == "InstanceResponse" and body["resultCode"] == 200, body
            await wait_until(lambda r=reader, s=service, a=ip: _is(listed(r, s), {a}), GRPC_VISIBLE_S,  # type: ignore[misc]
                             what=f"round {n}: worker {1 - n % 2} to list what worker {n % 2} registered",
                             interval=0.005)
            kind, body = await writer.call("InstanceRequest", {**register_body(service, ip=ip, port=80),
                                                               "type": "deregisterInstance"})
            assert kind == "InstanceResponse" and body["resultCode"] == 200, body
            await wait_until(lambda r=reader, s=service: _is(listed(r, s), set()), GRPC_VISIBLE_S,  # type: ignore[misc]
                             what=f"round {n}: worker {1 - n % 2} to drop what worker {n % 2} deregistered",
                             interval=0.005)
    finally:
        for client in opened:
            await client.close()


async def _is(value: Awaitable[set[str]], expected: set[str]) -> bool:
    return await value == expected


#: The bound a write waits for a sibling (``shoal.server.workers.write-wait-ms``) in the test below.
WRITE_WAIT_MS = 300


def test_a_stopped_sibling_bounds_how_long_a_write_waits(two_workers: Callable[..., ServerProcess]) -> None:
    # A sync timeout far above the bound: only the bound can end the first waits.
    node = two_workers(f"-Dshoal.server.workers.write-wait-ms={WRITE_WAIT_MS}",
                       "-Dnacos.core.protocol.distro.data.sync.timeoutMs=20000")
    stopped = node.worker_pids()[1]
    os.kill(stopped, signal.SIGSTOP)
    try:
        slowest = 0.0
        for n in range(30):  # on worker 0's private port: the public one may hand the stopped worker a connection
            started = time.monotonic()
            status, text, worker = call_answered_by("POST", node.worker_url(0, INSTANCE),
                                                    {"serviceName": "ryw-stopped", "ip": f"10.10.0.{n + 1}",
                                                     "port": 80}, timeout=10, context=node.https)
            slowest = max(slowest, time.monotonic() - started)
            assert (status, worker) == (200, "0"), text
        # the bound plus a generous margin for a loaded machine; well under the 20 s sync timeout
        assert slowest < WRITE_WAIT_MS / 1000 + 2.0, f"a write waited {slowest:.2f}s for the stopped sibling"
        status, text, _ = call_answered_by("GET", node.worker_url(0, LIST), {"serviceName": "ryw-stopped"},
                                           context=node.https)
        assert status == 200 and len(json.loads(text)["hosts"]) == 30, text
        status, text, _ = call_answered_by("GET", node.worker_url(0, "/nacos/actuator/prometheus"), context=node.https)
        assert status == 200 and 'shoal_workers_write_waits_total{outcome="timeout"}' in text, text[-2000:]
    finally:
        os.kill(stopped, signal.SIGCONT)
