"""The last Nacos 2.x Open API rows on a real server (docs/protocol.md §5.2, §5.3): v1
``instance/statuses``, ``service/selector/types``, ``health/checkers``, ``operator/distro/client``
and ``push/state``, the core cluster ``self``/``health`` rows, ``/v2/core/ops``, the v2 console
health probes and the ``/v2/ns/ops`` aliases; snowflake instance ids (HTTP and the Python SDK);
Nacos's page leniency; and every numeric parameter of every route refused without a Python
``None`` or a 5xx."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import ListInstanceParam, RegisterInstanceParam, SubscribeServiceParam

from shoal.testing import OPEN, ServerProcess, kill, poll_until, start_server, wait_until
from shoal.testing.auth import PASSWORD, ok
from shoal.testing.http import call, call_json

from . import admin

node = admin.node
auth_node = admin.auth_node
pytestmark = pytest.mark.integration
SNOWFLAKE = {"preserved.instance.id.generator": "snowflake"}


def rest_ok(body: Any) -> Any:
    """The ``data`` of a core RestResult that says success."""
    assert body["code"] == 200, body
    return body["data"]


def put_json(url: str, doc: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=doc, method="PUT", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_v1_naming_rows(node: ServerProcess) -> None:
    for ip in ("10.40.0.1", "10.40.0.2"):
        assert call("POST", node.url("/nacos/v1/ns/instance"), data={
            "serviceName": "G@@rows", "ip": ip, "port": "80", "healthy": "true"}) == (200, "ok")
        assert call("POST", node.url("/nacos/v1/ns/instance"), data={
            "namespaceId": "rows-ns", "serviceName": "G@@rows", "ip": ip, "port": "81"}) == (200, "ok")
    statuses = node.url("/nacos/v1/ns/instance/statuses")
    assert call_json("GET", statuses, {"key": "G@@rows"}) == {"ips": ["10.40.0.1:80_true", "10.40.0.2:80_true"]}
    assert call_json("GET", statuses, {"key": "rows-ns##G@@rows"}) == {
        "ips": ["10.40.0.1:81_true", "10.40.0.2:81_true"]}
    assert call_json("GET", statuses, {"key": "public##G@@nothing"}) == {"ips": []}
    status, text = call("GET", statuses, {"key": "rows"})  # the service part must be grouped
    assert status == 400 and "groupName@@serviceName" in text
    assert call("GET", statuses)[0] == 400
    assert call_json("GET", node.url("/nacos/v1/ns/service/selector/types")) == {
        "code": 200, "message": None, "data": ["none", "label"]}
    checkers = call_json("GET", node.url("/nacos/v1/ns/health/checkers"))
    assert checkers["TCP"] == {"type": "TCP"} and checkers["NONE"] == {"type": "NONE"}
    for base in ("/nacos/v1/ns/operator", "/nacos/v1/ns/ops"):
        assert call_json("GET", node.url(base + "/distro/client"), {"ip": "10.40.0.1", "port": "80"}) == {
            "responsibleServer": node.addr}
        assert call("GET", node.url(base + "/distro/client"), {"ip": "10.40.0.1"})[0] == 400


async def test_push_state_counts_pushes_and_resets(node: ServerProcess, sdk: Any) -> None:
    subscriber, publisher = await sdk(node.addr), await sdk(node.addr)
    seen: list[int] = []

    async def pushed(instances: list[Any]) -> None:
        seen.append(len(instances))

    await subscriber.subscribe(SubscribeServiceParam(service_name="pushed", subscribe_callback=pushed))
    await publisher.register_instance(RegisterInstanceParam(service_name="pushed", ip="10.41.0.1", port=1))
    await wait_until(lambda: 1 in seen, what="the push")
    state = node.url("/nacos/v1/ns/operator/push/state")
    poll_until(lambda: call_json("GET", state)["total"] >= 1, timeout=10, what="the push counted")
    answer = call_json("GET", state, {"detail": "true"})
    assert set(answer) == {"succeed", "total", "ratio", "detail", "reset"} and answer["reset"] is False
    assert answer["succeed"] == answer["total"] and answer["ratio"] == 1.0
    assert answer["detail"]["maxPushCost"] >= 0 and answer["detail"]["avgPushCost"] >= 0
    assert call_json("GET", node.url("/nacos/v1/ns/ops/push/state"), {"reset": "true"})["reset"] is True
    assert call_json("GET", state, {"detail": "true"}) == {
        "succeed": 0, "total": 0, "ratio": 0, "detail": {"avgPushCost": -1, "maxPushCost": -1}, "reset": False}


def test_core_and_console_rows(node: ServerProcess) -> None:
    me = rest_ok(call_json("GET", node.url("/nacos/v1/core/cluster/self")))
    assert me["state"] == "UP" and me["port"] == node.port
    assert rest_ok(call_json("GET", node.url("/nacos/v1/core/cluster/health"))) == "UP"
    assert ok(call_json("GET", node.url("/nacos/v2/core/cluster/node/self")))["address"] == me["address"]
    assert ok(call_json("GET", node.url("/nacos/v2/core/cluster/node/self/health"))) == "UP"
    assert rest_ok(call_json("GET", node.url("/nacos/v2/core/ops/ids"))) == []
    status, answer = put_json(node.url("/nacos/v2/core/ops/log"), b'{"logName":"core-raft","logLevel":"DEBUG"}')
    assert (status, answer) == (200, {"code": 200, "message": None, "data": None})
    status, answer = put_json(node.url("/nacos/v2/core/ops/log"), b'{"logName":"core-raft","logLevel":"INFO"}')
    assert status == 200
    status, answer = put_json(node.url("/nacos/v2/core/ops/log"), b'{"logName":"nope","logLevel":"INFO"}')
    assert status == 400 and "logName" in answer["message"]
    assert ok(call_json("GET", node.url("/nacos/v2/console/health/liveness"))) == "ok"
    assert ok(call_json("GET", node.url("/nacos/v2/console/health/readiness"))) == "ok"


def test_the_other_v1_v2_naming_and_core_rows(node: ServerProcess) -> None:
    assert call("POST", node.url("/nacos/v1/ns/instance"), data={
        "serviceName": "G@@other", "ip": "10.45.0.1", "port": "80"}) == (200, "ok")
    assert call_json("GET", node.url("/nacos/v2/ns/instance/statuses/public%23%23G@@other")) == {
        "ips": ["10.45.0.1:80_true"]}
    assert call_json("GET", node.url("/nacos/v2/ns/instance/statuses/other"), status=400)["code"] == 20002
    greeting = call_json("GET", node.url("/nacos/v1/ns/health/server"))["msg"]
    assert greeting.startswith("Hello! I am Nacos-Naming and healthy! total services: ")
    assert greeting.endswith(f", local port:{node.port}")
    assert rest_ok(call_json("GET", node.url("/nacos/v1/core/cluster/simple/nodes"))) == [node.addr]
    assert rest_ok(call_json("GET", node.url("/nacos/v1/core/ops/idInfo"))) == {}
    assert call("PUT", node.url("/nacos/v1/core/ops/log"), {"logName": "core", "logLevel": "INFO"}) == (200, "200")
    assert call("PUT", node.url("/nacos/v1/core/ops/log"), {"logName": "core"})[0] == 400
    for path in ("/nacos/v1/console/server/announcement", "/nacos/v1/console/server/guide"):
        assert call_json("GET", node.url(path)) == {"code": 200, "message": None, "data": None}
    assert call("GET", node.url("/nacos/v1/console/server/announcement"), {"language": "../x"})[0] == 400
    # a persistent instance's health by hand, v2's short path
    assert ok(call_json("POST", node.url("/nacos/v2/ns/instance"), data={
        "serviceName": "hand", "ip": "10.45.0.2", "port": "80", "ephemeral": "false"})) == "ok"
    assert ok(call_json("PUT", node.url("/nacos/v2/ns/health"), data={
        "serviceName": "hand", "ip": "10.45.0.2", "port": "80", "healthy": "false"})) == "ok"
    poll_until(lambda: not call_json("GET", node.url("/nacos/v1/ns/instance"), {
        "serviceName": "hand", "ip": "10.45.0.2", "port": "80"})["healthy"], timeout=10, what="unhealthy by hand")
    # what Nacos refuses itself, and what has no meaning here
    for method, path in (("POST", "/nacos/v1/core/cluster/server/leave"), ("DELETE", "/nacos/v2/core/cluster/nodes")):
        assert call_json(method, node.url(path))["code"] == 405
    for method, path in (("POST", "/nacos/v1/core/ops/raft"), ("POST", "/nacos/v2/core/ops/raft"),
                         ("POST", "/nacos/v1/core/cluster/switch/lookup"), ("PUT", "/nacos/v2/core/cluster/lookup"),
                         ("PUT", "/nacos/v2/core/cluster/node/list"), ("POST", "/nacos/v1/core/cluster/report")):
        status, text = call(method, node.url(path), data={})
        assert (status, json.loads(text)["code"]) == (501, 40001), path


def test_v2_ops_aliases_of_the_operator_routes(node: ServerProcess) -> None:
    switches = ok(call_json("GET", node.url("/nacos/v2/ns/ops/switches")))
    assert switches == ok(call_json("GET", node.url("/nacos/v2/ns/operator/switches")))
    assert ok(call_json("PUT", node.url("/nacos/v2/ns/ops/switches"),
                        data={"entry": "defaultPushCacheMillis", "value": "12000"})) == "ok"
    assert ok(call_json("GET", node.url("/nacos/v2/ns/operator/switches")))["defaultPushCacheMillis"] == 12000
    assert ok(call_json("GET", node.url("/nacos/v2/ns/ops/metrics"))) == {"status": "UP"}
    assert ok(call_json("PUT", node.url("/nacos/v2/ns/ops/log"),
                        data={"logName": "naming-push", "logLevel": "INFO"})) == "ok"


async def test_snowflake_instance_ids(node: ServerProcess, sdk: Any) -> None:
    """``preserved.instance.id.generator=snowflake``: ``<snowflake>#cluster#group@@service``, over
    HTTP and from the Python SDK over gRPC; without it the simple form stays."""
    shape = re.compile(r"(\d{15,19})#DEFAULT#FLAKE@@ids")
    assert ok(call_json("POST", node.url("/nacos/v2/ns/instance"), data={
        "serviceName": "ids", "groupName": "FLAKE", "ip": "10.42.0.1", "port": "80",
        "metadata": json.dumps(SNOWFLAKE)})) == "ok"
    assert ok(call_json("POST", node.url("/nacos/v2/ns/instance"), data={
        "serviceName": "ids", "groupName": "FLAKE", "ip": "10.42.0.2", "port": "80"})) == "ok"
    client = await sdk(node.addr)
    assert await client.register_instance(RegisterInstanceParam(service_name="ids", group_name="FLAKE",
                                                                ip="10.42.0.3", port=80, metadata=SNOWFLAKE))
    listed = await client.list_instances(ListInstanceParam(service_name="ids", group_name="FLAKE", subscribe=False,
                                                           healthy_only=None))
    ids = {i.ip: i.instanceId for i in listed}
    assert ids["10.42.0.2"] == "10.42.0.2#80#DEFAULT#FLAKE@@ids"
    first, third = shape.fullmatch(ids["10.42.0.1"]), shape.fullmatch(ids["10.42.0.3"])
    assert first is not None and third is not None, ids
    assert int(first.group(1)) < int(third.group(1))  # increasing: registered later
    hosts = {h["ip"]: h for h in call_json("GET", node.url("/nacos/v1/ns/instance/list"),
                                           {"serviceName": "FLAKE@@ids"})["hosts"]}
    assert hosts["10.42.0.1"]["instanceId"] == ids["10.42.0.1"]
    assert hosts["10.42.0.1"]["instanceIdGenerator"] == "snowflake"


def test_the_snowflake_worker_id_setting(tmp_path: Path) -> None:
    """``nacos.core.snowflake.worker-id`` is the id's worker bits (12..21)."""
    server = start_server(tmp_path, ["-D", "nacos.core.snowflake.worker-id=513"], auth=OPEN)
    try:
        assert ok(call_json("POST", server.url("/nacos/v2/ns/instance"), data={
            "serviceName": "w", "ip": "10.47.0.1", "port": "80", "metadata": json.dumps(SNOWFLAKE)})) == "ok"
        [host] = call_json("GET", server.url("/nacos/v1/ns/instance/list"), {"serviceName": "w"})["hosts"]
        number = int(host["instanceId"].split("#")[0])
        assert (number >> 12) & 0x3FF == 513
    finally:
        kill(server)


