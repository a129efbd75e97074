"""The console APIs over aiohttp's in-process test server: Nacos's shapes for v1 ``catalog/*``,
``service/subscribers``, ``service/names``, v2 ``catalog/instances`` and the per-service
publisher / subscriber lists, with paging, search, filters and bad input; and the console's
files at ``/nacos/``."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shoal.errors import V2Code
from shoal.metrics import Metrics
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import Registry, make_registry
from shoal.transport.http.console_api import ConsoleRoutes
from shoal.transport.http.server import HttpServer

SVC = ServiceKey("public", "DEFAULT_GROUP", "orders")


class Status:
    def is_serving(self) -> bool:
        return True

    def readiness_problem(self) -> str | None:
        return None


class Console:
    def __init__(self, client: TestClient[Any, Any], registry: Registry) -> None:
        self.client = client
        self.registry = registry

    async def get(self, path: str, expect: int = 200, **params: Any) -> Any:
        resp = await self.client.get(path, params={k: str(v) for k, v in params.items()}, allow_redirects=False)
        text = await resp.text()
        assert resp.status == expect, (path, params, resp.status, text)
        return json.loads(text) if resp.content_type == "application/json" else text


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[Console]:
    registry = make_registry(data_dir=str(tmp_path / "n"))
    await registry.start_cp()
    server = HttpServer(registry.config, Status(), Metrics())
    server.install(ConsoleRoutes(registry.naming).routes())
    client = TestClient(TestServer(server.app))
    await client.start_server()
    yield Console(client, registry)
    await client.close()
    await registry.stop_cp()


def publish(reg: Registry, client_id: str, service: ServiceKey, *instances: InstanceInfo) -> None:
    if reg.clients.get(client_id) is None:
        reg.naming.connections.connect_client(client_id, "10.0.0.9", "app-" + client_id, "Nacos-Python-Client:v3")
    reg.naming.ephemeral.batch_register_instances(client_id, service, instances)


def subscribe(reg: Registry, client_id: str, service: ServiceKey, ip: str = "10.0.0.9") -> None:
    if reg.clients.get(client_id) is None:
        reg.naming.connections.connect_client(client_id, ip, "shop", "Nacos-Java-Client:v2.4.0")
    reg.naming.subscriptions.subscribe(client_id, service, "", ip, "Nacos-Java-Client:v2.4.0", "shop")


async def sample(reg: Registry) -> None:
    publish(reg, "c1", SVC, InstanceInfo("10.0.0.1", 8080, weight=2.0),
            InstanceInfo("10.0.0.2", 8080, healthy=False), InstanceInfo("10.0.0.3", 8080, cluster="BJ", enabled=False))
    publish(reg, "c2", ServiceKey("public", "PAY", "payments"), InstanceInfo("10.0.1.1", 9000))
    await reg.naming.service_ops.create(ServiceKey("public", "DEFAULT_GROUP", "empty"), 0.0, {}, ephemeral=True)
    publish(reg, "c3", ServiceKey("dev", "DEFAULT_GROUP", "orders"), InstanceInfo("10.0.2.1", 8080))
    subscribe(reg, "s1", SVC)
    subscribe(reg, "s2", SVC, ip="10.0.0.42")


# --- v1 catalog/services -------------------------------------------------------------------------
async def test_catalog_services_rows_counts_and_paging(console: Console) -> None:
    await sample(console.registry)
    out = await console.get("/nacos/v1/ns/catalog/services", pageNo=1, pageSize=10)
    assert out["count"] == 3
    rows = {r["name"]: r for r in out["serviceList"]}
    assert [r["groupName"] + "@@" + r["name"] for r in out["serviceList"]] == [
        "DEFAULT_GROUP@@empty", "DEFAULT_GROUP@@orders", "PAY@@payments"]
    assert rows["orders"] == {"name": "orders", "groupName": "DEFAULT_GROUP", "clusterCount": 2, "ipCount": 3,
                              "healthyInstanceCount": 1, "triggerFlag": "false", "enabledInstanceCount": 2,
                              "subscriberCount": 2}
    assert rows["empty"]["ipCount"] == 0
    page2 = await console.get("/nacos/v1/ns/catalog/services", pageNo=2, pageSize=2)
    assert page2["count"] == 3 and [r["name"] for r in page2["serviceList"]] == ["payments"]
    past = await console.get("/nacos/v1/ns/catalog/services", pageNo=9, pageSize=2)
    assert past == {"count": 3, "serviceList": []}


async def test_catalog_services_trigger_flag_follows_the_protect_threshold(console: Console) -> None:
    """ServiceView.triggerFlag is "true" once healthy / ipCount ≤ the protection threshold, as
    CatalogServiceV2Impl sets it (orders: 1 healthy of 3; an empty service is never triggered)."""
    await sample(console.registry)

    async def flags() -> dict[str, str]:
        out = await console.get("/nacos/v1/ns/catalog/services", pageNo=1, pageSize=10)
        return {r["name"]: r["triggerFlag"] for r in out["serviceList"]}

    assert await flags() == {"empty": "false", "orders": "false", "payments": "false"}
    await console.registry.naming.service_ops.update(SVC, 0.4, None)
    await console.registry.naming.service_ops.update(ServiceKey("public", "DEFAULT_GROUP", "empty"), 1.0, None)
    assert await flags() == {"empty": "false", "orders": "true", "payments": "false"}
    await console.registry.naming.service_ops.update(SVC, 0.3, None)
    assert (await flags())["orders"] == "false"


async def test_catalog_services_search_and_filters(console: Console) -> None:
    await sample(console.registry)
    by_name = await console.get("/nacos/v1/ns/catalog/services", serviceNameParam="ORD", pageNo=1, pageSize=10)
    assert [r["name"] for r in by_name["serviceList"]] == ["orders"]
    by_group = await console.get("/nacos/v1/ns/catalog/services", groupNameParam="pa", pageNo=1, pageSize=10)
    assert [r["name"] for r in by_group["serviceList"]] == ["payments"]
    with_ips = await console.get("/nacos/v1/ns/catalog/services", hasIpCount="true", pageNo=1, pageSize=10)
    assert with_ips["count"] == 2 and "empty" not in [r["name"] for r in with_ips["serviceList"]]
    unhealthy = await console.get("/nacos/v1/ns/catalog/services", unhealthyOnly="true", pageNo=1, pageSize=10)
    assert [r["name"] for r in unhealthy["serviceList"]] == ["orders"]
    dev = await console.get("/nacos/v1/ns/catalog/services", namespaceId="dev", pageNo=1, pageSize=10)
    assert dev["count"] == 1 and dev["serviceList"][0]["ipCount"] == 1


async def test_catalog_services_with_instances(console: Console) -> None:
    await sample(console.registry)
    out = await console.get("/nacos/v1/ns/catalog/services", withInstances="true", serviceNameParam="orders",
                            pageNo=1, pageSize=10)
    assert isinstance(out, list) and len(out) == 1
    detail = out[0]
    assert detail["serviceName"] == "orders" and detail["groupName"] == "DEFAULT_GROUP"
    assert sorted(detail["clusterMap"]) == ["BJ", "DEFAULT"]
    hosts = {h["ip"]: h for h in detail["clusterMap"]["DEFAULT"]["hosts"]}
    assert hosts["10.0.0.1"]["weight"] == 2.0 and hosts["10.0.0.2"]["valid"] is False


@pytest.mark.parametrize("params", [
    {"pageNo": "1.5", "pageSize": 10}, {"pageNo": 1, "pageSize": 0}, {"pageNo": 1, "pageSize": 100000},
    {"pageNo": "x", "pageSize": 10}, {"pageNo": 1, "pageSize": 10, "hasIpCount": "maybe"},
])
async def test_catalog_services_bad_input_is_400(console: Console, params: dict[str, Any]) -> None:
    text = await console.get("/nacos/v1/ns/catalog/services", 400, **params)
    assert "page" in text or "hasIpCount" in text


async def test_catalog_page_zero_is_the_first_page(console: Console) -> None:
    """Nacos's PageUtil clamps the offset: pageNo 0 or below is page 1."""
    first = await console.get("/nacos/v1/ns/catalog/services", pageNo=1, pageSize=10)
    assert await console.get("/nacos/v1/ns/catalog/services", pageNo=0, pageSize=10) == first
    assert await console.get("/nacos/v1/ns/catalog/services", pageNo=-4, pageSize=10) == first


