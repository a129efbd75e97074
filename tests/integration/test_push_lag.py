"""Issue 23, items 1-3 against a real `shoal server`: writes that change nothing push nothing
(counted as NotifySubscriberRequest frames on a raw SDK stream, not through an SDK's callback,
which filters), server-side empty-push protection with nacos-sdk-python 3.x, and each
subscriber's push lag: in the subscriber lists, ``shoal_push_ack_seconds`` and ``shoal status``,
with a subscriber that stops reading showing a growing wait and a pending push."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("h2", reason="the h2 dev dependency drives HTTP/2 frames directly")
from v2.nacos import DeregisterInstanceParam, RegisterInstanceParam, SubscribeServiceParam

from shoal.testing import ServerProcess, call_json, http_get, poll_until, wait_until
from shoal.testing.h2client import H2Client, grpc_frame, nacos
from shoal.testing.http import call
from shoal.testing.rawclient import register_body

SERVICE = "push-lag"


def subscribe_body(service: str) -> dict[str, Any]:
    return {"namespace": "public", "serviceName": service, "groupName": "DEFAULT_GROUP", "subscribe": True}


class RawSubscriber:
    """A raw gRPC subscriber: counts the NotifySubscriberRequest frames on its stream and acks each."""

    def __init__(self, port: int, service: str) -> None:
        self.client = H2Client(port)
        self.connection_id, self.stream_id = self.client.connect()
        self.client.streams[self.stream_id].take_messages()  # the SetupAck
        self.client.nacos_call("SubscribeServiceRequest", subscribe_body(service))
        self.pushes: list[dict[str, Any]] = []

    def pump(self) -> list[dict[str, Any]]:
        self.client.pump(0.05)
        for kind, body in self.client.streams[self.stream_id].take_messages():
            if kind == "NotifySubscriberRequest":
                self.pushes.append(body["serviceInfo"])
                self.client.send(self.stream_id, grpc_frame(nacos("NotifySubscriberResponse", {
                    "resultCode": 200, "errorCode": 0, "requestId": body["requestId"]})))
        return self.pushes


def prometheus(server: ServerProcess) -> str:
    status, text = http_get(server.url("/nacos/actuator/prometheus"))
    assert status == 200
    return text


def series(text: str, name: str) -> float:
    """The value of one series line (``name`` with its labels as printed), 0 when absent."""
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def unchanged_pushes(server: ServerProcess) -> float:
    return series(prometheus(server), 'shoal_push_total{result="unchanged"}')


def hosts(info: dict[str, Any]) -> list[tuple[str, int, dict[str, str]]]:
    return sorted((h["ip"], h["port"], h["metadata"]) for h in info.get("hosts") or [])


def test_writes_that_change_nothing_push_nothing_to_a_raw_sdk_stream(
        servers: Callable[..., ServerProcess]) -> None:
    server = servers("-D", "nacos.naming.push.pushTaskDelay=0")
    subscriber = RawSubscriber(server.grpc_port, SERVICE)
    publisher = H2Client(server.grpc_port)
    publisher.connect()
    grpc_instance = register_body(SERVICE, ip="10.7.0.1", port=8080, metadata={"k": "v"})
    assert publisher.nacos_call("InstanceRequest", grpc_instance)[1]["resultCode"] == 200
    http_instance = {"serviceName": SERVICE, "ip": "10.7.0.2", "port": 9090, "ephemeral": "true",
                     "metadata": json.dumps({"k": "v"})}
    assert call("POST", server.url("/nacos/v1/ns/instance"), http_instance)[0] == 200
    poll_until(lambda: subscriber.pump() and len(hosts(subscriber.pushes[-1])) == 2, 10,
               what="the subscriber's list with both instances")
    before, unchanged = len(subscriber.pushes), unchanged_pushes(server)

    # the SDK's redo: the same instance over gRPC again
    assert publisher.nacos_call("InstanceRequest", grpc_instance)[1]["resultCode"] == 200
    # an operator's edit that changes nothing a reader sees, through the Open API (it edits the gRPC
    # instance too): it sets k=v, which now stays over what the clients publish
    for ip, port in (("10.7.0.1", 8080), ("10.7.0.2", 9090)):
        assert call("PUT", server.url("/nacos/v1/ns/instance"), {
            "serviceName": SERVICE, "ip": ip, "port": port, "ephemeral": "true", "weight": "1.0",
            "metadata": json.dumps({"k": "v"})})[0] == 200
    # an identical health report: a beat of the healthy HTTP instance
    beat = call_json("PUT", server.url("/nacos/v1/ns/instance/beat"), {"serviceName": SERVICE, "ip": "10.7.0.2",
                                                                        "port": 9090})
    assert beat["code"] == 10200
    # a service metadata edit changes the service but no subscriber's list: the engine runs, sends nothing
    assert call("PUT", server.url("/nacos/v1/ns/service"), {"serviceName": SERVICE, "protectThreshold": "0",
                                                            "metadata": json.dumps({"owner": "team-a"})})[0] == 200
    poll_until(lambda: unchanged_pushes(server) > unchanged, 10, what="the engine to find the list unchanged")
    subscriber.pump()
    assert len(subscriber.pushes) == before

    # a real change pushes once (a key the operator did not set: the edit's k=v stays on)
    success = 'shoal_push_total{result="success"}'
    acked = series(prometheus(server), success)
    changed = register_body(SERVICE, ip="10.7.0.1", port=8080, metadata={"k": "w", "j": "w"})
    assert publisher.nacos_call("InstanceRequest", changed)[1]["resultCode"] == 200
    poll_until(lambda: len(subscriber.pump()) > before, 10, what="the push of the real change")
    poll_until(lambda: series(prometheus(server), success) > acked, 10, what="its ack to be counted")
    subscriber.pump()
    assert len(subscriber.pushes) == before + 1
    assert ("10.7.0.1", 8080, {"k": "v", "j": "w"}) in hosts(subscriber.pushes[-1])


async def test_empty_push_protection_keeps_the_sdk_subscribers_list(
        servers: Callable[..., ServerProcess], sdk: Any) -> None:
    server = servers("-D", "shoal.naming.push.empty-protection=true", "-D", "nacos.naming.push.pushTaskDelay=0")
    publisher, subscriber = await sdk(server.addr), await sdk(server.addr)
    assert await publisher.register_instance(RegisterInstanceParam(service_name=SERVICE, ip="10.8.0.1", port=1))
    assert call("POST", server.url("/nacos/v1/ns/instance"),
                {"serviceName": SERVICE, "ip": "10.8.0.2", "port": 2, "ephemeral": "true"})[0] == 200
    lists: list[set[tuple[str, int]]] = []

    async def callback(instances: list[Any]) -> None:
        lists.append({(i.ip, i.port) for i in instances})

    await subscriber.subscribe(SubscribeServiceParam(service_name=SERVICE, subscribe_callback=callback))
    await wait_until(lambda: lists and lists[-1] == {("10.8.0.1", 1), ("10.8.0.2", 2)}, what="both instances")

    # every instance goes: one deregistered over HTTP, the other with its SDK client's connection
    assert call("DELETE", server.url("/nacos/v1/ns/instance"),
                {"serviceName": SERVICE, "ip": "10.8.0.2", "port": 2, "ephemeral": "true"})[0] == 200
    await wait_until(lambda: lists[-1] == {("10.8.0.1", 1)}, what="the push without the HTTP instance")
    await publisher.deregister_instance(DeregisterInstanceParam(service_name=SERVICE, ip="10.8.0.1", port=1))
    protected = "shoal_push_empty_protected_services"
    await wait_until(lambda: series(prometheus(server), protected) == 1, what="the empty push withheld")
    # queries still answer the truth; the console says the service is protected; the subscriber kept its list
    listed = call_json("GET", server.url("/nacos/v1/ns/instance/list"), {"serviceName": SERVICE})
    assert listed["hosts"] == []
    detail = call_json("GET", server.url("/nacos/v1/ns/catalog/service"), {"serviceName": SERVICE})
    assert detail["service"]["emptyPushProtected"] is True
    assert lists[-1] == {("10.8.0.1", 1)} and all(lists)

    # the next registration is pushed, and the service is no longer protected
    assert await publisher.register_instance(RegisterInstanceParam(service_name=SERVICE, ip="10.8.0.3", port=3))
    await wait_until(lambda: lists[-1] == {("10.8.0.3", 3)}, what="the next non-empty list")
    assert series(prometheus(server), protected) == 0
    assert all(lists)  # never an empty list


def test_a_subscriber_that_stops_reading_shows_growing_lag_before_it_is_ejected(
        servers: Callable[..., ServerProcess]) -> None:
    server = servers("-D", "nacos.naming.push.pushTaskDelay=0")
    reader = RawSubscriber(server.grpc_port, SERVICE)
    stalled = H2Client(server.grpc_port, rcvbuf=4096)
    stalled_id, _ = stalled.connect()
    stalled.nacos_call("SubscribeServiceRequest", subscribe_body(SERVICE))  # from now on it never reads
    publisher = H2Client(server.grpc_port)
    publisher.connect()

    def reader_has(port: int) -> bool:
        return any(h[1] == port for p in reader.pump()[-1:] for h in hosts(p))

    for port in (1, 2, 3):
        assert publisher.nacos_call("InstanceRequest", register_body(SERVICE, port=port))[1]["resultCode"] == 200
        poll_until(lambda: reader_has(port), 10, what=f"the reader to get port {port}")  # noqa: B023 - awaited here

    def entries() -> dict[str, dict[str, Any]]:
        out = call_json("GET", server.url("/nacos/v2/ns/client/service/subscriber/list"), {"serviceName": SERVICE})
        return {e["clientId"]: e["pushLag"] for e in out["data"]}

    def stalled_waiting(more_than: int) -> dict[str, Any] | None:
        lag = entries().get(stalled_id)
        return lag if lag is not None and lag["pending"] >= 1 and lag["pendingForMs"] > more_than else None

    first = poll_until(lambda: stalled_waiting(0), 10, what="the stalled subscriber's pending push")
    second = poll_until(lambda: stalled_waiting(first["pendingForMs"]), 10, what="its wait to grow")
    assert second["pendingForMs"] > first["pendingForMs"] and stalled_id in entries()  # not ejected yet
    mine = entries()[reader.connection_id]
    assert mine["pending"] == 0 and mine["acks"] >= 3 and mine["lastMs"] is not None and mine["p99Ms"] is not None

    v1 = call_json("GET", server.url("/nacos/v1/ns/service/subscribers"), {"serviceName": SERVICE})
    assert {s["clientId"]: s["pushLag"]["pending"] >= 1 for s in v1["subscribers"]} == {
        stalled_id: True, reader.connection_id: False}
    v3 = call_json("GET", server.url("/nacos/v3/admin/ns/service/subscribers"), {"serviceName": SERVICE})
    assert {s["clientId"] for s in v3["data"]["pageItems"]} == {stalled_id, reader.connection_id}
    text = prometheus(server)
    transport = server_transport(server)
    assert series(text, f'shoal_push_ack_seconds_count{{namespace="public",transport="{transport}"}}') >= 3

    done = subprocess.run([sys.executable, "-m", "shoal", "status", "--addr", server.addr],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "push lag p99" in done.stdout and stalled_id in done.stdout
    stalled.close()


def server_transport(server: ServerProcess) -> str:
    state = call_json("GET", server.url("/nacos/v1/console/server/state"))
    return str(state["shoal_transport"])
