"""The Open API over aiohttp's in-process test server: Nacos's shapes for every endpoint, the v2
envelope and codes, a table of bad inputs (400 naming the parameter, never 500), forwarding, and
auth over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shoal.auth.service import AuthService
from shoal.metrics import Metrics
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import OPEN_SETTINGS, SECURE_SETTINGS, Registry, make_registry
from shoal.transport.http.auth_routes import AuthRoutes
from shoal.transport.http.console_api import ConsoleRoutes
from shoal.transport.http.forward import ForwardAllTo, Forwarder, Standalone
from shoal.transport.http.naming import NamingRoutes
from shoal.transport.http.server import HttpServer

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


class Status:
    def is_serving(self) -> bool:
        return True

    def readiness_problem(self) -> str | None:
        return None


@dataclasses.dataclass
class Http:
    client: TestClient[Any, Any]
    registry: Registry
    server: HttpServer
    auth: AuthService

    async def call(self, method: str, path: str, expect: int = 200, **kw: Any) -> Any:
        resp = await self.client.request(method, path, **kw)
        text = await resp.text()
        assert resp.status == expect, (method, path, kw, resp.status, text)
        if resp.content_type == "application/json":
            return json.loads(text)
        return text


Factory = Callable[..., Any]


@pytest.fixture
async def make_http(tmp_path: Path) -> AsyncIterator[Factory]:
    made: list[TestClient[Any, Any]] = []
    registries: list[Registry] = []

    async def factory(responsibility: Any = None, fallback: Callable[[Registry], Any] | None = None,
                      **overrides: Any) -> Http:
        # open unless a test says otherwise (SECURE_SETTINGS)
        registry = make_registry(data_dir=str(tmp_path / f"n{len(made)}"), **{**OPEN_SETTINGS, **overrides})
        await registry.start_cp()
        registries.append(registry)
        config = registry.config
        auth = AuthService(config, now_s=lambda: registry.clock.now_ms() / 1000)
        await auth.start()
        forwarder = Forwarder(responsibility or Standalone(), config.http_forward_timeout_ms, None,
                              fallback(registry) if fallback is not None else None)
        server = HttpServer(config, Status(), Metrics(), auth, forwarder)
        naming = NamingRoutes(config, registry.naming, lambda: True, forwarder.owner_of)
        server.install([*server.routes(), *naming.routes(), *ConsoleRoutes(registry.naming).routes(),
                        *AuthRoutes(auth).routes()])
        client = TestClient(TestServer(server.app))
        await client.start_server()
        made.append(client)
        return Http(client, registry, server, auth)

    yield factory
    for client in made:
        await client.close()
    for registry in registries:
        await registry.stop_cp()


@pytest.fixture
async def http(make_http: Factory) -> Http:
    result: Http = await make_http()
    return result


# --- v1 instances -------------------------------------------------------------------------
async def test_v1_register_list_detail_deregister(http: Http) -> None:
    assert await http.call("POST", "/nacos/v1/ns/instance", params={
        "serviceName": "svc", "ip": "10.0.0.5", "port": "8080", "weight": "2.5", "enable": "True",
        "healthy": "True", "ephemeral": "True", "clusterName": "c1", "metadata": '{"k":"v"}'}) == "ok"
    info = await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc", "clusters": "c1",
                                                                          "healthyOnly": "False"})
    assert (info["name"], info["groupName"], info["clusters"]) == ("DEFAULT_GROUP@@svc", "DEFAULT_GROUP", "c1")
    [host] = info["hosts"]
    assert (host["ip"], host["port"], host["weight"], host["clusterName"]) == ("10.0.0.5", 8080, 2.5, "c1")
    assert host["metadata"] == {"k": "v"} and host["instanceId"] == "10.0.0.5#8080#c1#DEFAULT_GROUP@@svc"
    detail = await http.call("GET", "/nacos/v1/ns/instance", params={
        "serviceName": "DEFAULT_GROUP@@svc", "ip": "10.0.0.5", "port": "8080", "cluster": "c1"})
    assert detail == {"service": "DEFAULT_GROUP@@svc", "ip": "10.0.0.5", "port": 8080, "clusterName": "c1",
                      "weight": 2.5, "healthy": True, "instanceId": "10.0.0.5#8080#c1#DEFAULT_GROUP@@svc",
                      "metadata": {"k": "v"}}
    assert await http.call("DELETE", "/nacos/v1/ns/instance", params={
        "serviceName": "svc", "ip": "10.0.0.5", "port": "8080"}) == "ok"
    assert (await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"}))["hosts"] == []
    assert await http.call("DELETE", "/nacos/v1/ns/instance", params={  # unknown: still ok
        "serviceName": "svc", "ip": "10.0.0.5", "port": "8080"}) == "ok"


async def test_v1_parameters_from_form_body_and_grouped_names(http: Http) -> None:
    assert await http.call("POST", "/nacos/v1/ns/instance", data={
        "serviceName": "SHOP@@orders", "groupName": "IGNORED", "ip": "10.0.0.6", "port": "81",
        "metadata": "a=1,b=2", "namespaceId": "dev"}) == "ok"
    info = await http.call("GET", "/nacos/v1/ns/instance/list",
                           params={"serviceName": "orders", "groupName": "SHOP", "namespaceId": "dev"})
    assert info["name"] == "SHOP@@orders" and info["hosts"][0]["metadata"] == {"a": "1", "b": "2"}
    # and the query string wins over the body, as getParameter does
    assert await http.call("PUT", "/nacos/v1/ns/instance?weight=4", data={
        "serviceName": "SHOP@@orders", "ip": "10.0.0.6", "port": "81", "namespaceId": "dev", "weight": "3"}) == "ok"
    info = await http.call("GET", "/nacos/v1/ns/instance/list",
                           params={"serviceName": "SHOP@@orders", "namespaceId": "dev"})
    assert info["hosts"][0]["weight"] == 4.0


async def test_v1_update_and_patch(http: Http) -> None:
    base = {"serviceName": "svc", "ip": "10.0.0.5", "port": "8080"}
    await http.call("POST", "/nacos/v1/ns/instance", params={**base, "metadata": '{"a":"1"}', "weight": "3"})
    await http.call("PATCH", "/nacos/v1/ns/instance", params={**base, "enabled": "false"})
    inst = (await http.call("GET", "/nacos/v1/ns/instance", params=base))
    assert inst["weight"] == 3.0  # PATCH leaves what it was not given
    assert (await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"}))["hosts"] == []
    await http.call("PUT", "/nacos/v1/ns/instance", params={**base, "metadata": '{"b":"2"}'})
    inst = await http.call("GET", "/nacos/v1/ns/instance", params=base)
    assert inst["weight"] == 1.0 and inst["metadata"] == {"a": "1", "b": "2"}  # PUT: defaults, merged metadata
    assert "no matched ip" in await http.call("PATCH", "/nacos/v1/ns/instance", 404,
                                              params={**base, "ip": "10.0.0.9"})


async def test_v1_beat_shapes(http: Http) -> None:
    light = {"serviceName": "svc", "ip": "10.0.0.5", "port": "8080"}
    assert await http.call("PUT", "/nacos/v1/ns/instance/beat", params=light) == {
        "clientBeatInterval": 5000, "code": 20404, "lightBeatEnabled": True}
    beat = {"serviceName": "DEFAULT_GROUP@@svc", "ip": "10.0.0.5", "port": 8080, "weight": 1.0,
            "ephemeral": True, "metadata": {"preserved.heart.beat.interval": "2000"}}
    answer = await http.call("PUT", "/nacos/v1/ns/instance/beat",
                             params={"serviceName": "DEFAULT_GROUP@@svc", "beat": json.dumps(beat)})
    assert answer == {"clientBeatInterval": 2000, "code": 10200, "lightBeatEnabled": True}
    assert (await http.call("PUT", "/nacos/v2/ns/instance/beat", params=light))["code"] == 10200
    assert len((await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"}))["hosts"]) == 1


async def test_http_registration_is_visible_to_grpc_reads_and_the_other_way(http: Http) -> None:
    await http.call("POST", "/nacos/v1/ns/instance", params={"serviceName": "svc", "ip": "10.0.0.5", "port": "1"})
    http.registry.connect("conn-1")
    http.registry.naming.ephemeral.register_instance("conn-1", SVC, InstanceInfo("10.0.0.6", 2))
    grpc_view = json.loads(http.registry.naming.reads.query(SVC))
    http_view = await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"})
    assert {h["ip"] for h in grpc_view["hosts"]} == {h["ip"] for h in http_view["hosts"]} == {"10.0.0.5", "10.0.0.6"}
    assert grpc_view["name"] == "svc" and http_view["name"] == "DEFAULT_GROUP@@svc"


# --- v2 ---------------------------------------------------------------------------------------
async def test_v2_instance_envelope(http: Http) -> None:
    base = {"serviceName": "svc", "groupName": "G", "ip": "10.0.0.5", "port": "8080"}
    assert await http.call("POST", "/nacos/v2/ns/instance", data={**base, "metadata": '{"k":"v"}'}) == {
        "code": 0, "message": "success", "data": "ok"}
    listed = await http.call("GET", "/nacos/v2/ns/instance/list", params={"serviceName": "svc", "groupName": "G"})
    assert listed["code"] == 0 and listed["data"]["name"] == "G@@svc" and len(listed["data"]["hosts"]) == 1
    detail = await http.call("GET", "/nacos/v2/ns/instance", params=base)
    assert detail["data"]["serviceName"] == "G@@svc" and detail["data"]["metadata"] == {"k": "v"}
    assert (await http.call("PUT", "/nacos/v2/ns/instance", data={**base, "weight": "5"}))["data"] == "ok"
    assert (await http.call("DELETE", "/nacos/v2/ns/instance", params=base))["data"] == "ok"
    missing = await http.call("GET", "/nacos/v2/ns/instance", 404, params=base)
    assert missing["code"] == 20004


async def test_v2_errors_use_nacos_error_codes(http: Http) -> None:
    missing = await http.call("POST", "/nacos/v2/ns/instance", 400, params={"ip": "1.1.1.1", "port": "1"})
    assert missing == {"code": 10000, "message": "parameter missing", "data": "Param 'serviceName' is required."}
    weight = await http.call("POST", "/nacos/v2/ns/instance", 400,
                             params={"serviceName": "s", "ip": "1.1.1.1", "port": "1", "weight": "10001"})
    assert weight["code"] == 21001
    bad = await http.call("POST", "/nacos/v2/ns/instance", 400,
                          params={"serviceName": "s", "ip": "1.1.1.1", "port": "99999"})
    assert bad["code"] == 20002 and "port" in bad["data"]


async def test_one_instance_api_serves_both_kinds_by_ephemeral(http: Http) -> None:
    """The instance façade picks the path on ``ephemeral``: an ip:port client in the model, or a
    document in the (embedded) CP store that comes back through the watch; PATCH and DELETE reach
    whichever kind the instance is."""
    eph = {"serviceName": "eph", "ip": "1.1.1.1", "port": "1"}
    cp = {"serviceName": "cp", "ip": "2.2.2.2", "port": "2", "ephemeral": "false"}
    assert await http.call("POST", REG, params=eph) == "ok"
    assert await http.call("POST", REG, params=cp) == "ok"
    assert http.registry.clients.get("1.1.1.1:1#true") is not None
    assert http.registry.clients.get("2.2.2.2:2#false") is None  # no ip:port client for a persistent one
    assert http.registry.instance_view.get("public/DEFAULT_GROUP@@cp/DEFAULT/2.2.2.2:2") is not None
    listed = await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "cp"})
    assert [(h["ip"], h["ephemeral"]) for h in listed["hosts"]] == [("2.2.2.2", False)]
    for params in (eph, cp):
        assert await http.call("PATCH", REG, params={**params, "weight": "3"}) == "ok"
        listed = await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": params["serviceName"]})
        assert [h["weight"] for h in listed["hosts"]] == [3.0]
    assert await http.call("DELETE", REG, params=cp) == "ok"
    assert await http.call("DELETE", REG, params=eph) == "ok"
    for name in ("eph", "cp"):
        assert (await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": name}))["hosts"] == []


async def test_services_v1_and_v2(http: Http) -> None:
    assert await http.call("POST", "/nacos/v1/ns/service", params={
        "serviceName": "persist", "protectThreshold": "0.5", "metadata": '{"owner":"ops"}'}) == "ok"
    assert "already exists" in await http.call("POST", "/nacos/v1/ns/service", 400, params={"serviceName": "persist"})
    detail = await http.call("GET", "/nacos/v1/ns/service", params={"serviceName": "persist"})
    assert detail == {"namespaceId": "public", "groupName": "DEFAULT_GROUP", "name": "persist",
                      "protectThreshold": 0.5, "metadata": {"owner": "ops"},
                      "selector": {"type": "none", "contextType": "NONE"}, "clusters": []}
    # a v1-created service is persistent (Nacos): ephemeral registrations into it are refused
    refused = await http.call("POST", "/nacos/v1/ns/instance", 400,
                              params={"serviceName": "persist", "ip": "1.1.1.1", "port": "1"})
    assert "persistent service" in refused
    assert await http.call("PUT", "/nacos/v1/ns/service", params={
        "serviceName": "persist", "protectThreshold": "0.1"}) == "ok"
    created = await http.call("POST", "/nacos/v2/ns/service", data={
        "serviceName": "eph", "ephemeral": "true", "metadata": '{"a":"b"}'})
    assert created["data"] == "ok"
    await http.call("POST", "/nacos/v1/ns/instance", params={"serviceName": "eph", "ip": "1.1.1.1", "port": "1"})
    v2 = (await http.call("GET", "/nacos/v2/ns/service", params={"serviceName": "eph"}))["data"]
    assert v2["ephemeral"] is True and list(v2["clusterMap"]) == ["DEFAULT"] and v2["metadata"] == {"a": "b"}
    assert (await http.call("POST", "/nacos/v2/ns/service", 400, params={"serviceName": "eph"}))["code"] == 21007
    assert (await http.call("DELETE", "/nacos/v2/ns/service", 400, params={"serviceName": "eph"}))["code"] == 21009
    assert (await http.call("GET", "/nacos/v2/ns/service", 404, params={"serviceName": "nope"}))["code"] == 21008
    assert await http.call("DELETE", "/nacos/v2/ns/service", 400, params={"serviceName": "nope"}) == {
        "code": 21008, "message": "service not exist",
        "data": "service not found, namespace: public, service: DEFAULT_GROUP@@nope"}
    assert await http.call("PUT", "/nacos/v2/ns/service", 400, params={"serviceName": "nope"}) == {
        "code": 21008, "message": "service not exist",
        "data": "service not found, namespace: public, service: DEFAULT_GROUP@@nope"}
    listed = await http.call("GET", "/nacos/v1/ns/service/list", params={"pageNo": "1", "pageSize": "10"})
    assert listed == {"count": 2, "doms": ["eph", "persist"]}
    v2_list = await http.call("GET", "/nacos/v2/ns/service/list", params={"pageSize": "1", "pageNo": "2"})
    assert v2_list["data"] == {"count": 2, "services": ["persist"]}
    # Nacos clamps the offset: pageNo 0 or below is the first page (the npm SDK's tests send 0);
    # pageSize 0 is an empty page; v2's pageSize over 500 is 500 (Math.min)
    assert await http.call("GET", "/nacos/v1/ns/service/list", params={"pageNo": "0", "pageSize": "10"}) == listed
    assert await http.call("GET", "/nacos/v1/ns/service/list", params={"pageNo": "1", "pageSize": "0"}) == {
        "count": 2, "doms": []}
    v2_list = await http.call("GET", "/nacos/v2/ns/service/list", params={"pageNo": "-3", "pageSize": "501"})
    assert v2_list["data"] == {"count": 2, "services": ["eph", "persist"]}
    assert await http.call("DELETE", "/nacos/v1/ns/service", params={"serviceName": "persist"}) == "ok"
    assert "not exist" in await http.call("DELETE", "/nacos/v1/ns/service", 400, params={"serviceName": "persist"})


async def test_operator_cluster_and_client_endpoints(http: Http) -> None:
    assert await http.call("GET", "/nacos/v1/ns/operator/metrics") == {"status": "UP"}
    await http.call("POST", "/nacos/v1/ns/instance", params={"serviceName": "svc", "ip": "10.0.0.5", "port": "1"})
    http.registry.connect("1700000000000_127.0.0.1_5555")
    full = await http.call("GET", "/nacos/v1/ns/operator/metrics", params={"onlyStatus": "false"})
    assert (full["instanceCount"], full["clientCount"], full["ephemeralIpPortClientCount"],
            full["connectionBasedClientCount"], full["responsibleClientCount"]) == (1, 2, 1, 1, 2)
    assert (await http.call("GET", "/nacos/v2/ns/operator/metrics"))["data"] == {"status": "UP"}
    nodes = await http.call("GET", "/nacos/v1/core/cluster/nodes")
    assert nodes["code"] == 200 and nodes["data"][0]["state"] == "UP" and ":" in nodes["data"][0]["address"]
    assert (await http.call("GET", "/nacos/v2/core/cluster/node/list"))["data"][0]["state"] == "UP"
    clients = (await http.call("GET", "/nacos/v2/ns/client/list"))["data"]
    assert clients == ["10.0.0.5:1#true", "1700000000000_127.0.0.1_5555"]
    ipport = (await http.call("GET", "/nacos/v2/ns/client", params={"clientId": "10.0.0.5:1#true"}))["data"]
    assert (ipport["clientType"], ipport["clientIp"], ipport["clientPort"]) == ("ipport", "10.0.0.5", "1")
    conn = (await http.call("GET", "/nacos/v2/ns/client", params={"clientId": clients[1]}))["data"]
    assert (conn["clientType"], conn["clientPort"]) == ("connection", "5555")
    pubs = (await http.call("GET", "/nacos/v2/ns/client/publish/list", params={"clientId": clients[0]}))["data"]
    assert pubs[0]["serviceName"] == "svc" and pubs[0]["registeredInstance"]["ip"] == "10.0.0.5"
    missing = await http.call("GET", "/nacos/v2/ns/client", 404, params={"clientId": "nope"})
    assert missing["code"] == 20004


async def test_health_probes_and_prometheus_still_answer(http: Http) -> None:
    assert await http.call("GET", "/nacos/v1/console/health/liveness") == "OK"
    assert await http.call("GET", "/nacos/v1/console/health/readiness") == "OK"
    await http.call("GET", "/nacos/v1/ns/operator/metrics")
    text = await http.call("GET", "/nacos/actuator/prometheus")
    assert 'shoal_requests_total{code="200",transport="http",type="/nacos/v1/ns/operator/metrics"}' in text


# --- bad input: every row is a 4xx whose message names the problem; never a 500 ----------------
REG = "/nacos/v1/ns/instance"
BAD_INPUTS = [
    ("POST", REG, {"ip": "1.1.1.1", "port": "1"}, 400, "serviceName"),
    ("POST", REG, {"serviceName": "s", "port": "1"}, 400, "'ip'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1"}, 400, "'port'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "x"}, 400, "'port'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "70000"}, 400, "'port'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "-1"}, 400, "'port'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "weight": "abc"}, 400, "'weight'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "weight": "NaN"}, 400, "'weight'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "weight": "-1"}, 400, "weights range"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "healthy": "maybe"}, 400, "'healthy'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "enabled": "2"}, 400, "'enabled'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "metadata": "a"}, 400, "'metadata'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "metadata": "[1]"}, 400, "'metadata'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "metadata": '{"a":{"b":1}}'}, 400,
     "metadata.a"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "clusterName": "a_b"}, 400, "clusterName"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "clusterName": "a b"}, 400, "cluster"),
    ("POST", REG, {"serviceName": "a@@b@@c", "ip": "1.1.1.1", "port": "1"}, 400, "serviceName"),
    ("POST", REG, {"serviceName": "@@svc", "ip": "1.1.1.1", "port": "1"}, 400, "serviceName"),
    ("POST", REG, {"serviceName": "s", "ip": "1 1", "port": "1"}, 400, "'ip'"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "namespaceId": "a/b"}, 400, "namespaceId"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "groupName": "a b"}, 400, "group"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1",
                   "metadata": json.dumps({"preserved.heart.beat.timeout": "1"})}, 400, "heart beat"),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "metadata": json.dumps({"k": "v" * 2000})},
     400, "Metadata"),
    ("DELETE", REG, {"serviceName": "s", "port": "1"}, 400, "'ip'"),
    ("PUT", REG, {"serviceName": "nope", "ip": "1.1.1.1", "port": "1"}, 400, "service not found"),
    ("GET", REG, {"serviceName": "s", "ip": "1.1.1.1"}, 400, "'port'"),
    ("GET", "/nacos/v1/ns/instance/list", {}, 400, "serviceName"),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "s", "healthyOnly": "yes"}, 400, "healthyOnly"),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "s", "udpPort": "u"}, 400, "udpPort"),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "s", "clusters": "a,b c"}, 400, "cluster"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s"}, 400, "'ip'"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": "{"}, 400, "'beat'"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": "[]"}, 400, "'beat'"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1"}'}, 400, "beat.port"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"port":1}'}, 400, "beat.ip"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1","port":1,"weight":"x"}'},
     400, "beat.weight"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1","port":1,"weight":20000}'},
     400, "weights range"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1","port":70000}'},
     400, "'port'"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "ip": "1.1.1.1", "port": "70000"}, 400, "'port'"),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "s", "udpPort": "70000"}, 400, "udpPort"),
    ("DELETE", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "70000"}, 400, "'port'"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1","port":1,"ephemeral":false}'},
     400, "persistent"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1","port":1,"metadata":5}'},
     400, "beat.metadata"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "s", "protectThreshold": "x"}, 400, "protectThreshold"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "s", "selector": "{"}, 400, "selector"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "s", "selector": '{"type":"cmdb"}'}, 400, "selector"),
    ("PUT", "/nacos/v1/ns/service", {"serviceName": "s"}, 400, "protectThreshold"),
    ("GET", "/nacos/v1/ns/service", {"serviceName": "nope"}, 400, "service not found"),
    ("GET", "/nacos/v1/ns/service/list", {"pageSize": "10"}, 400, "pageNo"),
    ("GET", "/nacos/v1/ns/service/list", {"pageNo": "x", "pageSize": "10"}, 400, "pageNo"),
    ("GET", "/nacos/v2/ns/service/list", {"pageSize": "1.5"}, 400, "pageSize"),
    ("GET", "/nacos/v1/ns/operator/metrics", {"onlyStatus": "nah"}, 400, "onlyStatus"),
    ("GET", "/nacos/v2/ns/client", {}, 400, "clientId"),
    ("GET", "/nacos/v1/ns/nothing-here", {}, 404, "Not Found"),
    ("GET", "/nacos/v3/ns/instance", {}, 404, "Not Found"),
    ("POST", "/nacos/v1/auth/users/login", {"username": "x"}, 400, "password"),
    ("POST", "/nacos/v1/auth/users", {"username": "a b", "password": "p"}, 400, "username"),
    ("POST", "/nacos/v1/auth/users", {"username": "x", "password": "p" * 80}, 400, "password"),
    ("POST", "/nacos/v1/auth/permissions", {"role": "r", "resource": "x", "action": "z"}, 400, "action"),
]


@pytest.mark.parametrize(("method", "path", "params", "status", "needle"), BAD_INPUTS,
                         ids=[f"{m} {p.rsplit('/', 1)[1]} {sorted(q)}" for m, p, q, _s, _n in BAD_INPUTS])
async def test_bad_input_is_a_clear_4xx(http: Http, method: str, path: str, params: dict[str, str], status: int,
                                        needle: str) -> None:
    resp = await http.client.request(method, path, params=params)
    text = await resp.text()
    assert resp.status == status, text
    assert needle in text


async def test_bad_form_body_and_file_fields_are_400(http: Http) -> None:
    resp = await http.client.post(REG, data=b"serviceName=%ZZ&ip=\xff", headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 400, await resp.text()
    from aiohttp import FormData

    form = FormData()
    form.add_field("serviceName", b"x", filename="f.txt")
    resp = await http.client.post(REG, data=form)
    assert resp.status == 400 and "serviceName" in await resp.text()


# --- hostile input: a clear 4xx, no 500, no traceback ----------------------------
DEEP = '{"a":' * 50_000 + "1" + "}" * 50_000
NESTED = "[" * 1_000 + "1" + "]" * 1_000  # parses (orjson allows 1,024 levels), but str() of it recurses
HOSTILE_INPUTS = [
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "metadata": DEEP}),
    ("POST", REG, {"serviceName": "s", "ip": "1.1.1.1", "port": "1", "metadata": '{"k":' + NESTED + "}"}),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": DEEP}),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":' + NESTED + ',"port":1}'}),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "s", "beat": '{"ip":"1.1.1.1","port":' + NESTED + "}"}),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "s", "selector": DEEP}),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "s", "selector": '{"type":' + NESTED + "}"}),
]


@pytest.mark.parametrize(("method", "path", "form"), HOSTILE_INPUTS,
                         ids=[f"{m} {p.rsplit('/', 1)[1]} {i}" for i, (m, p, _f) in enumerate(HOSTILE_INPUTS)])
async def test_hostile_json_parameters_are_a_400(http: Http, method: str, path: str, form: dict[str, str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    resp = await http.client.request(method, path, data=form)
    assert resp.status == 400, await resp.text()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_body_over_the_size_limit_is_a_413(make_http: Factory) -> None:
    http = await make_http(max_inbound_message_size=64 * 1024)
    resp = await http.client.post(REG, data={"serviceName": "s", "ip": "1.1.1.1", "port": "1",
                                             "metadata": "a" * 100_000})
    assert resp.status == 413, await resp.text()
    resp = await http.client.post(REG, data={"serviceName": "s", "ip": "1.1.1.1", "port": "1"})
    assert resp.status == 200, await resp.text()


async def test_a_declared_oversize_body_is_refused_before_it_is_read(make_http: Factory) -> None:
    """A Content-Length over the limit is answered 413 at once: the node neither waits for nor
    buffers the body (fault 4: a burst of such requests held up to the limit in memory each)."""
    http = await make_http(max_inbound_message_size=64 * 1024)
    reader, writer = await asyncio.open_connection(http.client.host, http.client.port)
    try:
        writer.write(f"POST {REG} HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                     f"Content-Length: {1024 * 1024}\r\nConnection: close\r\n\r\n".encode() + b"serviceName=s")
        await writer.drain()
        # only the headers and 13 bytes of the body were sent: an answer now means nothing waited for the rest
        status = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
    assert status.split()[1] == b"413", status


async def test_unparseable_http_is_a_warning_without_traceback(http: Http, caplog: pytest.LogCaptureFixture) -> None:
    host, port = http.client.host, http.client.port
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /nacos/v1/ns/instance/list?serviceName=" + b"x" * 20_000 + b" HTTP/1.1\r\n\r\n")
            await writer.drain()
            status_line = await reader.readline()
            writer.close()
            assert status_line.split(b" ")[1] == b"400"
    aiohttp_lines = [r for r in caplog.records if r.name == "aiohttp.server"]
    ours = [r for r in caplog.records if r.name == "shoal.transport.http.server"]
    assert aiohttp_lines == []
    assert len(ours) == 1 and ours[0].levelno == logging.WARNING and ours[0].exc_info is None


# --- forwarding (DistroFilter) ------------------------------------------------------------------
async def test_writes_for_an_ip_port_owned_elsewhere_are_forwarded(make_http: Factory) -> None:
    owner: Http = await make_http()
    address = f"{owner.client.host}:{owner.client.port}"
    entry: Http = await make_http(ForwardAllTo(address))
    params = {"serviceName": "svc", "ip": "10.0.0.5", "port": "8080"}
    assert await entry.call("POST", REG, data=params) == "ok"
    assert owner.registry.clients.get("10.0.0.5:8080#true") is not None
    assert entry.registry.clients.get("10.0.0.5:8080#true") is None
    beat = await entry.call("PUT", "/nacos/v1/ns/instance/beat", params=params)
    assert beat["code"] == 10200
    v2_error = await entry.call("POST", "/nacos/v2/ns/instance", 400, params={**params, "port": "x"})
    assert v2_error["code"] == 20002  # the owner's answer is relayed as is
    # reads are served locally
    assert (await entry.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"}))["hosts"] == []


async def test_a_forwarded_request_that_is_still_not_ours_is_refused(make_http: Factory) -> None:
    http: Http = await make_http(ForwardAllTo("127.0.0.1:1"))
    text = await http.call("POST", REG, 400, params={"serviceName": "s", "ip": "1.1.1.1", "port": "1"},
                           headers={"User-Agent": "Nacos-Server:2.5.1"})
    assert "invalid redirect" in text


async def test_unreachable_owner_is_a_502(make_http: Factory) -> None:
    http: Http = await make_http(ForwardAllTo("127.0.0.1:1"))
    text = await http.call("POST", REG, 502, params={"serviceName": "s", "ip": "1.1.1.1", "port": "1"})
    assert "127.0.0.1:1" in text


def _fallback(owner: str) -> Callable[[Registry], Any]:
    """The cluster's forward fallback over real members (``owner`` UP) and a real handoff."""
    from shoal.distro.mapper import DistroMapper, IpPortHandoff
    from shoal.distro.members import MemberManager
    from shoal.distro.responsibility import DistroFallback

    def build(registry: Registry) -> DistroFallback:
        clock = registry.clock
        members = MemberManager("127.0.0.1", 8848, clock.now_ms)
        members.set_members([("127.0.0.1", 8848), (owner.split(":")[0], int(owner.split(":")[1]))])
        handoff = IpPortHandoff(clock, registry.clients, members, DistroMapper(members), lambda *a, **k: None)
        return DistroFallback(members, handoff)

    return build