# --- v1 catalog/instances and catalog/service ---------------------------------------------------------
async def test_catalog_instances_all_instances_paged(console: Console) -> None:
    await sample(console.registry)
    out = await console.get("/nacos/v1/ns/catalog/instances", serviceName="orders", pageNo=1, pageSize=2)
    assert out["count"] == 3 and len(out["list"]) == 2
    first = out["list"][0]
    assert {"instanceId", "ip", "port", "weight", "healthy", "enabled", "ephemeral", "clusterName", "serviceName",
            "metadata"} <= set(first)
    assert first["serviceName"] == "DEFAULT_GROUP@@orders"
    bj = await console.get("/nacos/v1/ns/catalog/instances", serviceName="orders", clusterName="BJ",
                           pageNo=1, pageSize=10)
    assert bj["count"] == 1 and bj["list"][0]["enabled"] is False  # disabled instances are listed
    grouped = await console.get("/nacos/v1/ns/catalog/instances", serviceName="PAY@@payments", pageNo=1, pageSize=10)
    assert grouped["count"] == 1


async def test_catalog_instances_errors(console: Console) -> None:
    await sample(console.registry)
    await console.get("/nacos/v1/ns/catalog/instances", 404, serviceName="nope", pageNo=1, pageSize=10)
    assert "pageNo" in await console.get("/nacos/v1/ns/catalog/instances", 400, serviceName="orders", pageSize=10)
    assert "serviceName" in await console.get("/nacos/v1/ns/catalog/instances", 400, pageNo=1, pageSize=10)