def test_page_numbers_clamp_as_nacos(node: ServerProcess) -> None:
    """``pageNo=0`` is the first page in Nacos's v1/v2 lists (the npm SDK's tests send it)."""
    for name in ("clamp-a", "clamp-b"):
        assert call("POST", node.url("/nacos/v1/ns/instance"), data={
            "serviceName": name, "groupName": "CLAMP", "ip": "10.43.0.1", "port": "80"}) == (200, "ok")
    first = call_json("GET", node.url("/nacos/v1/ns/service/list"), {"groupName": "CLAMP", "pageNo": "1",
                                                                     "pageSize": "10"})
    assert first == {"count": 2, "doms": ["clamp-a", "clamp-b"]}
    assert call_json("GET", node.url("/nacos/v1/ns/service/list"), {"groupName": "CLAMP", "pageNo": "0",
                                                                    "pageSize": "10"}) == first
    assert ok(call_json("GET", node.url("/nacos/v2/ns/service/list"), {"groupName": "CLAMP", "pageNo": "0"})) == {
        "count": 2, "services": ["clamp-a", "clamp-b"]}
    catalog = call_json("GET", node.url("/nacos/v1/ns/catalog/services"), {"groupNameParam": "CLAMP",
                                                                           "pageNo": "0", "pageSize": "10"})
    assert catalog["count"] == 2