async def test_a_write_the_owner_does_not_take_is_handled_here_in_a_cluster(make_http: Factory) -> None:
    """An owner that cannot be reached costs no client a failure (docs/protocol.md §5.5)."""
    owner = "127.0.0.1:1"  # refuses
    http: Http = await make_http(ForwardAllTo(owner), _fallback(owner))
    fallback = http.server.forwarder.fallback
    params = {"serviceName": "s", "ip": "1.1.1.1", "port": "1"}
    assert await http.call("POST", REG, params=params) == "ok"
    client = http.registry.clients.get("1.1.1.1:1#true")
    assert client is not None and client.native
    assert not fallback.members.answering(owner)  # the failed forward counted against the owner
    beat = await http.call("PUT", "/nacos/v1/ns/instance/beat", params=params)  # not waited for again
    assert beat["code"] == 10200 and http.server.forwarder.handled_locally == 2
    await http.server.forwarder.stop()


async def test_a_forwarded_write_still_not_ours_is_handled_here_in_a_cluster(make_http: Factory) -> None:
    """The sending peer sees another owner for a moment (member views differ): serve it, never 400."""
    owner = "127.0.0.1:1"
    http: Http = await make_http(ForwardAllTo(owner), _fallback(owner))
    assert await http.call("POST", REG, params={"serviceName": "s", "ip": "1.1.1.1", "port": "1"},
                           headers={"User-Agent": "Nacos-Server:shoal-1"}) == "ok"
    await http.server.forwarder.stop()


