"""A node of two workers is one node to the outside: its Prometheus figures, its loader figures,
its connection limits and its reloads count every worker's connections (issue 21, item 3)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from shoal.testing import OPEN, ServerProcess, call, call_with_headers, free_port_block, http_get, kill, poll_until
from shoal.testing.procs import metric_sum, metric_values, start_server
from shoal.testing.rawclient import RawClient
from shoal.testing.workers import connections_on_each_worker, worker_connections
from shoal.transport.sharing import WORKER_HEADER

pytestmark = pytest.mark.integration

PROMETHEUS = "/nacos/actuator/prometheus"
LOADER_METRICS = "/nacos/v1/shoal/loader/metrics"
LOADER_CURRENT = "/nacos/v2/core/loader/current"


def scrape(node: ServerProcess, url: str | None = None) -> str:
    status, text = http_get(url or node.url(PROMETHEUS), 5.0)
    assert status == 200, text
    return text


def loader_metrics(url: str) -> dict[str, str]:
    status, text = call("GET", url, timeout=5.0)
    assert status == 200, text
    return dict(json.loads(text))


def long_connections(text: str) -> float:
    """``nacos_monitor{module="core",name="longConnection"}`` of a scrape."""
    return sum(v for labels, v in metric_values(text, "nacos_monitor")
               if labels.get("module") == "core" and labels.get("name") == "longConnection")


async def close_all(clients: list[RawClient]) -> None:
    for client in clients:
        await client.close()


async def test_prometheus_on_the_public_port_answers_for_the_node(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = await asyncio.to_thread(two_workers)
    clients = await connections_on_each_worker(node, 2)
    try:
        text = await asyncio.to_thread(scrape, node)
        # Nacos's families once per node: connections and request counters summed over the workers
        assert long_connections(text) == 4
        assert metric_sum(text, "grpc_server_requests_seconds_count", requestClass="ServerCheckRequest") >= 4
        assert not any("worker" in labels for labels, _ in metric_values(text, "nacos_monitor"))
        # Shoal's families once per worker, labelled
        assert {labels["worker"]: value for labels, value in metric_values(text, "shoal_connections")} == {
            "0": 2, "1": 2}
        assert {labels["worker"]: value for labels, value in metric_values(text, "shoal_worker_up")} == {
            "0": 1, "1": 1}
        # a worker's private port: its own figures, unlabelled (how its siblings ask it)
        own = await asyncio.to_thread(scrape, node, node.worker_url(1, PROMETHEUS))
        assert long_connections(own) == 2
        assert not metric_values(own, "shoal_worker_up")
    finally:
        await close_all(clients)


def test_a_sibling_that_does_not_answer_is_reported_and_does_not_hold_the_scrape(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    frozen = node.worker_pids()[1]
    os.kill(frozen, signal.SIGSTOP)
    try:
        answers: list[str] = []

        def answered_by_worker_0() -> bool:  # a connection the kernel gives the stopped worker times out
            try:
                # (a worker-0 answer takes the 1 s sibling timeout; a hang on the stopped one is cut at 3 s)
                status, text, headers = call_with_headers("GET", node.url(PROMETHEUS), timeout=3.0)
            except OSError:
                return False
            if status == 200 and headers.get(WORKER_HEADER) == "0":
                answers.append(text)
                return True
            return False
        # each try lands on either worker (SO_REUSEPORT): allow for a run of tries on the stopped one
        poll_until(answered_by_worker_0, 60, 0.0, what="a scrape of the public port answered by worker 0")
        up = {labels["worker"]: value for labels, value in metric_values(answers[-1], "shoal_worker_up")}
        assert up == {"0": 1, "1": 0}
    finally:
        os.kill(frozen, signal.SIGCONT)


async def test_the_loader_counts_the_node(two_workers: Callable[..., ServerProcess]) -> None:
    node = await asyncio.to_thread(two_workers)
    clients = await connections_on_each_worker(node, 2)
    try:
        ids = set()
        for index in (0, 1):
            ids |= await asyncio.to_thread(worker_connections, node, index)
        status, text = await asyncio.to_thread(call, "GET", node.url(LOADER_CURRENT), timeout=5.0)
        assert status == 200 and set(json.loads(text)) == ids and len(ids) == 4
        metric = await asyncio.to_thread(loader_metrics, node.url(LOADER_METRICS))
        assert (metric["sdkConCount"], metric["workers"], metric["workersAnswered"], metric["workerSdkConCount"]) == (
            "4", "2", "2", "2,2")
        assert (await asyncio.to_thread(loader_metrics, node.worker_url(0, LOADER_METRICS)))["sdkConCount"] == "2"
        status, text = await asyncio.to_thread(call, "GET", node.url("/nacos/v2/core/loader/cluster"), timeout=5.0)
        assert status == 200 and json.loads(text)["total"] == 4
    finally:
        await close_all(clients)


async def test_reload_current_on_the_public_port_keeps_the_count_for_the_node(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = await asyncio.to_thread(two_workers)
    clients = await connections_on_each_worker(node, 3)
    try:
        status, text = await asyncio.to_thread(call, "GET", node.url("/nacos/v2/core/loader/reloadCurrent"),
                                               {"count": "2"}, timeout=5.0)
        assert status == 200, text
        metric = await asyncio.to_thread(loader_metrics, node.url(LOADER_METRICS))
        assert (metric["sdkConCount"], metric["workerSdkConCount"]) == ("2", "1,1")
    finally:
        await close_all(clients)


async def refused(node: ServerProcess) -> str | None:
    """Open one more SDK connection: the reason it was refused, or None when it was accepted."""
    client = RawClient(node.grpc_port)
    try:
        await client.call("ServerCheckRequest", {})
        await client.open_stream()
        await client.send("ConnectionSetupRequest", {"labels": {"module": "naming"}, "abilityTable": {}})
        try:
            await client.receive()
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return err.details() or ""
        return None
    finally:
        await client.close()


@pytest.fixture
def limited_node(tmp_path: Path) -> Iterator[Callable[[dict[str, int]], ServerProcess]]:
    """Factory of a node of two workers whose connection limit rule is in place before it starts."""
    started: list[ServerProcess] = []

    def factory(rule: dict[str, int]) -> ServerProcess:
        port = free_port_block()
        (tmp_path / f"node-{port}" / "loader").mkdir(parents=True)
        (tmp_path / f"node-{port}" / "loader" / "limitRule").write_text(json.dumps(rule))
        node = start_server(tmp_path, port=port, auth=OPEN, workers=2)
        started.append(node)
        node.wait_workers()
        return node

    yield factory
    for node in started:
        kill(node)


@pytest.mark.parametrize("rule", [{"countLimit": 4}, {"countLimitPerClientIpDefault": 4}])
async def test_a_connection_limit_holds_for_the_node_wherever_a_connection_lands(
        limited_node: Callable[[dict[str, int]], ServerProcess], rule: dict[str, int]) -> None:
    node = await asyncio.to_thread(limited_node, rule)
    clients = await connections_on_each_worker(node, 2)  # four connections fit the limit
    try:
        def knows_its_sibling(index: int) -> bool:  # each worker has heard the other's count in a report
            return loader_metrics(node.worker_url(index, LOADER_METRICS)).get("siblingConCount") == "2"
        for index in (0, 1):
            await asyncio.to_thread(poll_until, lambda i=index: knows_its_sibling(i), 20,  # type: ignore[misc]
                                    what=f"worker {index} to hear its sibling's connections")

        def refusals() -> dict[str, float]:
            text = scrape(node)
            return {labels["worker"]: value for labels, value in metric_values(text, "shoal_connections_closed_total")
                    if "limit" in labels.get("reason", "")}
        for _ in range(40):  # new connections until each worker has refused one
            reason = await refused(node)
            assert reason is not None and "limit" in reason, reason
            counts = await asyncio.to_thread(refusals)
            if counts.get("0", 0) >= 1 and counts.get("1", 0) >= 1:
                break
        counts = await asyncio.to_thread(refusals)
        assert counts.get("0", 0) >= 1 and counts.get("1", 0) >= 1, counts
        metric = await asyncio.to_thread(loader_metrics, node.url(LOADER_METRICS))
        assert metric["sdkConCount"] == "4"
    finally:
        await close_all(clients)