#: Every route with a numeric parameter, its other parameters, and the numeric ones.
NUMERIC = (
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "num", "ip": "10.44.0.1", "port": "80"}, ("port", "weight")),
    ("PUT", "/nacos/v1/ns/instance", {"serviceName": "num", "ip": "10.44.0.1", "port": "80"}, ("port", "weight")),
    ("DELETE", "/nacos/v1/ns/instance", {"serviceName": "num", "ip": "10.44.0.9", "port": "80"}, ("port",)),
    ("GET", "/nacos/v1/ns/instance", {"serviceName": "num", "ip": "10.44.0.1", "port": "80"}, ("port",)),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "num"}, ("udpPort",)),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "num", "ip": "10.44.0.1", "port": "80"}, ("port",)),
    ("GET", "/nacos/v1/ns/service/list", {"pageNo": "1", "pageSize": "10"}, ("pageNo", "pageSize")),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "num-svc"}, ("protectThreshold",)),
    ("PUT", "/nacos/v1/ns/service", {"serviceName": "num-svc", "protectThreshold": "0"}, ("protectThreshold",)),
    ("PUT", "/nacos/v1/ns/cluster", {"serviceName": "num-svc", "clusterName": "c", "healthChecker": '{"type":"TCP"}'},
     ("checkPort",)),
    ("GET", "/nacos/v1/ns/catalog/services", {}, ("pageNo", "pageSize")),
    ("GET", "/nacos/v1/ns/catalog/instances", {"serviceName": "num", "pageNo": "1", "pageSize": "10"},
     ("pageNo", "pageSize")),
    ("GET", "/nacos/v1/ns/service/subscribers", {"serviceName": "num"}, ("pageNo", "pageSize")),
    ("GET", "/nacos/v1/auth/users", {}, ("pageNo", "pageSize")),
    ("POST", "/nacos/v2/ns/instance", {"serviceName": "num2", "ip": "10.44.0.2", "port": "80"}, ("port", "weight")),
    ("GET", "/nacos/v2/ns/service/list", {}, ("pageNo", "pageSize")),
    ("POST", "/nacos/v2/ns/service", {"serviceName": "num2-svc"}, ("protectThreshold",)),
    ("POST", "/nacos/v3/client/ns/instance", {"serviceName": "num3", "ip": "10.44.0.3", "port": "80"},
     ("port", "weight")),
    ("GET", "/nacos/v3/admin/ns/service/list", {}, ("pageNo", "pageSize")),
    ("GET", "/nacos/v3/admin/ns/service/subscribers", {"serviceName": "num"}, ("pageNo", "pageSize")),
    ("GET", "/nacos/v3/admin/ns/client/service/publisher/list", {"serviceName": "num"}, ("port",)),
    ("PUT", "/nacos/v3/admin/ns/instance/partial", {"serviceName": "num", "ip": "10.44.0.1", "port": "80"},
     ("port", "weight")),
    ("GET", "/nacos/v3/console/ns/service/list", {}, ("pageNo", "pageSize")),
    ("GET", "/nacos/v3/console/ns/instance/list", {"serviceName": "num"}, ("pageNo", "pageSize")),
    ("PUT", "/nacos/v3/console/ns/instance", {"serviceName": "num", "ip": "10.44.0.1", "port": "80",
                                              "ephemeral": "true"}, ("port", "weight")),
    ("POST", "/nacos/v3/admin/core/loader/reloadCurrent", {"count": "1"}, ("count",)),
    ("POST", "/nacos/v3/admin/core/loader/smartReloadCluster", {}, ("loaderFactor",)),
)
BAD_NUMBERS = ("x", "-1", "0", "1.5", "99999999999999999999", "nan", "-inf", "1e400", "0x10")
NOT_NUMBERS = ("x", "nan", "1e400")