# --- auth over HTTP ----------------------------------------------------------------------------
async def authed(make_http: Factory) -> tuple[Http, str]:
    http: Http = await make_http(**SECURE_SETTINGS)
    created = await http.call("POST", "/nacos/v1/auth/users/admin", data={"password": "adminpw"})
    assert created == {"username": "nacos", "password": "adminpw"}
    token = (await http.call("POST", "/nacos/v1/auth/login", params={"username": "nacos", "password": "adminpw"}))
    return http, token["accessToken"]


async def test_auth_refuses_without_token_and_accepts_login_token(make_http: Factory) -> None:
    http, token = await authed(make_http)
    params = {"serviceName": "svc", "ip": "1.1.1.1", "port": "1"}
    assert await http.call("POST", REG, 403, params=params) == "user not found!"
    assert await http.call("POST", REG, 403, params={**params, "accessToken": "garbage"}) == "token invalid!"
    assert await http.call("POST", REG, params={**params, "accessToken": token}) == "ok"
    assert await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"},
                           headers={"Authorization": f"Bearer {token}"}) != ""
    assert await http.call("GET", "/nacos/v1/ns/instance/list", params={"serviceName": "svc"},
                           headers={"accessToken": token}) != ""
    v2 = await http.call("GET", "/nacos/v2/ns/instance/list", 403, params={"serviceName": "svc"})
    assert v2["code"] == 10001
    # username/password on every call (no login) also works
    assert await http.call("DELETE", REG, params={**params, "username": "nacos", "password": "adminpw"}) == "ok"
    # the health probe and the metrics status stay open
    assert await http.call("GET", "/nacos/v1/ns/operator/metrics") == {"status": "UP"}


