"""The real HTTP client of nacos-sdk-python 2.0.11 (``nacos.NacosClient``, the v1 Open API) against
real `shoal server` processes: register / list / beat / remove, beat expiry with short intervals,
visibility across HTTP and gRPC (pushes included), and forwarding between two processes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from v2.nacos import ListInstanceParam, RegisterInstanceParam, SubscribeServiceParam

from shoal.config import TestHooks
from shoal.testing import ServerProcess, call, http_get, poll_until, wait_until

# Short beat rules for the instances of these tests (the defaults are proven on a manual clock).
FAST_BEATS = {"preserved.heart.beat.interval": "300", "preserved.heart.beat.timeout": "1500",
              "preserved.ip.delete.timeout": "3000"}
FAST_CHECK = ("-D", "shoal.naming.beat-check-interval-ms=200")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:nacos.*")


@pytest.fixture(scope="session")
def nacos_v1() -> ModuleType:
    """``nacos`` from nacos-sdk-python 2.0.11, installed by ci/setup.sh beside the venv (it is the
    same distribution as the 3.x SDK, so it cannot live in site-packages)."""
    target = Path(sys.prefix) / "nacos-v1"
    if not (target / "nacos" / "client.py").is_file():
        raise AssertionError(f"nacos-sdk-python 2.0.11 is not installed in {target}: run ci/setup.sh")
    if str(target) not in sys.path:
        sys.path.append(str(target))  # appended: its bundled `v2` must not shadow the 3.x SDK
    import nacos

    assert "2.0.11" in Path(nacos.__file__).parent.parent.joinpath(
        "nacos_sdk_python-2.0.11.dist-info", "METADATA").read_text()
    return nacos


@pytest.fixture
def v1_client(nacos_v1: ModuleType, tmp_path: Path) -> Callable[..., Any]:
    made: list[Any] = []

    def factory(server: ServerProcess, **kw: Any) -> Any:
        client = nacos_v1.NacosClient(server.addr, namespace="public", logDir=str(tmp_path / "v1-logs"), **kw)
        made.append(client)
        return client

    yield factory
    for client in made:
        for task in list(client.heartbeats.values()):
            task.stop()


def hosts(client: Any, service: str, **kw: Any) -> list[dict[str, Any]]:
    return list(client.list_naming_instance(service, **kw)["hosts"])


def test_register_list_beat_modify_remove(server: ServerProcess, v1_client: Callable[..., Any]) -> None:
    client = v1_client(server)
    assert client.add_naming_instance("orders", "10.1.0.5", 8080, cluster_name="east-1", weight=2.5,
                                      metadata={"version": "1.2", "zone": "a"}, group_name="SHOP")
    listed = client.list_naming_instance("orders", group_name="SHOP", clusters="east-1")
    assert (listed["name"], listed["clusters"]) == ("SHOP@@orders", "east-1")
    [inst] = listed["hosts"]
    assert (inst["ip"], inst["port"], inst["weight"], inst["clusterName"]) == ("10.1.0.5", 8080, 2.5, "east-1")
    assert inst["metadata"] == {"version": "1.2", "zone": "a"} and inst["healthy"] and inst["enabled"]
    assert inst["instanceId"] == "10.1.0.5#8080#east-1#SHOP@@orders"
    beat = client.send_heartbeat("orders", "10.1.0.5", 8080, cluster_name="east-1", group_name="SHOP")
    assert beat == {"clientBeatInterval": 5000, "code": 10200, "lightBeatEnabled": True}
    assert client.modify_naming_instance("orders", "10.1.0.5", 8080, cluster_name="east-1", weight=4,
                                         group_name="SHOP")
    detail = client.get_naming_instance("SHOP@@orders", "10.1.0.5", 8080, cluster_name="east-1")
    assert detail["weight"] == 4.0 and detail["service"] == "SHOP@@orders"
    assert client.remove_naming_instance("orders", "10.1.0.5", 8080, cluster_name="east-1", group_name="SHOP")
    assert hosts(client, "orders", group_name="SHOP") == []


def test_a_beat_for_an_unknown_instance_registers_it(server: ServerProcess, v1_client: Callable[..., Any]) -> None:
    client = v1_client(server)
    beat = client.send_heartbeat("fresh", "10.1.0.9", 81, metadata={"k": "v"})
    assert beat["code"] == 10200
    [inst] = hosts(client, "fresh")
    assert (inst["ip"], inst["metadata"]) == ("10.1.0.9", {"k": "v"})


def test_instance_whose_beats_stop_turns_unhealthy_then_disappears(
        servers: Callable[..., ServerProcess], v1_client: Callable[..., Any]) -> None:
    server = servers(*FAST_CHECK)
    client = v1_client(server)
    assert client.add_naming_instance("beating", "10.2.0.1", 9000, metadata=FAST_BEATS, heartbeat_interval=0.3)
    beats_seen = 0

    def healthy_while_beating() -> bool:  # at least 3 s of beats (2x the timeout) while always healthy
        nonlocal beats_seen
        [inst] = hosts(client, "beating")
        assert inst["healthy"], inst
        _status, text = http_get(server.url("/nacos/actuator/prometheus"), 5)
        beats_seen = _counter(text, "/nacos/v1/ns/instance/beat")
        return beats_seen >= 10

    poll_until(healthy_while_beating, 20, 0.1, "ten beats with the instance healthy throughout")
    client.heartbeats["beating#10.2.0.1#9000"].stop()
    poll_until(lambda: hosts(client, "beating")[0]["healthy"] is False, 10, 0.05, "the instance to turn unhealthy")
    poll_until(lambda: hosts(client, "beating") == [], 10, 0.05, "the instance to be removed")


async def test_http_registration_is_pushed_to_grpc_subscribers_and_grpc_is_listed_over_http(
        servers: Callable[..., ServerProcess], v1_client: Callable[..., Any], sdk: Any) -> None:
    server = servers(*FAST_CHECK)
    http = v1_client(server)
    grpc_client = await sdk(server.addr)
    pushes: list[list[Any]] = []

    async def on_push(instances: list[Any]) -> None:
        pushes.append(list(instances))

    await grpc_client.subscribe(SubscribeServiceParam(service_name="mixed", subscribe_callback=on_push))
    await asyncio.to_thread(http.add_naming_instance, "mixed", "10.3.0.1", 7000, metadata=FAST_BEATS)

    def pushed(predicate: Callable[[list[Any]], bool]) -> bool:
        return bool(pushes) and predicate(pushes[-1])

    await wait_until(lambda: pushed(lambda hs: [(h.ip, h.healthy) for h in hs] == [("10.3.0.1", True)]), 10,
                   "a push with the HTTP-registered instance")
    # no beats: the health flip and then the removal are pushed to the gRPC subscriber too
    await wait_until(lambda: pushed(lambda hs: [(h.ip, h.healthy) for h in hs] == [("10.3.0.1", False)]), 10,
                   "a push with the instance unhealthy")
    await wait_until(lambda: pushed(lambda hs: hs == []), 10, "a push without the instance")

    assert await grpc_client.register_instance(RegisterInstanceParam(
        service_name="from-grpc", ip="10.3.0.2", port=7001, metadata={"m": "1"}))
    listed = await asyncio.to_thread(hosts, http, "from-grpc")
    assert [(h["ip"], h["port"], h["metadata"]) for h in listed] == [("10.3.0.2", 7001, {"m": "1"})]
    await asyncio.to_thread(http.add_naming_instance, "from-grpc", "10.3.0.3", 7002)
    seen = await grpc_client.list_instances(ListInstanceParam(service_name="from-grpc", subscribe=False,
                                                              healthy_only=None))
    assert {i.ip for i in seen} == {"10.3.0.2", "10.3.0.3"}


def test_writes_are_forwarded_to_the_responsible_node(servers: Callable[..., ServerProcess],
                                                      v1_client: Callable[..., Any]) -> None:
    owner = servers()
    # the hook names the one member that owns every ip:port: a node of workers is one member per
    # worker (ip:private_port), so it names the owner's first worker, as the mapper would
    member = owner.addr if owner.workers == 1 else f"{owner.host}:{owner.worker_ports()[0]}"
    entry = servers(env=TestHooks(forward_all_to=member).to_env())
    via_entry, on_owner = v1_client(entry), v1_client(owner)
    assert via_entry.add_naming_instance("fwd", "10.4.0.1", 80, metadata={"k": "v"})
    assert [h["ip"] for h in hosts(on_owner, "fwd")] == ["10.4.0.1"]
    assert hosts(via_entry, "fwd") == []  # reads are local; only the owner holds the client
    assert via_entry.send_heartbeat("fwd", "10.4.0.1", 80)["code"] == 10200
    status, text = call("PUT", entry.url("/nacos/v1/ns/instance/beat?serviceName=fwd&ip=10.4.0.1&port=80"),
                        headers={"User-Agent": "Nacos-Server:2.5.1"})
    assert (status, "invalid redirect" in text) == (400, True)
    assert via_entry.remove_naming_instance("fwd", "10.4.0.1", 80)
    assert hosts(on_owner, "fwd") == []


# --- small HTTP helpers ----------------------------------------------------------------------
def _counter(prometheus_text: str, path: str) -> int:
    total = 0
    for line in prometheus_text.splitlines():
        if line.startswith("shoal_requests_total{") and f'type="{path}"' in line and 'code="200"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total