def test_every_numeric_parameter_is_refused_cleanly(node: ServerProcess) -> None:
    """Each numeric parameter of each route, with values out of range or not numbers: never a 5xx,
    never a Python ``None`` or traceback in the answer; what is no number at all is a 400 naming it."""
    assert call("POST", node.url("/nacos/v1/ns/instance"), data={
        "serviceName": "num", "ip": "10.44.0.1", "port": "80"}) == (200, "ok")
    for method, path, base, names in NUMERIC:
        for name in names:
            for value in BAD_NUMBERS:
                status, text = call(method, node.url(path), {**base, name: value})
                where = (method, path, name, value, status, text)
                assert status < 500 and "None" not in text and "Traceback" not in text, where
                if value in NOT_NUMBERS:  # never valid: the 400 names the parameter
                    assert status == 400 and name in text, where


ADMIN_ROWS = (
    ("GET", "/nacos/v1/ns/instance/statuses", {"key": "G@@s"}),
    ("GET", "/nacos/v1/ns/operator/push/state", {}),
    ("GET", "/nacos/v1/ns/ops/distro/client", {"ip": "10.46.0.1", "port": "80"}),
    ("GET", "/nacos/v1/core/cluster/self", {}),
    ("GET", "/nacos/v2/core/cluster/node/self/health", {}),
    ("GET", "/nacos/v2/core/ops/ids", {}),
    ("PUT", "/nacos/v2/ns/ops/switches", {"entry": "defaultPushCacheMillis", "value": "11000"}),
    ("POST", "/nacos/v2/core/ops/raft", {}),
)


def test_the_operator_rows_need_an_admin(auth_node: ServerProcess) -> None:
    token = {"accessToken": call_json("POST", auth_node.url("/nacos/v1/auth/users/login"),
                                      data={"username": "nacos", "password": PASSWORD})["accessToken"]}
    for method, path, params in ADMIN_ROWS:
        assert call(method, auth_node.url(path), params)[0] == 403, path
        status, _text = call(method, auth_node.url(path), {**token, **params})
        assert status in (200, 501), (path, status)
    # the probes stay open
    assert ok(call_json("GET", auth_node.url("/nacos/v2/console/health/liveness"))) == "ok"
    assert call_json("GET", auth_node.url("/nacos/v1/ns/health/server"))["msg"].startswith("Hello!")
