"""The rest of the Nacos 3.x admin API on real servers (docs/protocol.md §5.7): metadata batch and
partial update, the client and subscriber views, operator switches and log levels, the core
cluster/namespace/state/loader/ops routes, the 501 answers for what Shoal does not offer, and the
auth rules of each (no token, a non-admin user, an admin)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shoal.config import TestHooks
from shoal.testing import ServerProcess, poll_until, wait_until
from shoal.testing.auth import PASSWORD, add_user_with_grant, ok
from shoal.testing.http import call, call_json
from shoal.testing.rawclient import RawClient

from . import admin

node = admin.node  # one server for the module
auth_node = admin.auth_node  # with auth and an admin `nacos`
NS = "/nacos/v3/admin/ns"
CORE = "/nacos/v3/admin/core"
pytestmark = pytest.mark.integration

#: the fields of Shoal's ``pushLag`` in every subscriber list
LAG_KEYS = {"lastMs", "p99Ms", "acks", "pending", "pendingForMs"}


def error(method: str, url: str, status: int, params: dict[str, str] | None = None,
          data: dict[str, str] | None = None) -> int:
    """The v2 ErrorCode of a refused call (the envelope is checked too)."""
    body = call_json(method, url, params, data, status=status)
    assert set(body) == {"code", "message", "data"} and body["code"] != 0, body
    return int(body["code"])


def call_raw(method: str, url: str, raw: bytes, content_type: str = "application/json") -> tuple[int, Any]:
    """A call with a raw body (3.x's @RequestBody routes take JSON)."""
    status, text = call(method, url, body=raw, headers={"Content-Type": content_type})
    return status, json.loads(text)


def instances(server: ServerProcess, svc: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {h["ip"]: h for h in ok(call_json("GET", server.url(NS + "/instance/list"), svc))}


def test_metadata_batch_and_partial_update(node: ServerProcess) -> None:
    svc = {"serviceName": "meta", "groupName": "G"}
    for ip in ("10.6.0.1", "10.6.0.2"):
        assert ok(call_json("POST", node.url(NS + "/instance"), data={**svc, "ip": ip, "port": "80",
                                                                      "metadata": '{"keep":"1"}'})) == "ok"
    # no instances named: every ephemeral instance; the keys are merged
    done = ok(call_json("PUT", node.url(NS + "/instance/metadata/batch"), data={**svc, "metadata": '{"env":"prod"}'}))
    assert sorted(done["updated"]) == ["10.6.0.1:80:DEFAULT", "10.6.0.2:80:DEFAULT"]
    assert all(h["metadata"] == {"keep": "1", "env": "prod"} for h in instances(node, svc).values())
    # DELETE removes the keys from the named instance only
    one = json.dumps([{"ip": "10.6.0.1", "port": 80}])
    done = ok(call_json("DELETE", node.url(NS + "/instance/metadata/batch"),
                        {**svc, "instances": one, "metadata": '{"env":""}'}))
    assert done == {"updated": ["10.6.0.1:80:DEFAULT"]}
    hosts = instances(node, svc)
    assert hosts["10.6.0.1"]["metadata"] == {"keep": "1"} and hosts["10.6.0.2"]["metadata"]["env"] == "prod"
    # bad input: missing metadata or service, metadata that is not JSON nor k=v, instances not a JSON list
    batch = node.url(NS + "/instance/metadata/batch")
    assert error("PUT", batch, 400, data=svc) == 10000
    assert error("PUT", batch, 400, data={"metadata": "a=b"}) == 10000
    assert error("PUT", batch, 400, data={**svc, "metadata": '{"env":'}) == 20002
    assert error("PUT", batch, 400, data={**svc, "metadata": "a=b", "instances": "[{"}) == 20002
    # partial: only the given fields change
    partial = node.url(NS + "/instance/partial")
    assert ok(call_json("PUT", partial, data={**svc, "ip": "10.6.0.2", "port": "80", "weight": "5"})) == "ok"
    host = instances(node, svc)["10.6.0.2"]
    assert host["weight"] == 5.0 and host["enabled"] is True and host["metadata"] == {"keep": "1", "env": "prod"}
    assert ok(call_json("PUT", partial, data={**svc, "ip": "10.6.0.2", "port": "80", "enabled": "false"})) == "ok"
    host = instances(node, svc)["10.6.0.2"]
    assert host["weight"] == 5.0 and host["enabled"] is False
    assert error("PUT", partial, 400, data={**svc, "ip": "10.6.0.2", "port": "80", "weight": "-1"}) in (20002, 21001)
    assert error("PUT", partial, 400, data={**svc, "ip": "10.6.0.2", "port": "80", "metadata": "{bad"}) == 20002
    assert error("PUT", partial, 400, data={"ip": "10.6.0.2", "port": "80", "weight": "2"}) == 10000
    assert error("PUT", partial, 404, data={**svc, "ip": "10.6.9.9", "port": "80", "weight": "2"}) == 20004


async def test_client_views_subscribers_and_distro(node: ServerProcess) -> None:
    svc = {"serviceName": "watched", "groupName": "DEFAULT_GROUP"}
    assert ok(call_json("POST", node.url(NS + "/instance"), data={**svc, "ip": "10.7.0.1", "port": "81"})) == "ok"
    client = RawClient(node.grpc_port)
    try:
        connection_id = await client.connect()
        kind, _ = await client.call("SubscribeServiceRequest", {"namespace": "public", "serviceName": "watched",
                                                                "groupName": "DEFAULT_GROUP", "subscribe": True,
                                                                "clusters": ""})
        assert kind == "SubscribeServiceResponse"
        # the client's subscriptions, as ClientServiceInfo
        subs = ok(call_json("GET", node.url(NS + "/client/subscribe/list"), {"clientId": connection_id}))
        assert subs == [{"namespaceId": "public", "groupName": "DEFAULT_GROUP", "serviceName": "watched",
                         "publisherInfo": None, "subscriberInfo": {"clientId": None, "appName": "unknown",
                                                                   "agent": "raw-test", "address": "127.0.0.1"}}]
        detail = ok(call_json("GET", node.url(NS + "/client"), {"clientId": connection_id}))
        assert detail["clientType"] == "connection" and detail["connectType"] == "GRPC"
        # the service's subscribers: ClientSubscriberInfo, and the SubscriberInfo page
        rows = ok(call_json("GET", node.url(NS + "/client/service/subscriber/list"), svc))
        assert set(rows[0].pop("pushLag")) == LAG_KEYS  # Shoal's push lag (docs/protocol.md §3.8)
        assert rows == [{"clientId": connection_id, "appName": "unknown", "agent": "raw-test", "address": "127.0.0.1"}]
        assert ok(call_json("GET", node.url(NS + "/client/service/subscriber/list"), {**svc, "ip": "10.0.0.9"})) == []
        page = ok(call_json("GET", node.url(NS + "/service/subscribers"), svc))
        assert page["totalCount"] == 1 and page["pageNumber"] == 1 and page["pagesAvailable"] == 1
        assert set(page["pageItems"][0].pop("pushLag")) == LAG_KEYS
        assert page["pageItems"] == [{"namespaceId": "public", "groupName": "DEFAULT_GROUP", "serviceName": "watched",
                                      "ip": "127.0.0.1", "port": 0, "agent": "raw-test", "appName": "unknown",
                                      "clientId": connection_id}]
        assert ok(call_json("GET", node.url(NS + "/service/subscribers"), {**svc, "pageNo": "2"}))["pageItems"] == []
        assert error("GET", node.url(NS + "/service/subscribers"), 400, {**svc, "pageSize": "0"}) == 20002
        # the loader sees the connection (v3: Result; the reloads are POST)
        current = ok(call_json("GET", node.url(CORE + "/loader/current")))
        assert current[connection_id]["metaInfo"]["connectionId"] == connection_id
    finally:
        await client.close()
    await wait_until(lambda: connection_id not in ok(call_json("GET", node.url(NS + "/client/list"))),
                     what="the closed connection's client released")
    # the service's publishers: ClientPublisherInfo, filtered by ip and port
    pubs = ok(call_json("GET", node.url(NS + "/client/service/publisher/list"), svc))
    assert pubs == [{"clientId": "10.7.0.1:81#true", "ip": "10.7.0.1", "port": 81, "clusterName": "DEFAULT"}]
    assert ok(call_json("GET", node.url(NS + "/client/service/publisher/list"), {**svc, "port": "82"})) == []
    assert ok(call_json("GET", node.url(NS + "/client/service/publisher/list"), {"serviceName": "nope"})) == []
    assert error("GET", node.url(NS + "/client/service/publisher/list"), 400) == 10000
    assert error("GET", node.url(NS + "/client/subscribe/list"), 404, {"clientId": "nope"}) == 20004
    # a standalone node is responsible for every ip:port
    owner = ok(call_json("GET", node.url(NS + "/client/distro"), {"ip": "10.7.0.1", "port": "81"}))
    assert set(owner) == {"responsibleServer"} and owner["responsibleServer"].endswith(f":{node.port}")
    assert error("GET", node.url(NS + "/client/distro"), 400, {"ip": "10.7.0.1"}) == 10000


def test_service_detail_and_list_in_the_3x_shapes(node: ServerProcess) -> None:
    ns = {"namespaceId": "listing"}
    assert ok(call_json("POST", node.url(CORE + "/namespace"), data={**ns, "namespaceName": "Listing"})) is True
    for name in ("alpha-api", "alpha-db", "beta"):
        assert ok(call_json("POST", node.url(NS + "/service"), data={**ns, "serviceName": name, "groupName": "TEAM",
                                                                     "protectThreshold": "0.5"})) == "ok"
    assert ok(call_json("POST", node.url(NS + "/instance"), data={
        **ns, "serviceName": "alpha-api", "groupName": "TEAM", "ip": "10.10.0.1", "port": "80",
        "ephemeral": "false", "healthy": "false"})) == "ok"
    detail = ok(call_json("GET", node.url(NS + "/service"), {**ns, "serviceName": "alpha-api", "groupName": "TEAM"}))
    assert detail["namespaceId"] == "listing" and "namespace" not in detail and detail["protectThreshold"] == 0.5
    listing = node.url(NS + "/service/list")
    page = ok(call_json("GET", listing, {**ns, "serviceNameParam": "alpha"}))
    assert page["totalCount"] == 2 and [i["name"] for i in page["pageItems"]] == ["alpha-api", "alpha-db"]
    poll_until(lambda: ok(call_json("GET", listing, {**ns, "ignoreEmptyService": "true"}))["totalCount"] == 1,
               timeout=10, what="the persistent instance counted")
    row = ok(call_json("GET", listing, {**ns, "ignoreEmptyService": "true"}))["pageItems"][0]
    # one instance, unhealthy: 0/1 healthy is under the 0.5 threshold
    assert row == {"name": "alpha-api", "groupName": "TEAM", "clusterCount": 1, "ipCount": 1,
                   "healthyInstanceCount": 0, "triggerFlag": "true"}
    assert ok(call_json("GET", listing, {**ns, "groupNameParam": "nope"}))["totalCount"] == 0
    paged = ok(call_json("GET", listing, {**ns, "pageNo": "2", "pageSize": "2"}))
    assert paged["pagesAvailable"] == 2 and [i["name"] for i in paged["pageItems"]] == ["beta"]
    full = ok(call_json("GET", listing, {**ns, "serviceNameParam": "alpha-api", "withInstances": "true"}))
    assert full["totalCount"] == 1
    hosts = full["pageItems"][0]["clusterMap"]["DEFAULT"]["hosts"]
    assert [h["ip"] for h in hosts] == ["10.10.0.1"]
    assert error("GET", listing, 400, {**ns, "pageNo": "0"}) == 20002


def test_client_distro_names_the_responsible_member(servers: Callable[..., ServerProcess]) -> None:
    owner = servers()
    entry = servers(env=TestHooks(forward_all_to=owner.addr).to_env())
    answer = ok(call_json("GET", entry.url(NS + "/client/distro"), {"ip": "10.8.0.1", "port": "80"}))
    assert answer == {"responsibleServer": owner.addr}


def test_operator_switches_log_checkers_selectors(node: ServerProcess) -> None:
    switches = node.url(NS + "/ops/switches")
    assert ok(call_json("PUT", switches, data={"entry": "defaultPushCacheMillis", "value": "8000"})) == "ok"
    poll_until(lambda: ok(call_json("GET", switches))["defaultPushCacheMillis"] == 8000, timeout=10,
               what="the switch applied")
    # 3.x answers an entry or value the switches refuse with 500 / 30000, missing ones with 400 / 10000
    assert error("PUT", switches, 500, data={"entry": "noSuchEntry", "value": "1"}) == 30000
    assert error("PUT", switches, 500, data={"entry": "defaultPushCacheMillis", "value": "lots"}) == 30000
    assert error("PUT", switches, 500, data={"entry": "distroThreshold", "value": "0.5"}) == 30000  # no effect here
    assert error("PUT", switches, 400, data={"entry": "defaultPushCacheMillis"}) == 10000
    assert ok(call_json("PUT", switches, data={"entry": "defaultPushCacheMillis", "value": "10000"})) == "ok"
    log = node.url(NS + "/ops/log")
    assert ok(call_json("PUT", log, data={"logName": "naming-push", "logLevel": "DEBUG"})) == "ok"
    assert ok(call_json("PUT", log, data={"logName": "naming-push", "logLevel": "INFO"})) == "ok"
    assert error("PUT", log, 400, data={"logName": "no-such-log", "logLevel": "INFO"}) == 20002
    assert error("PUT", log, 400, data={"logName": "naming-push"}) == 10000
    checkers = ok(call_json("GET", node.url(NS + "/health/checkers")))
    assert checkers["TCP"] == {"type": "TCP"} and checkers["HTTP"]["type"] == "HTTP"
    assert ok(call_json("GET", node.url(NS + "/service/selector/types"))) == ["none", "label"]


def test_core_cluster_namespace_state_ops(node: ServerProcess) -> None:
    me = ok(call_json("GET", node.url(CORE + "/cluster/node/self")))
    assert me["state"] == "UP" and me["port"] == node.port and me["address"].endswith(f":{node.port}")
    assert ok(call_json("GET", node.url(CORE + "/namespace/check"), {"namespaceId": "public"})) == 1
    assert ok(call_json("GET", node.url(CORE + "/namespace/check"), {"namespaceId": "absent"})) == 0
    assert error("GET", node.url(CORE + "/namespace/check"), 400) == 10000
    assert ok(call_json("GET", node.url(CORE + "/state/liveness"))) == "ok"
    assert ok(call_json("GET", node.url(CORE + "/state/readiness"))) == "ok"
    assert ok(call_json("GET", node.url(CORE + "/ops/ids"))) == []
    # the core log level takes 3.x's JSON body (LogUpdateRequest), or parameters
    status, answer = call_raw("PUT", node.url(CORE + "/ops/log"), b'{"logName":"core-distro","logLevel":"DEBUG"}')
    assert status == 200 and ok(answer) is None
    assert ok(call_json("PUT", node.url(CORE + "/ops/log"), data={"logName": "core", "logLevel": "INFO"})) is None
    status, answer = call_raw("PUT", node.url(CORE + "/ops/log"), b'{"logName":')
    assert (status, answer["code"]) == (400, 20002)
    status, answer = call_raw("PUT", node.url(CORE + "/ops/log"), b'{"logName":"core"}')
    assert (status, answer["code"]) == (400, 10000)
    # what has no meaning here: 501 / 40001 (Nacos's answer for a disabled function), not 404
    status, answer = call_raw("POST", node.url(CORE + "/ops/raft"), b'{"command":"transferLeader"}')
    assert (status, answer["code"], answer["message"]) == (501, 40001, "API function disabled.")
    status, answer = call_raw("PUT", node.url(CORE + "/cluster/node/list"), b"[]")
    assert (status, answer["code"]) == (501, 40001)
    assert error("PUT", node.url(CORE + "/cluster/lookup"), 501, data={"type": "file"}) == 40001
    assert error("GET", node.url("/nacos/v3/admin/cs/config"), 501, {"dataId": "a", "groupName": "b"}) == 40001
    assert error("POST", node.url("/nacos/v3/client/cs/config/listener"), 501, data={"x": "y"}) == 40001


def test_core_loader_in_the_result_shape(node: ServerProcess) -> None:
    loader = CORE + "/loader"
    assert isinstance(ok(call_json("GET", node.url(loader + "/current"))), dict)
    summary = ok(call_json("GET", node.url(loader + "/cluster")))
    assert summary["memberCount"] == 1 and summary["detail"][0]["address"].endswith(f":{node.port}")
    assert ok(call_json("POST", node.url(loader + "/reloadCurrent"), data={"count": "100"})) is None
    assert ok(call_json("POST", node.url(loader + "/reloadClient"), data={"connectionId": "nope"})) is None
    smart = call_json("POST", node.url(loader + "/smartReloadCluster"))
    assert smart == {"code": 0, "message": "success", "data": None} or smart == {
        "code": 30000, "message": "server error", "data": "Smart reload failed, please try again later."}
    assert error("POST", node.url(loader + "/reloadCurrent"), 400) == 10000
    assert error("POST", node.url(loader + "/reloadClient"), 400) == 10000
    assert call("GET", node.url(loader + "/reloadCurrent"), {"count": "1"})[0] == 405  # a write is POST in 3.x
    # the v2 loader keeps its own shapes
    assert call("GET", node.url("/nacos/v2/core/loader/reloadCurrent"), {"count": "100"}) == (200, "success")


def login(server: ServerProcess, username: str, password: str) -> dict[str, str]:
    answer = call_json("POST", server.url("/nacos/v3/auth/user/login"), data={"username": username,
                                                                             "password": password})
    return {"accessToken": answer["accessToken"]}


ADMIN_ROUTES = (
    ("PUT", NS + "/instance/metadata/batch", {"serviceName": "s", "metadata": "a=b"}),
    ("PUT", NS + "/instance/partial", {"serviceName": "s", "ip": "10.9.0.1", "port": "80", "weight": "2"}),
    ("GET", NS + "/client/service/publisher/list", {"serviceName": "s"}),
    ("GET", NS + "/client/service/subscriber/list", {"serviceName": "s"}),
    ("GET", NS + "/client/distro", {"ip": "10.9.0.1", "port": "80"}),
    ("GET", NS + "/service/subscribers", {"serviceName": "s"}),
    ("GET", NS + "/health/checkers", {}),
    ("PUT", NS + "/ops/switches", {"entry": "defaultPushCacheMillis", "value": "10000"}),
    ("PUT", NS + "/ops/log", {"logName": "naming-push", "logLevel": "INFO"}),
    ("GET", CORE + "/cluster/node/self", {}),
    ("GET", CORE + "/namespace/check", {"namespaceId": "public"}),
    ("GET", CORE + "/loader/current", {}),
    ("POST", CORE + "/loader/reloadCurrent", {"count": "100"}),
    ("GET", CORE + "/ops/ids", {}),
    ("PUT", CORE + "/ops/log", {"logName": "core", "logLevel": "INFO"}),
    ("POST", CORE + "/ops/raft", {}),
)


def test_auth_admin_routes(auth_node: ServerProcess) -> None:
    admin = login(auth_node, "nacos", PASSWORD)
    add_user_with_grant(auth_node, admin, "ops", "ops-pass-1", "operators")
    poll_until(lambda: call("POST", auth_node.url("/nacos/v3/auth/user/login"),
                            data={"username": "ops", "password": "ops-pass-1"})[0] == 200, timeout=10,
               what="the new user")
    user = login(auth_node, "ops", "ops-pass-1")
    # the console's duplicate check before it adds a grant: an rw grant covers r and w
    check = auth_node.url("/nacos/v3/auth/permission")
    for action, expected in (("r", True), ("rw", True), ("w", True)):
        assert ok(call_json("GET", check, {**admin, "role": "operators", "resource": "public:*:*",
                                           "action": action})) is expected
    assert ok(call_json("GET", check, {**admin, "role": "operators", "resource": "dev:*:*", "action": "r"})) is False
    assert ok(call_json("GET", check, {**admin, "role": "nobody", "resource": "public:*:*", "action": "r"})) is False
    assert error("GET", check, 400, {**admin, "role": "operators", "resource": "public:*:*"}) == 10000
    assert error("GET", check, 403, {**user, "role": "operators", "resource": "public:*:*", "action": "r"}) == 10001
    for method, path, params in ADMIN_ROUTES:
        # no token, and a user with read/write on every service but not admin: 403 / 10001
        assert error(method, auth_node.url(path), 403, data=params) == 10001, path
        assert error(method, auth_node.url(path), 403, user, params) == 10001, path
        # an admin passes the check (the answer is then the route's own: success, a 400 for the
        # unknown service, 501 for raft)
        status, text = call(method, auth_node.url(path), admin, params)
        assert status != 403 and json.loads(text)["code"] != 10001, (path, status, text)
    # the state routes stay open, as in Nacos
    assert ok(call_json("GET", auth_node.url(CORE + "/state/liveness"))) == "ok"
    assert ok(call_json("GET", auth_node.url(CORE + "/state/readiness"))) == "ok"
