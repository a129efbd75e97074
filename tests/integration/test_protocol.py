"""The Nacos gRPC protocol at the byte level, including every kind of bad input (docs/protocol.md §1–§2).

Each bad request must get its documented answer while the connection, the node and the other
clients go on working.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from shoal.testing import ServerProcess, http_get, wait_until
from shoal.testing.rawclient import RawClient, register_body


@pytest.fixture
async def raw(shared_server: ServerProcess) -> AsyncIterator[Callable[[], Any]]:
    made: list[RawClient] = []

    async def factory() -> RawClient:
        client = RawClient(shared_server.grpc_port)
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.close()


async def test_server_check_then_setup_then_naming(raw: Any) -> None:
    client = await raw()
    kind, body = await client.call("ServerCheckRequest", {"headers": {}, "module": "internal"})
    assert kind == "ServerCheckResponse"
    assert body["resultCode"] == 200 and body["errorCode"] == 0 and body["supportAbilityNegotiation"] is True
    conn_id = body["connectionId"]
    assert conn_id.split("_")[1] == "127.0.0.1"
    await client.open_stream()
    await client.send("ConnectionSetupRequest", {"clientVersion": "raw", "labels": {"module": "naming"},
                                                 "abilityTable": {"x": True}})
    kind, ack = await client.receive()
    assert kind == "SetupAckRequest" and ack["abilityTable"] == {"supportPersistentInstanceByGrpc": True,
                                                          "fuzzyWatch": True, "lock": True}
    assert "requestId" not in ack and ack["headers"] == {}
    kind, body = await client.call("InstanceRequest", register_body("proto-a"))
    assert (kind, body["resultCode"], body["type"]) == ("InstanceResponse", 200, "registerInstance")
    # the same transport keeps its identity
    assert (await client.call("ServerCheckRequest"))[1]["connectionId"] == conn_id


async def test_stream_and_setup_before_server_check_works(raw: Any) -> None:
    client = await raw()
    await client.open_stream()
    await client.send("ConnectionSetupRequest", {"clientVersion": "raw", "labels": {"module": "naming"},
                                                 "abilityTable": {}})
    assert (await client.receive())[0] == "SetupAckRequest"
    kind, body = await client.call("HealthCheckRequest", {})
    assert (kind, body["errorCode"]) == ("HealthCheckResponse", 0)
    kind, body = await client.call("ServerCheckRequest", {})
    assert kind == "ServerCheckResponse" and body["connectionId"]
    kind, body = await client.call("InstanceRequest", register_body("proto-b"))
    assert body["resultCode"] == 200


async def test_pre_2_3_client_gets_no_setup_ack(raw: Any) -> None:
    client = await raw()
    await client.connect(negotiate=False)
    await wait_until(lambda: _health_ok(client), what="registration")
    kind, body = await client.call("SubscribeServiceRequest", {"namespace": "public", "serviceName": "proto-c",
                                                               "groupName": "DEFAULT_GROUP", "subscribe": True,
                                                               "clusters": ""})
    assert kind == "SubscribeServiceResponse" and body["serviceInfo"]["hosts"] == []
    # the first message the server sends is the first-subscription push, not a SetupAck
    kind, push = await client.receive()
    assert kind == "NotifySubscriberRequest" and push["serviceInfo"]["name"] == "proto-c"
    assert push["requestId"] and push["headers"] == {}
    await client.send("NotifySubscriberResponse", {"resultCode": 200, "errorCode": 0,
                                                   "requestId": push["requestId"]})


async def _health_ok(client: RawClient) -> bool:
    return (await client.call("HealthCheckRequest", {}))[1]["errorCode"] == 0


@pytest.mark.parametrize(("type_name", "body"), [
    ("InstanceRequest", register_body("proto-unreg")),
    ("HealthCheckRequest", {}),
    ("ServiceListRequest", {"pageNo": 1, "pageSize": 10}),
])
async def test_request_before_setup_is_unregistered_301(raw: Any, type_name: str, body: Any) -> None:
    client = await raw()
    await client.call("ServerCheckRequest", {})
    kind, reply = await client.call(type_name, body)
    assert kind == "ErrorResponse"
    assert (reply["resultCode"], reply["errorCode"], reply["message"]) == (500, 301, "Connection is unregistered.")


@pytest.mark.parametrize("type_name", ["NoSuchRequest", "ConfigQueryRequest", "ConfigPublishRequest", ""])
async def test_unknown_and_config_module_types_get_302(raw: Any, type_name: str) -> None:
    client = await raw()
    await client.connect()
    kind, reply = await client.call(type_name, {"dataId": "x"})
    assert kind == "ErrorResponse" and reply["errorCode"] == 302 and reply["message"] == "RequestHandler Not Found"


async def test_cluster_only_type_is_forbidden_on_the_sdk_port(raw: Any) -> None:
    client = await raw()
    await client.connect()
    kind, reply = await client.call("DistroDataRequest", {"dataOperation": "SNAPSHOT"})
    assert kind == "ErrorResponse" and reply["errorCode"] == 502
    assert "from sdk is forbidden" in reply["message"]


@pytest.mark.parametrize("raw_body", [b"{not json", b"[1, 2]", b"\xff\xfe", b'{"port": NaN}', b'"text"'])
async def test_malformed_body_is_502_and_connection_survives(raw: Any, raw_body: bytes) -> None:
    client = await raw()
    await client.connect()
    kind, reply = await client.call("InstanceRequest", raw=raw_body)
    assert kind == "ErrorResponse" and (reply["resultCode"], reply["errorCode"]) == (500, 502)
    assert (await client.call("InstanceRequest", register_body("proto-after-bad")))[1]["resultCode"] == 200


@pytest.mark.parametrize(("change", "code", "needle"), [
    ({"serviceName": "bad name"}, 400, "Param check invalid:Param 'serviceName'"),
    ({"groupName": "bad/group"}, 400, "Param check invalid:Param 'group'"),
    ({"namespace": "ns with space"}, 400, "Param check invalid:Param 'namespaceId'"),
])
async def test_invalid_names_get_the_typed_param_check_answer(raw: Any, change: dict[str, Any], code: int,
                                                              needle: str) -> None:
    client = await raw()
    await client.connect()
    kind, reply = await client.call("InstanceRequest", {**register_body("proto-names"), **change})
    assert kind == "InstanceResponse"  # typed as the handler's response, like RemoteParamCheckFilter
    assert (reply["resultCode"], reply["errorCode"]) == (500, code) and reply["message"].startswith(needle)


@pytest.mark.parametrize(("body", "needle"), [
    ({**register_body("proto-v"), "type": "fooInstance"}, "Unsupported request type fooInstance"),
    ({**register_body("proto-v"), "serviceName": ""}, "serviceName"),
    (register_body("proto-v", port="eighty"), "port"),
    (register_body("proto-v", ip=""), "ip"),
    (register_body("proto-v", weight="heavy"), "weight"),
    (register_body("proto-v", weight=10000.5), "instance format invalid: The weights range"),  # as HTTP says it
    (register_body("proto-v", port=70000), "'port'"),
    (register_body("proto-v", metadata=["not", "a", "map"]), "metadata"),
    (register_body("proto-v", clusterName="bad_cluster"), "clusterName"),
    (register_body("proto-v", metadata={"preserved.heart.beat.interval": "60000"}), "heart beat"),
    ({**register_body("proto-v"), "instance": None}, "instance"),
])
async def test_bad_fields_are_400_errors_that_name_the_field(raw: Any, body: dict[str, Any], needle: str) -> None:
    client = await raw()
    await client.connect()
    kind, reply = await client.call("InstanceRequest", body)
    assert kind == "ErrorResponse" and (reply["resultCode"], reply["errorCode"]) == (400, 400)
    assert needle in reply["message"]


async def test_persistent_instance_request_into_an_ephemeral_service_is_refused_clearly(raw: Any) -> None:
    client = await raw()
    await client.connect()
    assert (await client.call("InstanceRequest", register_body("proto-p")))[1]["resultCode"] == 200
    kind, reply = await client.call("PersistentInstanceRequest", register_body("proto-p", ephemeral=False))
    assert kind == "ErrorResponse" and reply["errorCode"] == 400 and "ephemeral service" in reply["message"]


async def test_naming_request_from_non_naming_connection_is_minus_401(raw: Any) -> None:
    client = await raw()
    await client.connect(labels={"source": "sdk", "module": "config"})
    kind, reply = await client.call("InstanceRequest", register_body("proto-cfg"))
    assert kind == "ErrorResponse" and reply["errorCode"] == -401


async def test_oversized_payload_is_refused_and_node_keeps_serving(raw: Any) -> None:
    client = await raw()
    await client.connect()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.call("InstanceRequest", register_body("proto-big", metadata={"k": "v" * 100_000}))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await client.call("InstanceRequest", register_body("proto-big")))[1]["resultCode"] == 200
    other = await raw()
    await other.connect()
    assert (await other.call("HealthCheckRequest", {}))[1]["errorCode"] == 0


async def test_garbage_on_the_stream_is_ignored(raw: Any) -> None:
    client = await raw()
    await client.connect()
    await client.send("NotifySubscriberResponse", raw=b"{oops")
    await client.send("NotifySubscriberResponse", {"requestId": "999999", "resultCode": 200})
    await client.send("InstanceRequest", register_body("proto-stream"))  # requests on the stream are dropped
    assert (await client.call("HealthCheckRequest", {}))[1]["errorCode"] == 0


async def test_push_failure_answer_is_retried(raw: Any) -> None:
    subscriber, publisher = await raw(), await raw()
    await subscriber.connect()
    await publisher.connect()
    await subscriber.call("SubscribeServiceRequest", {"namespace": "public", "serviceName": "proto-retry",
                                                      "groupName": "DEFAULT_GROUP", "subscribe": True})
    kind, first = await subscriber.receive()
    assert kind == "NotifySubscriberRequest"
    await subscriber.send("ErrorResponse", {"resultCode": 500, "errorCode": -500, "requestId": first["requestId"]})
    kind, again = await subscriber.receive(timeout=5)  # retried after pushTaskRetryDelay
    assert kind == "NotifySubscriberRequest" and again["requestId"] != first["requestId"]
    await subscriber.send("NotifySubscriberResponse", {"resultCode": 200, "errorCode": 0,
                                                       "requestId": again["requestId"]})


async def test_connection_limit_refuses_setup(servers: Callable[..., ServerProcess]) -> None:
    server = servers(wait=False)
    (server.data_dir / "loader").mkdir()
    (server.data_dir / "loader" / "limitRule").write_text(json.dumps({"countLimitPerClientIpDefault": 1}))
    server.wait_ready()
    first, second = RawClient(server.grpc_port), RawClient(server.grpc_port)
    try:
        await first.connect()
        await second.call("ServerCheckRequest", {})
        await second.open_stream()
        await second.send("ConnectionSetupRequest", {"labels": {"module": "naming"}, "abilityTable": {}})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await second.receive()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "limit" in (err.value.details() or "")
        assert (await first.call("HealthCheckRequest", {}))[1]["errorCode"] == 0
    finally:
        await first.close()
        await second.close()


async def test_node_answers_300_while_starting(servers: Callable[..., ServerProcess]) -> None:
    server = servers("-D", "shoal.startup.delay-ms=4000", wait=False)
    client = RawClient(server.grpc_port)
    try:
        async def starting_answer() -> Any:
            try:
                return await client.call("ServerCheckRequest", {})
            except grpc.aio.AioRpcError:
                return None  # not listening yet
        kind, body = await wait_until(starting_answer, what="the gRPC port to answer")
        assert kind == "ErrorResponse" and body["errorCode"] == 300
        assert body["message"] == "Server is starting,please try later."
        assert http_get(server.url("/nacos/v1/console/health/readiness"))[0] == 500
        await asyncio.to_thread(server.wait_ready)
        assert (await client.call("ServerCheckRequest", {}))[0] == "ServerCheckResponse"
    finally:
        await client.close()


async def test_sigterm_closes_streams_and_exits_zero(servers: Callable[..., ServerProcess]) -> None:
    server = servers()
    client = RawClient(server.grpc_port)
    try:
        await client.connect()
        server.signal(signal.SIGTERM)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.receive(timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # 0 only once Node.stop() has finished (a stop over its 5 s budget exits 1, a crash otherwise)
        assert await asyncio.to_thread(server.proc.wait, 5) == 0
    finally:
        await client.close()


async def test_connections_over_a_lowered_limit_are_reset_then_closed(
        servers: Callable[..., ServerProcess]) -> None:
    server = servers("-D", "nacos.remote.server.connection.check-interval-ms=300",
                     "-D", "nacos.remote.server.connection.redirect-address=10.0.0.100:8848")
    older, newer = RawClient(server.grpc_port), RawClient(server.grpc_port)
    try:
        await older.connect()
        await newer.connect()
        (server.data_dir / "loader").mkdir()
        (server.data_dir / "loader" / "limitRule").write_text(json.dumps({"countLimitPerClientIpDefault": 1}))
        kind, reset = await newer.receive(timeout=10)  # the newest connection over the limit
        assert kind == "ConnectResetRequest"
        assert (reset["serverIp"], reset["serverPort"]) == ("10.0.0.100", "8848") and reset["requestId"]
        with pytest.raises(grpc.aio.AioRpcError) as err:  # it stayed: closed on the next scan
            await newer.receive(timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (await older.call("HealthCheckRequest", {}))[1]["errorCode"] == 0
        assert server.metric("connections_closed_total", reason="over connection limit") >= 1
    finally:
        await older.close()
        await newer.close()
