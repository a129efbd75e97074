"""Nacos's Prometheus series, Shoal's cluster series and the Prometheus SD API on real nodes.

Every scrape is parsed with ``prometheus_client``'s own parser and checked against Nacos's names
(naming and core MetricsMonitor, the gRPC and HTTP request timers) and against what the registry
really holds, after real nacos-sdk-python clients and HTTP clients registered.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from v2.nacos import RegisterInstanceParam, SubscribeServiceParam

from shoal.config import TestHooks
from shoal.testing import (
    OPEN,
    SECURE,
    NodeCluster,
    ServerProcess,
    free_port_block,
    http_get,
    kill,
    start_server,
    wait_until,
)
from shoal.testing.http import call
from shoal.testing.openapi import register

from .test_cluster import FAST
from .test_sdk_naming import Pushes

SD = ["-D", "nacos.prometheus.metrics.enabled=true"]
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "shoal-nacos.json"

#: Every gauge of Nacos's naming MetricsMonitor (nacos_monitor{module="naming",name=...}).
NACOS_NAMING_NAMES = {
    "mysqlHealthCheck", "httpHealthCheck", "tcpHealthCheck", "serviceCount", "ipCount", "subscriberCount",
    "maxPushCost", "avgPushCost", "leaderStatus", "totalPush", "totalPushCountForAvg", "totalPushCostForAvg",
    "failedPush", "emptyPush", "serviceSubscribedEventQueueSize", "serviceChangedEventQueueSize",
    "pushPendingTaskCount",
}

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:nacos.*")


# --- reading a scrape ------------------------------------------------------------------------------
class Scrape:
    """One parsed /nacos/actuator/prometheus page."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]

    def values(self, metric: str, /, **labels: str) -> list[float]:
        return [s.value for s in self.samples
                if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, metric: str, /, **labels: str) -> float:
        found = self.values(metric, **labels)
        assert len(found) == 1, f"{metric}{labels}: {found}"
        return found[0]

    def total(self, metric: str, /, **labels: str) -> float:
        return sum(self.values(metric, **labels))

    def naming(self, name: str) -> float:
        return self.value("nacos_monitor", module="naming", name=name)


def scrape(server: ServerProcess) -> Scrape:
    return Scrape(server.prometheus())


