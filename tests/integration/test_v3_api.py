"""The Nacos 3.x HTTP surface on real servers: the Result envelope and ErrorCodes of the client,
admin and core endpoints, with auth off and on, and a 3.x-style login flow (v3 first, v1 on 404)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shoal.config import TestHooks
from shoal.testing import ServerProcess, poll_until
from shoal.testing.auth import PASSWORD, add_user_with_grant, ok
from shoal.testing.http import call, call_json

from . import admin

node = admin.node  # one server for the module
auth_node = admin.auth_node  # with auth and an admin `nacos`
CLIENT = "/nacos/v3/client/ns/instance"
ADMIN_INSTANCE = "/nacos/v3/admin/ns/instance"
ADMIN_SERVICE = "/nacos/v3/admin/ns/service"
NAMESPACE = "/nacos/v3/admin/core/namespace"
pytestmark = pytest.mark.integration


def test_client_register_list_heartbeat_deregister(node: ServerProcess) -> None:
    svc = {"serviceName": "orders", "groupName": "G"}
    assert ok(call_json("POST", node.url(CLIENT), data={**svc, "ip": "10.0.0.1", "port": "80"})) == "ok"
    assert ok(call_json("POST", node.url(CLIENT), data={**svc, "ip": "10.0.0.2", "port": "80",
                                                        "enabled": "false"})) == "ok"
    hosts = ok(call_json("GET", node.url(CLIENT + "/list"), svc))
    assert [(h["ip"], h["port"]) for h in hosts] == [("10.0.0.1", 80)]  # enabled=false left out
    # the admin list shows both, the detail is the Instance shape
    listed = ok(call_json("GET", node.url(ADMIN_INSTANCE + "/list"), svc))
    assert sorted(h["ip"] for h in listed) == ["10.0.0.1", "10.0.0.2"]
    detail = ok(call_json("GET", node.url(ADMIN_INSTANCE), {**svc, "ip": "10.0.0.1", "port": "80"}))
    assert detail["ip"] == "10.0.0.1" and detail["port"] == 80 and detail["clusterName"] == "DEFAULT"
    # heartBeat=true renews a known instance and answers 21003 for an unknown one
    assert ok(call_json("POST", node.url(CLIENT), data={**svc, "ip": "10.0.0.1", "port": "80",
                                                        "heartBeat": "true"})) == "ok"
    assert call_json("POST", node.url(CLIENT), data={**svc, "ip": "10.9.9.9", "port": "80", "heartBeat": "true"}) == {
        "code": 21003, "message": "instance not found", "data": None}
    assert ok(call_json("DELETE", node.url(CLIENT), {**svc, "ip": "10.0.0.1", "port": "80"})) == "ok"
    assert ok(call_json("GET", node.url(CLIENT + "/list"), svc)) == []


def test_error_codes(node: ServerProcess) -> None:
    missing = call_json("POST", node.url(CLIENT), data={"serviceName": "x", "port": "80"}, status=400)
    assert missing["code"] == 10000 and missing["message"] == "parameter missing"
    bad = call_json("POST", node.url(CLIENT), data={"serviceName": "x", "ip": "1.1.1.1", "port": "80",
                                                    "weight": "-1"}, status=400)
    assert bad["code"] in (20002, 21001)
    absent = call_json("GET", node.url(ADMIN_SERVICE), {"serviceName": "nope"}, status=404)
    assert absent["code"] == 21008
    gone = call_json("GET", node.url(ADMIN_INSTANCE), {"serviceName": "nope", "ip": "1.1.1.1", "port": "1"},
                     status=404)
    assert gone["code"] == 20004
    assert call_json("GET", node.url(NAMESPACE), {"namespaceId": "absent"}, status=404)["code"] == 22001


def test_admin_service_and_namespace(node: ServerProcess) -> None:
    assert ok(call_json("POST", node.url(NAMESPACE), data={"namespaceId": "dev", "namespaceName": "Dev"})) is True
    assert "dev" in [n["namespace"] for n in ok(call_json("GET", node.url(NAMESPACE + "/list")))]
    assert ok(call_json("GET", node.url(NAMESPACE), {"namespaceId": "dev"}))["namespaceShowName"] == "Dev"
    svc = {"namespaceId": "dev", "groupName": "G", "serviceName": "pay"}
    created = call_json("POST", node.url(ADMIN_SERVICE), data={**svc, "protectThreshold": "0.5", "ephemeral": "true"})
    assert ok(created) == "ok"
    assert ok(call_json("POST", node.url(ADMIN_INSTANCE), data={**svc, "ip": "10.1.0.1", "port": "81"})) == "ok"
    assert ok(call_json("GET", node.url(ADMIN_SERVICE), svc))["protectThreshold"] == 0.5
    page = ok(call_json("GET", node.url(ADMIN_SERVICE + "/list"), {"namespaceId": "dev", "groupName": "G"}))
    assert page["totalCount"] == 1 and page["pageItems"] == [
        {"name": "pay", "groupName": "G", "clusterCount": 1, "ipCount": 1, "healthyInstanceCount": 1,
         "triggerFlag": "false"}]
    assert ok(call_json("DELETE", node.url(ADMIN_INSTANCE), {**svc, "ip": "10.1.0.1", "port": "81"})) == "ok"


def test_core_state_and_nodes(node: ServerProcess) -> None:
    state = ok(call_json("GET", node.url("/nacos/v3/admin/core/state")))
    assert state["standalone_mode"] == "standalone" and state["auth_enabled"] == "false"
    nodes = ok(call_json("GET", node.url("/nacos/v3/admin/core/cluster/node/list")))
    assert len(nodes) == 1 and nodes[0]["state"] == "UP"


def login_3x(server: ServerProcess, username: str, password: str) -> dict[str, Any]:
    """What the 3.x Java client does: /v3/auth/user/login first, /v1/auth/users/login only on 404."""
    code, text = call("POST", server.url("/nacos/v3/auth/user/login"), data={"username": username,
                                                                            "password": password})
    if code == 404:
        code, text = call("POST", server.url("/nacos/v1/auth/users/login"), data={"username": username,
                                                                                 "password": password})
    assert code == 200, text
    answer: dict[str, Any] = json.loads(text)
    return answer


def test_auth_login_v3_first_and_rules(auth_node: ServerProcess) -> None:
    svc = {"serviceName": "orders"}
    # without a token: every secured v3 route is refused with ACCESS_DENIED; state stays open
    for method, path, params in (("GET", CLIENT + "/list", svc), ("GET", ADMIN_INSTANCE + "/list", svc),
                                 ("GET", NAMESPACE + "/list", {}), ("GET", "/nacos/v3/admin/core/cluster/node/list",
                                                                    {})):
        body = call_json(method, auth_node.url(path), params, status=403)
        assert body["code"] == 10001, (path, body)
    assert ok(call_json("GET", auth_node.url("/nacos/v3/admin/core/state")))["auth_enabled"] == "true"
    # a wrong password fails the v3 login (it does not fall back: the route exists)
    assert call("POST", auth_node.url("/nacos/v3/auth/user/login"),
                data={"username": "nacos", "password": "wrong"})[0] == 403
    answer = login_3x(auth_node, "nacos", PASSWORD)
    assert answer["globalAdmin"] is True and answer["username"] == "nacos" and answer["tokenTtl"] > 0
    token = {"accessToken": answer["accessToken"]}
    assert ok(call_json("POST", auth_node.url(CLIENT), params=token,
                        data={**svc, "ip": "10.2.0.1", "port": "82"})) == "ok"
    assert [h["ip"] for h in ok(call_json("GET", auth_node.url(CLIENT + "/list"), {**svc, **token}))] == ["10.2.0.1"]
    assert [h["ip"] for h in ok(call_json("GET", auth_node.url(ADMIN_INSTANCE + "/list"), {**svc, **token}))] == [
        "10.2.0.1"]
    # a user without the admin role may use the client API it has permissions for, not the admin API
    # (made through the v3 auth administration, answered in the Result envelope)
    add_user_with_grant(auth_node, token, "app", "app-pass-1", "apps")
    poll_until(lambda: "app" in call("GET", auth_node.url("/nacos/v3/auth/user/list"), token)[1], timeout=10,
               what="the user listed")
    users = ok(call_json("GET", auth_node.url("/nacos/v3/auth/user/list"), {**token, "pageNo": "1", "pageSize": "10"}))
    assert {u["username"] for u in users["pageItems"]} == {"nacos", "app"} and users["totalCount"] == 2
    assert call_json("POST", auth_node.url("/nacos/v3/auth/user/admin"), data={"password": "whatever-1"}) == {
        "code": 409, "message": "have admin user cannot use it", "data": None}
    app = {"accessToken": login_3x(auth_node, "app", "app-pass-1")["accessToken"]}
    poll_until(lambda: call("GET", auth_node.url(CLIENT + "/list"), {**svc, **app})[0] == 200, timeout=10,
               what="the permission applied")
    assert [h["ip"] for h in ok(call_json("GET", auth_node.url(CLIENT + "/list"), {**svc, **app}))] == ["10.2.0.1"]
    assert call_json("GET", auth_node.url(ADMIN_INSTANCE + "/list"), {**svc, **app}, status=403)["code"] == 10001
    assert call_json("GET", auth_node.url(NAMESPACE + "/list"), app, status=403)["code"] == 10001
    assert call_json("GET", auth_node.url("/nacos/v3/auth/user/list"), app, status=403)["code"] == 10001
    # a user may change their own password, not another's
    assert ok(call_json("PUT", auth_node.url("/nacos/v3/auth/user"), app,
                        {"username": "app", "newPassword": "app-pass-2"})) == "update user ok!"
    assert call_json("PUT", auth_node.url("/nacos/v3/auth/user"), app,
                     {"username": "nacos", "newPassword": "stolen-pass"}, status=403)["code"] == 10001


def test_v3_writes_are_forwarded_to_the_responsible_node(servers: Callable[..., ServerProcess]) -> None:
    """The client and admin instance writes go through the DistroFilter like v1/v2's."""
    owner = servers()
    entry = servers(env=TestHooks(forward_all_to=owner.addr).to_env())
    svc = {"serviceName": "fwd3"}
    assert ok(call_json("POST", entry.url(CLIENT), data={**svc, "ip": "10.4.0.1", "port": "80"})) == "ok"
    assert [h["ip"] for h in ok(call_json("GET", owner.url(CLIENT + "/list"), svc))] == ["10.4.0.1"]
    assert ok(call_json("GET", entry.url(CLIENT + "/list"), svc)) == []  # reads are local; the owner holds it
    assert ok(call_json("POST", entry.url(CLIENT), data={**svc, "ip": "10.4.0.1", "port": "80",
                                                         "heartBeat": "true"})) == "ok"
    assert ok(call_json("PUT", entry.url(ADMIN_INSTANCE), data={**svc, "ip": "10.4.0.1", "port": "80",
                                                                "weight": "3"})) == "ok"
    assert ok(call_json("GET", owner.url(ADMIN_INSTANCE + "/list"), svc))[0]["weight"] == 3.0
    assert ok(call_json("DELETE", entry.url(CLIENT), {**svc, "ip": "10.4.0.1", "port": "80"})) == "ok"
    assert ok(call_json("GET", owner.url(CLIENT + "/list"), svc)) == []


