"""Real gRPC clients other than nacos-sdk-python against a real node, on both gRPC transports.

* nacos-sdk-rust through its Python binding (nacos-sdk-rust-binding-py, on tonic): register,
  query, subscribe and be pushed, deregister;
* a small @grpc/grpc-js client (``clients/node``) and a small grpc-java client on Debian's
  libgrpc-java (``clients/java``, compiled with javac here): ServerCheck, bi stream and
  ConnectionSetup, subscribe, register, the NotifySubscriberRequest push and its ack, query,
  deregister and the empty push (docs/protocol.md §2.2, §3.4, §3.8).

Each client runs its flow in a process of its own and prints what it saw as JSON; the test
checks that, and checks on the node that the pushes were acknowledged and that the client's
connections and subscriptions are gone once it has exited. The node runs the transport of the
parameter (``SHOAL_REMOTE_TRANSPORT``); when that variable is already set for the whole run (as
in CI's grpcio pass), only that transport is tested.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import ServerProcess, http_get, poll_until
from shoal.transport.selection import native_available

from .clients import runner

TRANSPORTS = [os.environ["SHOAL_REMOTE_TRANSPORT"]] if os.environ.get("SHOAL_REMOTE_TRANSPORT") else [
    "native", "grpcio"]


@pytest.fixture(params=TRANSPORTS)
def node(request: pytest.FixtureRequest, servers: Callable[..., ServerProcess]) -> ServerProcess:
    transport = str(request.param)
    if transport == "native":
        runner.require(native_available(), "the native transport (h2grpc extension) is not built")
    return servers(env={"SHOAL_REMOTE_TRANSPORT": transport})


def http_hosts(server: ServerProcess, service: str) -> list[str]:
    query = urllib.parse.urlencode({"serviceName": service})
    status, text = http_get(server.url(f"/nacos/v1/ns/instance/list?{query}"))
    assert status == 200, text
    return sorted(f"{h['ip']}:{h['port']}" for h in json.loads(text)["hosts"])


def assert_node_clean_after(server: ServerProcess, service: str, pushes: int) -> None:
    """The node counted the client's acks as successful pushes, forgot its connections and
    subscriptions once it exited, keeps no instance of the service, and still serves."""
    poll_until(lambda: server.metric("push_total", result="success") >= pushes, 20,
               what=f"{pushes} acknowledged pushes")
    poll_until(lambda: server.gauge("connections") == 0 and server.gauge("subscribers") == 0, 20,
               what="the client's connections and subscriptions to be gone")
    assert http_hosts(server, service) == []
    server.check_alive()


def assert_raw_flow(out: dict[str, Any], service: str, me: str, client: str) -> None:
    """What the Node and Java clients report for the same flow."""
    conns = [out["subscriberConnection"], out["publisherConnection"]]
    for conn in conns:
        assert conn["serverCheckType"] == "ServerCheckResponse"
        assert conn["connectionId"]
        assert "abilityTable" in conn["setupAck"]
    assert conns[0]["connectionId"] != conns[1]["connectionId"], "two channels must be two connections"
    assert out["subscribe"]["type"] == "SubscribeServiceResponse"
    assert (out["subscribe"]["resultCode"], out["subscribe"]["hosts"]) == (200, [])
    assert (out["register"]["type"], out["register"]["resultCode"], out["register"]["errorCode"]) == (
        "InstanceResponse", 200, 0)
    push = out["pushAfterRegister"]
    assert (push["name"], push["hosts"], push["metadata"]) == (service, [me], {"client": client})
    assert (out["query"]["type"], out["query"]["resultCode"], out["query"]["hosts"]) == (
        "QueryServiceResponse", 200, [me])
    assert (out["deregister"]["type"], out["deregister"]["resultCode"]) == ("InstanceResponse", 200)
    assert out["pushAfterDeregister"]["hosts"] == []
    assert {push["requestId"], out["pushAfterDeregister"]["requestId"]} <= set(out["acked"])
    assert (out["healthCheck"]["type"], out["healthCheck"]["resultCode"]) == ("HealthCheckResponse", 200)


def test_grpc_js_client_connects_registers_and_is_pushed(node: ServerProcess) -> None:
    out = runner.run_json(runner.node_command(node.grpc_port, "grpc-js-svc"))
    assert out["client"] == "grpc-js"
    assert_raw_flow(out, "grpc-js-svc", "10.9.0.1:8081", "grpc-js")
    assert_node_clean_after(node, "grpc-js-svc", pushes=2)


def test_grpc_java_client_connects_registers_and_is_pushed(node: ServerProcess) -> None:
    out = runner.run_json(runner.java_command(node.grpc_port, "grpc-java-svc"))
    assert out["client"] == "grpc-java"
    assert_raw_flow(out, "grpc-java-svc", "10.9.0.2:8082", "grpc-java")
    assert_node_clean_after(node, "grpc-java-svc", pushes=2)


def test_rust_sdk_registers_queries_subscribes_and_deregisters(node: ServerProcess, tmp_path: Path) -> None:
    home = tmp_path / "rust-home"  # the SDK writes its log and cache under $HOME
    home.mkdir()
    out = runner.run_json(runner.rust_command(node.addr, "rust-svc"),
                          env={"HOME": str(home), "NACOS_CLIENT_LOGGER_LEVEL": "WARN"})
    assert out["version"] == "0.8.0"
    assert out["pushAfterRegister"] == ["10.9.0.3:8083"]
    assert out["query"] == {"hosts": ["10.9.0.3:8083"], "weight": 2.0, "metadata": {"client": "rust"},
                            "healthy": True, "cluster": "DEFAULT"}
    assert out["subscriberRead"] == ["10.9.0.3:8083"]
    assert out["pushAfterDeregister"] == []
    assert out["queryAfterDeregister"] == []
    assert_node_clean_after(node, "rust-svc", pushes=2)