def get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed body) of a GET; an error status keeps its body as text."""
    status, text = call("GET", url, headers=headers)
    return status, json.loads(text) if status == 200 else text


def http_register(server: ServerProcess, service: str, ip: str, port: int, metadata: dict[str, str] | None = None,
                  namespace: str = "") -> None:
    fields = {"metadata": json.dumps(metadata)} if metadata else {}
    if namespace:
        fields["namespaceId"] = namespace
    assert register(server, service, ip, port, **fields) == (200, "ok")


def operator_counts(server: ServerProcess) -> dict[str, Any]:
    status, body = get_json(server.url("/nacos/v1/ns/operator/metrics?onlyStatus=false"))
    assert status == 200, body
    return dict(body)


# --- PromQL names in the dashboard -----------------------------------------------------------------
_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                    "unless", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers that are no function, keyword, label
    (inside ``{}`` or a ``by (...)`` list), string or range."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in _PROMQL_KEYWORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number
        names.add(word)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", text)
        if inner:
            exprs.append(inner.group(1))
    return exprs


def test_promql_name_extraction() -> None:
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (le, uri) (rate(http_server_requests_seconds_bucket{uri!="a b"}[1m])))'
    ) == {"http_server_requests_seconds_bucket"}
    assert promql_metric_names('shoal_x{state!="UP"} == 1 and on (instance) up offset 5m') == {"shoal_x", "up"}
    assert promql_metric_names("rate(a_total[5m]) * 60 / max(b) + 1e3") == {"a_total", "b"}


# --- one node ----------------------------------------------------------------------------------------
async def test_nacos_series_match_the_registry(tmp_path: Path, sdk: Any) -> None:
    server = start_server(tmp_path, SD, auth=OPEN)
    try:
        provider, consumer = await sdk(server.addr), await sdk(server.addr)
        for i in range(4):
            assert await provider.register_instance(RegisterInstanceParam(
                service_name=f"svc-{i}", ip=f"10.9.0.{i}", port=8000 + i, metadata={"app.version": "1-a"}))
        http_register(server, "http-svc", "10.9.1.1", 9000, {"zone": "z1"})
        await consumer.subscribe(SubscribeServiceParam(service_name="svc-0", subscribe_callback=Pushes()))

        # The push after a first subscription is counted as Nacos counts pushes.
        expected = {"serviceCount": 5, "ipCount": 5, "subscriberCount": 1, "totalPush": 1}
        await wait_until(lambda: all(scrape(server).naming(k) == v for k, v in expected.items()),
                         what="nacos_monitor naming counts")
        page = scrape(server)
        counts = operator_counts(server)  # the registry's own figures
        assert page.naming("serviceCount") == counts["serviceCount"]
        assert page.naming("ipCount") == counts["instanceCount"]
        assert page.naming("subscriberCount") == counts["subscribeCount"]
        assert {s.labels["name"] for s in page.families["nacos_monitor"].samples
                if s.labels["module"] == "naming"} == NACOS_NAMING_NAMES | {"longConnection"}
        assert page.naming("totalPush") >= 1 and page.naming("failedPush") == 0
        assert page.naming("maxPushCost") >= page.naming("avgPushCost") >= 0
        # Long connections: the two SDK clients, all of module naming.
        assert page.value("nacos_monitor", module="core", name="longConnection") == 2
        assert page.value("nacos_monitor", module="naming", name="longConnection") == 2
        # Publishers/subscribers by client version: HTTP (v1) and gRPC (v2) clients.
        assert page.value("nacos_naming_publisher", version="v1") == 1
        assert page.value("nacos_naming_publisher", version="v2") == 4  # one client, four services
        assert page.value("nacos_naming_subscriber", version="v2") == 1

        # gRPC timer: Nacos's labels, one sample per InstanceRequest the SDK sent.
        grpc_labels = {"requestClass": "InstanceRequest", "success": "true", "errorCode": "0",
                       "throwableClass": "None", "module": "naming"}
        assert page.total("grpc_server_requests_seconds_count", **grpc_labels) == 4
        assert page.total("grpc_server_requests_seconds_bucket", le="+Inf", **grpc_labels) == 4
        assert page.total("grpc_server_requests_seconds_sum", **grpc_labels) > 0
        assert page.values("grpc_server_requests_seconds_max", **grpc_labels)
        assert page.total("grpc_server_requests_seconds_count", requestClass="ServerCheckRequest",
                          module="internal") >= 2
        assert page.families["grpc_server_requests_seconds"].type == "histogram"
        # HTTP timer: Spring Boot's labels and the route template as uri.
        http_labels = {"method": "POST", "uri": "/nacos/v1/ns/instance", "status": "200", "outcome": "SUCCESS",
                       "exception": "None"}
        assert page.value("http_server_requests_seconds_count", **http_labels) == 1
        assert page.families["http_server_requests_seconds"].type == "histogram"
        assert get_json(server.url("/nacos/v1/ns/instance/list?serviceName=nope"))[0] == 200
        assert scrape(server).total("http_server_requests_seconds_count", uri="/nacos/v1/ns/instance/list",
                                    status="200") >= 1

        # Process and GC collectors; no *_created duplicates; no cluster series when standalone.
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                     "process_start_time_seconds", "process_uptime_seconds", "python_gc_collections_total",
                     "python_gc_objects_collected_total", "system_load_average_1m"):
            assert page.values(name), name
        assert not [s.name for s in page.samples if s.name.endswith("_created")]
        assert "_created" not in page.text
        assert not [s.name for s in page.samples if s.name.startswith(("shoal_cluster_", "shoal_distro_"))]
    finally:
        kill(server)


async def test_prometheus_sd_lists_instances_in_nacos_shape(tmp_path: Path, sdk: Any) -> None:
    server = start_server(tmp_path, SD, auth=OPEN)
    try:
        client = await sdk(server.addr)
        await client.register_instance(RegisterInstanceParam(
            service_name="api", ip="10.8.0.1", port=80, cluster_name="east", metadata={"k8s.pod-name": "p1"}))
        await client.register_instance(RegisterInstanceParam(service_name="db", ip="10.8.0.2", port=5432))
        http_register(server, "api", "10.8.0.3", 81, namespace="dev")

        status, everything = get_json(server.url("/nacos/prometheus"))
        assert status == 200
        assert sorted(everything, key=lambda g: g["targets"]) == [
            {"targets": ["10.8.0.1:80"], "labels": {"__meta_clusterName": "east", "k8s_pod_name": "p1"}},
            {"targets": ["10.8.0.2:5432"], "labels": {"__meta_clusterName": "DEFAULT"}},
            {"targets": ["10.8.0.3:81"], "labels": {"__meta_clusterName": "DEFAULT"}},
        ]
        status, public = get_json(server.url("/nacos/prometheus/namespaceId/public"))
        assert status == 200 and sorted(t for g in public for t in g["targets"]) == ["10.8.0.1:80", "10.8.0.2:5432"]
        status, dev = get_json(server.url("/nacos/prometheus/namespaceId/dev"))
        assert [g["targets"] for g in dev] == [["10.8.0.3:81"]]
        status, api = get_json(server.url("/nacos/prometheus/namespaceId/public/service/api"))
        assert [g["targets"] for g in api] == [["10.8.0.1:80"]]
        assert get_json(server.url("/nacos/prometheus/namespaceId/nowhere")) == (200, [])
        assert get_json(server.url("/nacos/prometheus/namespaceId/public/service/none")) == (200, [])
    finally:
        kill(server)


def test_prometheus_sd_is_off_by_default(tmp_path: Path) -> None:
    server = start_server(tmp_path, auth=OPEN)
    try:
        assert http_get(server.url("/nacos/prometheus"))[0] == 404
    finally:
        kill(server)


@pytest.fixture
def auth_node(tmp_path: Path) -> Iterator[ServerProcess]:
    port = free_port_block()
    data_dir = tmp_path / f"node-{port}"
    data_dir.mkdir(parents=True)
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pass\n")
    done = subprocess.run([sys.executable, "-m", "shoal", "users", "create", "prom", "--password-file", str(secret),
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    server = start_server(tmp_path, ["--auth", *SD], port=port, auth=SECURE)
    yield server
    kill(server)


def test_prometheus_sd_wants_basic_auth_when_auth_is_on(auth_node: ServerProcess) -> None:
    def basic(user: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    for path in ("/nacos/prometheus", "/nacos/prometheus/namespaceId/public",
                 "/nacos/prometheus/namespaceId/public/service/x"):
        url = auth_node.url(path)
        assert get_json(url)[0] == 403
        assert get_json(url, basic("prom", "wrong"))[0] == 403
        assert get_json(url, {"Authorization": "Basic !!!"})[0] == 403
        assert get_json(url, basic("prom", "s3cret-pass")) == (200, [])  # any user, no permission needed
    # The metrics endpoint itself stays open, as Nacos's actuator.
    assert http_get(auth_node.url("/nacos/actuator/prometheus"))[0] == 200


# --- three nodes -------------------------------------------------------------------------------------
def start_three(tmp_path: Path, hooks: dict[int, TestHooks] | None = None) -> list[ServerProcess]:
    cluster = NodeCluster(tmp_path, 3, [*FAST, *SD], auth=OPEN)
    try:
        cluster.start_all(envs={i: h.to_env() for i, h in (hooks or {}).items()}, timeout=40)
    except BaseException:
        cluster.kill_all()
        raise
    return cluster.all()


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    nodes = start_three(tmp_path)
    yield nodes
    for node in nodes:
        kill(node)


def member_states(page: Scrape) -> dict[str, str]:
    return {s.labels["member"]: s.labels["state"] for s in page.families["shoal_cluster_member_state"].samples
            if s.value == 1}


async def test_cluster_series_on_three_nodes(three_nodes: list[ServerProcess], sdk: Any) -> None:
    a, b, c = three_nodes
    addresses = {n.addr for n in three_nodes}
    for node in three_nodes:
        await wait_until(lambda n=node: member_states(scrape(n)) == dict.fromkeys(addresses, "UP"),
                         timeout=30, what=f"every member UP seen from {node.port}")
    client = await sdk(a.addr)
    for i in range(3):
        await client.register_instance(RegisterInstanceParam(service_name=f"c-svc-{i}", ip=f"10.7.0.{i}",
                                                             port=7000 + i))
    http_register(b, "c-http", "10.7.1.1", 7100)

    # Every node counts the whole registry (its own and replicated clients), as the SD API lists it.
    for node in three_nodes:
        await wait_until(lambda n=node: scrape(n).naming("ipCount") == 4, timeout=20,
                         what=f"ipCount 4 on {node.port}")
        page = scrape(node)
        assert page.naming("serviceCount") == 4 == operator_counts(node)["serviceCount"]
        status, targets = get_json(node.url("/nacos/prometheus"))
        assert status == 200 and len(targets) == 4
        assert page.value("shoal_cluster_members", state="UP") == 3
        assert page.value("shoal_distro_loaded") == 1
    # The owner synced to both peers; verify rounds run; queues drain.
    await wait_until(lambda: all(scrape(a).value("shoal_distro_sync_batches_total", peer=p.addr, result="success") >= 1
                                 for p in (b, c)), timeout=20, what="sync batches from a")
    await wait_until(lambda: scrape(a).value("shoal_distro_verify_rounds_total") >= 1, timeout=20, what="verify")
    await wait_until(lambda: scrape(a).total("shoal_distro_sync_queue_depth") == 0, what="empty queues")
    page = scrape(a)
    for peer in (b, c):  # what a sent, its peers received and applied (a's three clients: one connection)
        assert page.value("shoal_distro_sync_records_total", peer=peer.addr) >= 1
        received = scrape(peer)
        assert received.value("shoal_distro_sync_received_batches_total", peer=a.addr) >= 1
        assert received.value("shoal_distro_sync_applied_records_total", peer=a.addr) >= 1
        assert (received.value("shoal_distro_sync_received_records_total", peer=a.addr)
                >= received.value("shoal_distro_sync_applied_records_total", peer=a.addr))
    assert page.value("shoal_distro_verify_requests_total") >= 1
    assert page.values("shoal_distro_verify_repairs_total") == [page.value("shoal_distro_verify_repairs_total")]
    assert scrape(b).total("grpc_server_requests_seconds_count", module="cluster", success="true") >= 1

    # A dead peer: its member state leaves UP everywhere, and syncs to it fail and queue up.
    kill(c)
    await wait_until(lambda: member_states(scrape(a)).get(c.addr) in ("SUSPICIOUS", "DOWN"), timeout=30,
                     what="c not UP seen from a")
    await client.register_instance(RegisterInstanceParam(service_name="c-svc", ip="10.7.0.9", port=7009))
    await wait_until(lambda: scrape(a).value("shoal_distro_sync_batches_total", peer=c.addr, result="failed") >= 1
                     or member_states(scrape(a)).get(c.addr) == "DOWN", timeout=30, what="sync to c failing")
    page = scrape(a)
    assert page.value("shoal_cluster_members", state="UP") == 2
    assert not [s.name for s in page.samples if s.name.endswith("_created")]


async def test_verify_repairs_are_counted(tmp_path: Path, sdk: Any) -> None:
    nodes = start_three(tmp_path, hooks={1: TestHooks(drop_incoming_sync=1)})  # b loses one sync batch
    try:
        a, b, _c = nodes
        client = await sdk(a.addr)
        await client.register_instance(RegisterInstanceParam(service_name="lost", ip="10.5.0.1", port=1))
        # a's sync reached b and was dropped; a's next verify round finds b lacking and re-syncs.
        await wait_until(lambda: scrape(a).value("shoal_distro_verify_repairs_total") >= 1, timeout=30,
                         what="a verify repair")
        await wait_until(lambda: scrape(b).naming("ipCount") == 1, timeout=20, what="b repaired")
        page = scrape(a)
        assert page.value("shoal_distro_sync_batches_total", peer=b.addr, result="success") >= 2
        assert page.value("shoal_distro_verify_requests_total") >= page.value("shoal_distro_verify_rounds_total")
    finally:
        for node in nodes:
            kill(node)


async def test_dashboard_uses_only_series_a_node_exports(three_nodes: list[ServerProcess], sdk: Any) -> None:
    a = three_nodes[0]
    client = await sdk(a.addr)
    await client.register_instance(RegisterInstanceParam(service_name="dash", ip="10.6.0.1", port=1))
    await client.subscribe(SubscribeServiceParam(service_name="dash", subscribe_callback=Pushes()))
    http_register(a, "dash-http", "10.6.0.2", 2)
    await (await sdk(a.addr)).shutdown()  # a closed connection (its counter has no series before)
    await wait_until(lambda: scrape(a).values("shoal_connections_closed_total"), what="a closed connection")
    await wait_until(lambda: scrape(a).values("shoal_distro_verify_mismatched"), timeout=20, what="a verify round")
    await wait_until(lambda: scrape(a).values("shoal_push_latency_seconds_bucket"), what="a push latency")
    page = scrape(a)
    exported = {s.name for s in page.samples}
    exprs = dashboard_exprs()
    assert len(exprs) > 30
    used = set().union(*(promql_metric_names(e) for e in exprs))
    assert "nacos_monitor" in used and "grpc_server_requests_seconds_bucket" in used
    assert used - exported == set(), f"dashboard series no node exports: {sorted(used - exported)}"
