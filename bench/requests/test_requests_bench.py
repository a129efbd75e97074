"""The in-process SDK request path, per request type: Payload bytes in → ``SdkServer.unary``
(dispatch, parsing, service layer, model events, metrics) → Payload bytes out.

Run with ``bash ci/bench.sh -k requests`` (``make bench`` runs it with the kernel benches, and
``make bench-compare`` compares it with the last saved run). A node is built in process
(``path.RequestPath``: every model subscriber a running node has, no sockets) with 10 services of
100 instances (4 metadata keys each, as ``bench/load`` registers) and 100 SDK connections. Each
round sends ``BATCH`` requests, so the time per request is the round time / ``BATCH``
(``extra_info["requests_per_round"]``). Writes are measured on real state changes: the register
round registers ``BATCH`` new (connection, service) pairs and an untimed setup removes them
again; the deregister round is the mirror image.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.requests.path import (
    RequestPath,
    deregister_body,
    ips,
    populate,
    query_body,
    register_body,
    subscribe_body,
)

BATCH = 500
ROUNDS = 30
SERVICES = 10
HOSTS = 100
CONNECTIONS = 100


class _World:
    def __init__(self) -> None:
        self.path = RequestPath()
        for s in range(SERVICES):
            populate(self.path, f"q{s}", HOSTS)
        self.peers = [self.path.connect() for _ in range(CONNECTIONS)]
        addrs = list(ips(CONNECTIONS))
        request = self.path.request
        # BATCH distinct (connection, service) pairs: connection i % 100 into service w{i // 100}
        self.register = [request("InstanceRequest", register_body(f"w{i // CONNECTIONS}", addrs[i % CONNECTIONS]))
                         for i in range(BATCH)]
        self.deregister = [request("InstanceRequest", deregister_body(f"w{i // CONNECTIONS}",
                                                                      addrs[i % CONNECTIONS])) for i in range(BATCH)]
        self.query = [request("ServiceQueryRequest", query_body(f"q{i % SERVICES}")) for i in range(BATCH)]
        self.subscribe = [request("SubscribeServiceRequest", subscribe_body(f"q{i % SERVICES}")) for i in range(BATCH)]
        self.health = request("HealthCheckRequest", {"headers": {}, "module": "internal"})

    def send_all(self, datas: list[bytes]) -> None:
        call, peers = self.path.call, self.peers
        for i, data in enumerate(datas):
            call(data, peers[i % CONNECTIONS])


@pytest.fixture(scope="module")
def world() -> Iterator[_World]:
    w = _World()
    yield w
    w.path.close()


def run(benchmark: Any, group: str, fn: Callable[[], None], setup: Callable[[], None] | None = None) -> None:
    benchmark.group = f"requests: {group}"
    benchmark.extra_info["requests_per_round"] = BATCH
    if setup is None:
        benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    else:
        benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, warmup_rounds=1)


def test_register(benchmark: Any, world: _World) -> None:
    run(benchmark, "InstanceRequest register (new instance)",
        lambda: world.send_all(world.register), lambda: world.send_all(world.deregister))
    world.send_all(world.deregister)


def test_deregister(benchmark: Any, world: _World) -> None:
    run(benchmark, "InstanceRequest deregister",
        lambda: world.send_all(world.deregister), lambda: world.send_all(world.register))
    world.send_all(world.deregister)


def test_query(benchmark: Any, world: _World) -> None:
    run(benchmark, "ServiceQueryRequest (100 hosts)", lambda: world.send_all(world.query))


def test_query_after_change(benchmark: Any, world: _World) -> None:
    """Every query follows a change of its service: the view is rebuilt and re-selected each time."""
    reg, dereg = world.register[0], world.deregister[0]
    query = world.path.request("ServiceQueryRequest", query_body("w0"))
    populated = [world.path.request("InstanceRequest", register_body("w0", ip)) for ip in ips(HOSTS)]
    extra = [world.path.connect() for _ in range(HOSTS)]
    for peer, data in zip(extra, populated, strict=True):
        world.path.call(data, peer)
    peer = world.peers[0]
    call = world.path.call

    def changing() -> None:
        for i in range(BATCH // 2):
            call(reg if i & 1 else dereg, peer)
            call(query, peer)

    run(benchmark, "ServiceQueryRequest (100 hosts) after each change, with the change", changing)
    call(dereg, peer)


def test_subscribe(benchmark: Any, world: _World) -> None:
    run(benchmark, "SubscribeServiceRequest (100 hosts)", lambda: world.send_all(world.subscribe))


def test_health_check(benchmark: Any, world: _World) -> None:
    run(benchmark, "HealthCheckRequest", lambda: world.send_all([world.health] * BATCH))


def test_answers_are_right(world: _World) -> None:
    """The benched requests succeed (a bench of error answers would measure the wrong path)."""
    peer = world.peers[0]
    path = world.path
    assert len(path.check_ok(path.call(world.query[0], peer), "QueryServiceResponse")["serviceInfo"]["hosts"]) \
        == HOSTS
    path.check_ok(path.call(world.register[0], peer), "InstanceResponse")
    path.check_ok(path.call(world.deregister[0], peer), "InstanceResponse")
    path.check_ok(path.call(world.health, peer), "HealthCheckResponse")
