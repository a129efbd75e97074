"""Read-your-writes across the workers of one node: a write is answered only once the node's sibling
workers have applied it (docs/workers.md, "Read-your-writes"), so a client whose next request lands on
the other worker (a new HTTP connection, another gRPC connection) sees what it has just written."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from shoal.testing import ServerProcess, poll_until
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


async def test_a_grpc_write_is_seen_by_a_connection_on_the_other_worker(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = await asyncio.to_thread(two_workers)
    opened: list[RawClient] = []
    try:
        clients = [await _client_on(node, 0, opened), await _client_on(node, 1, opened)]
        stale: list[str] = []
        for n in range(ROUNDS):
            writer, reader = clients[n % 2], clients[1 - n % 2]
            service, ip = f"ryw-grpc-{n}", f"10.9.0.{n + 1}"
            kind, body = await writer.call("InstanceRequest", register_body(service, ip=ip, port=80))
            assert kind == "InstanceResponse" and body["resultCode"] == 200, body
            kind, body = await reader.call("ServiceQueryRequest", _query_body(service))
            assert kind == "QueryServiceResponse", body
            ips = {h["ip"] for h in body["serviceInfo"]["hosts"]}
            if ips != {ip}:
                stale.append(f"round {n}: worker {n % 2} registered, worker {1 - n % 2} listed {ips}")
            kind, body = await writer.call("InstanceRequest", {**register_body(service, ip=ip, port=80),
                                                               "type": "deregisterInstance"})
            assert kind == "InstanceResponse" and body["resultCode"] == 200, body
            _, body = await reader.call("ServiceQueryRequest", _query_body(service))
            if body["serviceInfo"]["hosts"]:
                stale.append(f"round {n}: worker {n % 2} deregistered, worker {1 - n % 2} still listed it")
        assert not stale, "\n".join(stale)
    finally:
        for client in opened:
            await client.close()


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