async def test_token_past_its_ttl_is_refused_over_http(make_http: Factory) -> None:
    http, token = await authed(make_http)
    http.registry.clock.advance(18000 * 1000)
    text = await http.call("GET", "/nacos/v1/ns/instance/list", 403, params={"serviceName": "s", "accessToken": token})
    assert text == "token expired!"


async def test_roles_give_read_or_write_per_namespace(make_http: Factory) -> None:
    http, admin = await authed(make_http)
    a = {"accessToken": admin}
    assert (await http.call("POST", "/nacos/v1/auth/users", params={**a, "username": "dev", "password": "pw"}))[
        "message"] == "create user ok!"
    await http.call("POST", "/nacos/v1/auth/roles", params={**a, "role": "devs", "username": "dev"})
    await http.call("POST", "/nacos/v1/auth/permissions", params={**a, "role": "devs", "resource": "dev:*:*",
                                                                  "action": "rw"})
    await http.call("POST", "/nacos/v1/auth/permissions", params={**a, "role": "devs", "resource": "public:*:*",
                                                                  "action": "r"})
    login = await http.call("POST", "/nacos/v1/auth/users/login", data={"username": "dev", "password": "pw"})
    assert login["globalAdmin"] is False
    d = {"accessToken": login["accessToken"]}
    inst = {"serviceName": "svc", "ip": "1.1.1.1", "port": "1"}
    assert await http.call("POST", REG, params={**d, **inst, "namespaceId": "dev"}) == "ok"
    assert await http.call("POST", REG, 403, params={**d, **inst}) == "authorization failed!"
    await http.call("GET", "/nacos/v1/ns/instance/list", params={**d, "serviceName": "svc"})
    await http.call("GET", "/nacos/v1/auth/users", 403, params=d)  # admin only
    await http.call("GET", "/nacos/v1/core/cluster/nodes", 403, params=d)
    users = await http.call("GET", "/nacos/v1/auth/users", params=a)
    assert [u["username"] for u in users["pageItems"]] == ["dev", "nacos"] and "password" not in users["pageItems"][0]
    perms = await http.call("GET", "/nacos/v1/auth/permissions", params={**a, "role": "devs"})
    assert perms["totalCount"] == 2
    roles = await http.call("GET", "/nacos/v1/auth/roles", params={**a, "username": "dev"})
    assert roles["pageItems"] == [{"role": "devs", "username": "dev"}]
    # a user may change their own password, not someone else's
    await http.call("PUT", "/nacos/v1/auth/users", params={**d, "username": "dev", "newPassword": "pw2"})
    await http.call("PUT", "/nacos/v1/auth/users", 403, params={**d, "username": "nacos", "newPassword": "x"})
    await http.call("DELETE", "/nacos/v1/auth/users", params={**a, "username": "dev"})
    await http.call("POST", "/nacos/v1/auth/login", 403, params={"username": "dev", "password": "pw2"})


async def test_first_admin_endpoint_answers_409_once_an_admin_exists(make_http: Factory) -> None:
    http, _token = await authed(make_http)
    answer = await http.call("POST", "/nacos/v1/auth/users/admin", 409)
    assert answer == {"code": 409, "message": "have admin user cannot use it", "data": None}


async def test_failed_logins_are_rate_limited_per_source(make_http: Factory) -> None:
    http, _token = await authed(make_http)
    for _ in range(http.registry.config.auth_login_max_failures):
        assert await http.call("POST", "/nacos/v1/auth/login", 403,
                               params={"username": "nacos", "password": "bad"}) == "unknown user!"
    resp = await http.client.post("/nacos/v1/auth/login", params={"username": "nacos", "password": "adminpw"})
    assert resp.status == 429 and resp.headers["Retry-After"] and "too many failed logins" in await resp.text()