async def test_catalog_service_detail(console: Console) -> None:
    await sample(console.registry)
    await console.registry.naming.service_ops.update(SVC, 0.5, {"owner": "team-a"})
    out = await console.get("/nacos/v1/ns/catalog/service", serviceName="orders")
    assert out["service"] == {"name": "orders", "groupName": "DEFAULT_GROUP", "protectThreshold": 0.5,
                              "selector": {"type": "none", "contextType": "NONE"}, "metadata": {"owner": "team-a"},
                              "ephemeral": True, "emptyPushProtected": False}
    assert [c["name"] for c in out["clusters"]] == ["BJ", "DEFAULT"]
    assert out["clusters"][0]["serviceName"] == "DEFAULT_GROUP@@orders"
    text = await console.get("/nacos/v1/ns/catalog/service", 404, serviceName="nope")
    assert "DEFAULT_GROUP@@nope" in text
    assert "serviceName" in await console.get("/nacos/v1/ns/catalog/service", 400)


#: a subscriber nothing was pushed to yet (the in-process console runs no push engine)
NO_LAG = {"lastMs": None, "p99Ms": None, "acks": 0, "pending": 0, "pendingForMs": 0}


# --- v1 service/subscribers and service/names -----------------------------------------------------------
async def test_service_subscribers(console: Console) -> None:
    await sample(console.registry)
    out = await console.get("/nacos/v1/ns/service/subscribers", serviceName="orders")
    assert out["count"] == 2
    assert out["subscribers"][0] == {"addrStr": "10.0.0.42", "agent": "Nacos-Java-Client:v2.4.0", "app": "shop",
                                     "ip": "10.0.0.42", "port": 0, "namespaceId": "public",
                                     "serviceName": "DEFAULT_GROUP@@orders", "cluster": "",
                                     "clientId": "s2", "pushLag": NO_LAG}
    page = await console.get("/nacos/v1/ns/service/subscribers", serviceName="orders", pageNo=2, pageSize=1)
    assert page["count"] == 2 and [s["ip"] for s in page["subscribers"]] == ["10.0.0.9"]
    none = await console.get("/nacos/v1/ns/service/subscribers", serviceName="payments", groupName="PAY")
    assert none == {"subscribers": [], "count": 0}
    await console.get("/nacos/v1/ns/service/subscribers", 400)


async def test_service_names(console: Console) -> None:
    await sample(console.registry)
    everywhere = await console.get("/nacos/v1/ns/service/names")
    assert everywhere["META-INF/services"] == {
        "public": ["DEFAULT_GROUP@@empty", "DEFAULT_GROUP@@orders", "PAY@@payments"],
        "dev": ["DEFAULT_GROUP@@orders"]}
    assert everywhere["count"] == 4
    one = await console.get("/nacos/v1/ns/service/names", namespaceId="public", expr="pay")
    assert one == {"META-INF/services": {"public": ["PAY@@payments"]}, "count": 1}
    unknown = await console.get("/nacos/v1/ns/service/names", namespaceId="nowhere")
    assert unknown == {"META-INF/services": {"nowhere": []}, "count": 0}


# --- v2 ---------------------------------------------------------------------------------------------
async def test_v2_catalog_instances(console: Console) -> None:
    await sample(console.registry)
    out = await console.get("/nacos/v2/ns/catalog/instances", serviceName="orders")
    assert out["code"] == 0 and len(out["data"]) == 3
    bj = await console.get("/nacos/v2/ns/catalog/instances", serviceName="orders", clusterName="BJ")
    assert [i["ip"] for i in bj["data"]] == ["10.0.0.3"]
    missing = await console.get("/nacos/v2/ns/catalog/instances", 404, serviceName="nope")
    assert missing["code"] == 20004
    bad = await console.get("/nacos/v2/ns/catalog/instances", 400)
    assert bad["code"] == V2Code.PARAMETER_MISSING


