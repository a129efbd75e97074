"""bench/load's native load generator (native/nacos_load.c) against a real node: its SDK
handshake is accepted, it answers the node's probes on the stream, and what it counts is what
the node holds (instances registered and deregistered, failed answers counted as errors)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, ServerProcess, http_get, kill, poll_until, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "load"))
import native_gen  # bench/load's modules import their siblings by bare name

SERVICES = 10
CONNECTIONS = 4
PLAN = {"prefix": "native-svc", "services": SERVICES, "per_conn": SERVICES, "window": 4, "duration": 30.0, "seed": 1}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # a fast keep-alive scan, so the generator's connections are probed while the test runs; the
    # transport is the suite's (native, and grpc.aio in ci/test.sh's SHOAL_REMOTE_TRANSPORT=grpcio pass)
    server = start_server(tmp_path_factory.mktemp("native-load"), [
        "-D", "nacos.remote.server.connection.keep-alive-ms=300",
        "-D", "nacos.remote.server.connection.check-interval-ms=200"], auth=OPEN)
    yield server
    kill(server)


@pytest.fixture
def generator(node: ServerProcess) -> Iterator[native_gen.NativeProcess]:
    proc = native_gen.NativeProcess(0, native_gen.build(), f"127.0.0.1:{node.grpc_port}")
    yield proc
    proc.close()


def hosts_on_node(node: ServerProcess) -> int:
    total = 0
    for k in range(SERVICES):
        status, text = http_get(node.url(f"/nacos/v1/ns/instance/list?serviceName=native-svc-{k:05d}"))
        assert status == 200, text
        total += len(json.loads(text)["hosts"])
    return total


def run(generator: native_gen.NativeProcess, command: str, **extra: Any) -> dict[str, Any]:
    generator.start(command, PLAN | extra)
    return generator.finish(command, deadline=float("inf"))


def test_counts_match_the_node(node: ServerProcess, generator: native_gen.NativeProcess) -> None:
    opened = run(generator, "connect", count=CONNECTIONS, first_global=0)
    assert (opened["opened"], opened["failed"], len(opened["connect_s"])) == (CONNECTIONS, 0, CONNECTIONS)

    # the node probes idle connections (ClientDetectionRequest, 1 s to answer or the connection is
    # dropped): the generator answers on the stream, and every connection still works below
    detected = poll_until(lambda: generator.run_plan([[]] * CONNECTIONS, 1, 1.0)["detections"] >= CONNECTIONS,
                          timeout=10, what="the node's probes answered")
    assert detected

    registered = run(generator, "register")
    assert registered["errors"] == {} and not registered["truncated"]
    assert registered["ops"] == len(registered["latency_s"]) == CONNECTIONS * SERVICES
    assert hosts_on_node(node) == CONNECTIONS * SERVICES

    queried = run(generator, "query", ops=200)
    assert (queried["ops"], queried["errors"]) == (200, {})
    assert queried["client_cpu_s"] > 0

    # a failing answer is an error, not an op: an unknown type is ErrorResponse 500/302
    refused = generator.run_plan([[("NoSuchRequest", b'{"headers":{}}')] * 3] * CONNECTIONS, 2, 10.0)
    assert (refused["ops"], refused["errors"]) == (0, {"302": 3 * CONNECTIONS})

    deregistered = run(generator, "deregister")
    assert (deregistered["ops"], deregistered["errors"]) == (CONNECTIONS * SERVICES, {})
    assert hosts_on_node(node) == 0