def test_admin_clients_ops_health_and_cluster(node: ServerProcess) -> None:
    svc = {"serviceName": "db", "groupName": "G"}
    # a persistent instance, its cluster's checker turned off, then its health set by hand
    assert ok(call_json("POST", node.url(ADMIN_INSTANCE), data={**svc, "ip": "10.5.0.1", "port": "5432",
                                                                "ephemeral": "false"})) == "ok"
    assert ok(call_json("PUT", node.url("/nacos/v3/admin/ns/cluster"), data={
        **svc, "clusterName": "DEFAULT", "healthChecker": '{"type":"NONE"}'})) == "ok"
    assert ok(call_json("PUT", node.url("/nacos/v3/admin/ns/health/instance"), data={
        **svc, "ip": "10.5.0.1", "port": "5432", "healthy": "false"})) == "ok"
    poll_until(lambda: ok(call_json("GET", node.url(ADMIN_INSTANCE + "/list"), svc)) != [], timeout=10,
               what="the persistent instance")
    poll_until(lambda: ok(call_json("GET", node.url(ADMIN_INSTANCE + "/list"), svc))[0]["healthy"] is False,
               timeout=10, what="the health set by hand")
    assert ok(call_json("GET", node.url(ADMIN_INSTANCE + "/list"), {**svc, "healthyOnly": "true"})) == []
    assert call_json("PUT", node.url("/nacos/v3/admin/ns/health/instance"), data={
        **svc, "ip": "10.5.0.1", "port": "5432"}, status=400)["code"] == 20002
    # an ephemeral HTTP client: listed, detailed, its publications
    eph = {"serviceName": "cache", "groupName": "G"}
    assert ok(call_json("POST", node.url(CLIENT), data={**eph, "ip": "10.5.0.2", "port": "80"})) == "ok"
    clients = ok(call_json("GET", node.url("/nacos/v3/admin/ns/client/list")))
    client_id = next(c for c in clients if c.startswith("10.5.0.2:80"))
    detail = ok(call_json("GET", node.url("/nacos/v3/admin/ns/client"), {"clientId": client_id}))
    # the 3.x maintainer shapes (ClientSummaryInfo, ClientServiceInfo), not v2's
    assert detail["clientType"] == "ipPort" and detail["clientIp"] == "10.5.0.2" and detail["clientPort"] == 80
    assert detail["connectType"] is None and detail["ephemeral"] is True
    published = ok(call_json("GET", node.url("/nacos/v3/admin/ns/client/publish/list"), {"clientId": client_id}))
    assert published == [{"namespaceId": "public", "groupName": "G", "serviceName": "cache", "subscriberInfo": None,
                          "publisherInfo": {"clientId": None, "ip": "10.5.0.2", "port": 80, "clusterName": "DEFAULT"}}]
    assert ok(call_json("GET", node.url("/nacos/v3/admin/ns/client/subscribe/list"), {"clientId": client_id})) == []
    assert call_json("GET", node.url("/nacos/v3/admin/ns/client"), {"clientId": "nope"}, status=404)["code"] == 20004
    assert ok(call_json("GET", node.url("/nacos/v3/admin/ns/ops/metrics")))["status"] == "UP"
    counts = ok(call_json("GET", node.url("/nacos/v3/admin/ns/ops/metrics"), {"onlyStatus": "false"}))
    assert set(counts) == {"status", "serviceCount", "instanceCount", "subscribeCount", "clientCount",
                           "connectionBasedClientCount", "ephemeralIpPortClientCount", "persistentIpPortClientCount",
                           "responsibleClientCount"} and counts["instanceCount"] >= 1  # MetricsInfo: no cpu/load
    assert ok(call_json("GET", node.url("/nacos/v3/admin/ns/ops/switches")))["healthCheckEnabled"] in (True, False)