async def test_v2_publisher_and_subscriber_lists(console: Console) -> None:
    await sample(console.registry)
    pubs = await console.get("/nacos/v2/ns/client/service/publisher/list", serviceName="orders")
    assert pubs["data"] == [{"clientId": "c1", "ip": "10.0.0.1", "port": 8080, "clusterName": "DEFAULT", "owner": ""},
                            {"clientId": "c1", "ip": "10.0.0.2", "port": 8080, "clusterName": "DEFAULT", "owner": ""},
                            {"clientId": "c1", "ip": "10.0.0.3", "port": 8080, "clusterName": "BJ", "owner": ""}]
    one = await console.get("/nacos/v2/ns/client/service/publisher/list", serviceName="orders", ip="10.0.0.2")
    assert [p["ip"] for p in one["data"]] == ["10.0.0.2"]
    subs = await console.get("/nacos/v2/ns/client/service/subscriber/list", serviceName="orders")
    assert subs["data"] == [{"clientId": "s2", "ip": "10.0.0.42", "port": 0, "pushLag": NO_LAG},
                            {"clientId": "s1", "ip": "10.0.0.9", "port": 0, "pushLag": NO_LAG}]
    missing = await console.get("/nacos/v2/ns/client/service/subscriber/list", 404, serviceName="nope")
    assert missing["code"] == 20004
    for path in ("/nacos/v2/ns/client/service/publisher/list", "/nacos/v2/ns/client/service/subscriber/list"):
        bad = await console.get(path, 400)
        assert bad["code"] == V2Code.PARAMETER_MISSING, (path, bad)
    bad_port = await console.get("/nacos/v2/ns/client/service/publisher/list", 400, serviceName="orders", port="x")
    assert bad_port["code"] == V2Code.PARAMETER_VALIDATE_ERROR, bad_port


# --- the console's files ------------------------------------------------------------------------------
async def test_console_files(console: Console) -> None:
    page = await console.get("/nacos/")
    assert "<html" in page and "/nacos/console/console.js" in page
    assert await console.get("/nacos/index.html") == page
    js = await console.client.get("/nacos/console/console.js")
    assert js.status == 200 and js.content_type == "text/javascript"
    css = await console.client.get("/nacos/console/console.css")
    assert css.status == 200 and css.content_type == "text/css"
    await console.get("/nacos/console/..%2Fapp.py", 404)
    await console.get("/nacos/console/secret.txt", 404)
    redirect = await console.client.get("/nacos", allow_redirects=False)
    assert redirect.status == 302 and redirect.headers["Location"] == "/nacos/"


# --- 10,000 services page server-side --------------------------------------------------------------------
async def test_ten_thousand_services_page_server_side(console: Console) -> None:
    reg = console.registry
    for n in range(10_000):
        publish(reg, f"c{n % 50}", ServiceKey("public", f"G{n % 10}", f"svc-{n:05d}"),
                InstanceInfo(f"10.1.{n // 250}.{n % 250}", 8080, healthy=n % 100 != 0))
    timings = []
    for params in ({"pageNo": 1, "pageSize": 20}, {"pageNo": 250, "pageSize": 20},
                   {"pageNo": 1, "pageSize": 20, "serviceNameParam": "svc-09"},
                   {"pageNo": 1, "pageSize": 20, "unhealthyOnly": "true"}):
        start = time.perf_counter()
        out = await console.get("/nacos/v1/ns/catalog/services", **params)
        timings.append((params, round((time.perf_counter() - start) * 1000, 1)))
        assert len(out["serviceList"]) <= 20
    assert out["count"] == 100  # every 100th instance is unhealthy
    print("catalog/services over 10,000 services (ms):", timings)  # a figure for the report, not an assertion


def test_settings_in_effect_list_distro_and_changed_settings_and_mask_secrets() -> None:
    from shoal.config import Config
    from shoal.transport.http.console_api import settings_in_effect

    config = Config(verify_interval_ms=700, auth_token_secret_key="c2VjcmV0" * 6, cp_password="hunter2",
                    member_report_interval_ms=2000)
    rows = {r["property"]: r for r in settings_in_effect(config)}
    assert rows["nacos.core.protocol.distro.data.verify.intervalMs"] == {
        "property": "nacos.core.protocol.distro.data.verify.intervalMs", "value": 700, "default": 5000,
        "changed": True, "doc": rows["nacos.core.protocol.distro.data.verify.intervalMs"]["doc"]}
    assert rows["shoal.member.report-interval-ms"]["changed"] is False  # Distro/membership: always listed
    assert "nacos.core.auth.enabled" not in rows  # unchanged and not a cluster setting
    for secret in ("nacos.core.auth.plugin.nacos.token.secret.key", "shoal.cp.auth.password"):
        assert rows[secret]["value"] == "(set)" and rows[secret]["default"] == "(not set)"
    assert "hunter2" not in json.dumps(list(rows.values()))
