"""The metric families of one node's registry, read back through prometheus_client's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from shoal.metrics import (
    MAX_REQUEST_SERIES,
    MAX_WINDOW_S,
    OVERFLOW_TYPE,
    REQUEST_BUCKETS,
    ClusterFigures,
    Metrics,
    NamingFigures,
    PeerSyncFigures,
    ReceivedSyncFigures,
)


def samples(metrics: Metrics) -> list[tuple[str, dict[str, str], float]]:
    text = metrics.render().decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(metrics: Metrics, metric: str, /, **labels: str) -> float:
    found = [v for n, have, v in samples(metrics) if n == metric and all(have.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (metric, labels, found)
    return found[0]


def test_a_timed_grpc_request_lands_in_its_bucket_with_nacos_labels() -> None:
    m = Metrics()
    m.request("grpc", "InstanceRequest", 200, REQUEST_BUCKETS[1])  # exactly on a bound: that bucket
    m.request("grpc", "InstanceRequest", 200, 99.0)  # beyond the last bound: only +Inf
    m.request("grpc", "InstanceRequest", 400, 0.0001)
    ok = {"requestClass": "InstanceRequest", "success": "true", "errorCode": "0", "throwableClass": "None",
          "module": "naming"}
    assert value(m, "grpc_server_requests_seconds_bucket", le=str(REQUEST_BUCKETS[0]), **ok) == 0
    assert value(m, "grpc_server_requests_seconds_bucket", le=str(REQUEST_BUCKETS[1]), **ok) == 1
    assert value(m, "grpc_server_requests_seconds_bucket", le=str(REQUEST_BUCKETS[-1]), **ok) == 1
    assert value(m, "grpc_server_requests_seconds_bucket", le="+Inf", **ok) == 2
    assert value(m, "grpc_server_requests_seconds_count", **ok) == 2
    assert value(m, "grpc_server_requests_seconds_sum", **ok) == REQUEST_BUCKETS[1] + 99.0
    assert value(m, "grpc_server_requests_seconds_max", **ok) == 99.0
    assert value(m, "grpc_server_requests_seconds_count", success="false", errorCode="400") == 1
    assert value(m, "shoal_requests_total", transport="grpc", type="InstanceRequest", code="200") == 2


def test_modules_of_grpc_requests_follow_nacos() -> None:
    m = Metrics()
    m.request("grpc", "ServerCheckRequest", 200, 0.001)
    m.request("grpc", "unknown", 501, 0.001)
    m.request("cluster", "DistroDataRequest", 200, 0.001)
    assert value(m, "grpc_server_requests_seconds_count", requestClass="ServerCheckRequest", module="internal") == 1
    assert value(m, "grpc_server_requests_seconds_count", requestClass="unknown", module="unknown") == 1
    assert value(m, "grpc_server_requests_seconds_count", requestClass="DistroDataRequest", module="cluster") == 1


def test_http_requests_carry_spring_labels() -> None:
    m = Metrics()
    m.request("http", "/nacos/v1/ns/instance", 200, 0.002, "POST")
    m.request("http", "/nacos/v1/ns/instance", 400, 0.002, "POST")
    m.request("http", "/nacos/v1/ns/instance", 500, 0.002, "DELETE")
    base = {"uri": "/nacos/v1/ns/instance", "exception": "None"}
    assert value(m, "http_server_requests_seconds_count", method="POST", status="200", outcome="SUCCESS", **base) == 1
    assert value(m, "http_server_requests_seconds_count", method="POST", status="400", outcome="CLIENT_ERROR",
                 **base) == 1
    assert value(m, "http_server_requests_seconds_count", method="DELETE", status="500", outcome="SERVER_ERROR",
                 **base) == 1


def test_an_untimed_request_is_counted_but_not_in_the_histogram() -> None:
    m = Metrics()
    m.request("grpc", "InstanceRequest", 200)
    assert value(m, "shoal_requests_total", transport="grpc", type="InstanceRequest", code="200") == 1
    assert m.request_count("grpc", "InstanceRequest", 200) == 1
    assert not [n for n, _, _ in samples(m) if n.startswith("grpc_server_requests_seconds")]


def test_the_max_follows_a_sliding_window() -> None:
    m = Metrics()
    m.request("grpc", "InstanceRequest", 200, 0.5)
    m._requests.window_start -= MAX_WINDOW_S  # one window later: still the previous window's max
    assert value(m, "grpc_server_requests_seconds_max", requestClass="InstanceRequest") == 0.5
    m.request("grpc", "InstanceRequest", 200, 0.1)
    m._requests.window_start -= MAX_WINDOW_S  # two windows later: only the newer request
    assert value(m, "grpc_server_requests_seconds_max", requestClass="InstanceRequest") == 0.1
    m._requests.window_start -= 2 * MAX_WINDOW_S  # idle for two windows: nothing
    assert value(m, "grpc_server_requests_seconds_max", requestClass="InstanceRequest") == 0.0
    assert value(m, "grpc_server_requests_seconds_count", requestClass="InstanceRequest") == 2


def test_push_outcomes_in_nacos_terms() -> None:
    m = Metrics()
    m.add_naming(NamingFigures)
    assert value(m, "nacos_monitor", module="naming", name="maxPushCost") == -1
    assert value(m, "nacos_monitor", module="naming", name="avgPushCost") == -1
    m.push_done("success", 0.010)
    m.push_done("success", 0.030)
    m.push_done("timeout", None)
    m.push_done("skipped", None)  # unsubscribed meanwhile: no push went out
    assert value(m, "nacos_monitor", module="naming", name="totalPush") == 3
    assert value(m, "nacos_monitor", module="naming", name="failedPush") == 1
    assert value(m, "nacos_monitor", module="naming", name="maxPushCost") == 30
    assert value(m, "nacos_monitor", module="naming", name="avgPushCost") == 20
    assert value(m, "nacos_monitor", module="naming", name="totalPushCountForAvg") == 2


def test_naming_figures_become_nacos_gauges() -> None:
    m = Metrics()
    m.add_naming(lambda: NamingFigures(service_count=3, ip_count=7, subscriber_count=2, push_pending=1,
                                       connections=4, connections_by_module={"naming": 3, "config": 1},
                                       publishers_by_version={"v1": 1, "v2": 6}, subscribers_by_version={"v2": 2}))
    assert value(m, "nacos_monitor", module="naming", name="serviceCount") == 3
    assert value(m, "nacos_monitor", module="naming", name="ipCount") == 7
    assert value(m, "nacos_monitor", module="naming", name="subscriberCount") == 2
    assert value(m, "nacos_monitor", module="naming", name="pushPendingTaskCount") == 1
    assert value(m, "nacos_monitor", module="core", name="longConnection") == 4
    assert value(m, "nacos_monitor", module="naming", name="longConnection") == 3
    assert value(m, "nacos_monitor", module="config", name="longConnection") == 1
    assert value(m, "nacos_naming_publisher", version="v1") == 1
    assert value(m, "nacos_naming_subscriber", version="v1") == 0


def test_cluster_figures_and_standalone() -> None:
    standalone = Metrics()
    standalone.add_cluster(lambda: None)
    assert not [n for n, _, _ in samples(standalone) if n.startswith(("shoal_cluster", "shoal_distro"))]

    m = Metrics()
    m.add_cluster(lambda: ClusterFigures(
        self_address="a:1", members=[("a:1", "UP"), ("b:1", "DOWN")],
        peers=[PeerSyncFigures("b:1", pending=5, sent_batches=2, failed_batches=3, needs_full_verify=True,
                               sent_records=40)],
        loaded=True, verify_rounds=4, verify_requests=6, verify_bytes=100, verify_repairs=1,
        verify_mismatched={"b:1": 2}, received=[ReceivedSyncFigures("b:1", batches=3, records=90, applied=80)],
        write_waits={"acked": 7, "timeout": 1}))
    assert value(m, "shoal_cluster_member_state", member="b:1", state="DOWN") == 1
    assert value(m, "shoal_cluster_member_state", member="b:1", state="UP") == 0
    assert value(m, "shoal_cluster_members", state="UP") == 1
    assert value(m, "shoal_distro_sync_queue_depth", peer="b:1") == 5
    assert value(m, "shoal_distro_sync_batches_total", peer="b:1", result="failed") == 3
    assert value(m, "shoal_distro_sync_needs_full_verify", peer="b:1") == 1
    assert value(m, "shoal_distro_sync_records_total", peer="b:1") == 40
    assert value(m, "shoal_distro_sync_received_batches_total", peer="b:1") == 3
    assert value(m, "shoal_distro_sync_received_records_total", peer="b:1") == 90
    assert value(m, "shoal_distro_sync_applied_records_total", peer="b:1") == 80
    assert value(m, "shoal_distro_verify_rounds_total") == 4
    assert value(m, "shoal_distro_verify_repairs_total") == 1
    assert value(m, "shoal_distro_verify_mismatched", peer="b:1") == 2
    assert value(m, "shoal_workers_write_waits_total", outcome="acked") == 7
    assert value(m, "shoal_workers_write_waits_total", outcome="timeout") == 1


def test_no_created_series_but_process_and_gc() -> None:
    m = Metrics()
    m.push_done("success", 0.01)
    m.connection_closed("client closed")
    names = {n for n, _, _ in samples(m)}
    assert not [n for n in names if n.endswith("_created")]
    assert b"_created" not in m.render()
    assert {"process_cpu_seconds_total", "python_gc_collections_total", "process_uptime_seconds"} <= names


def test_request_series_are_bounded() -> None:
    m = Metrics()
    for i in range(MAX_REQUEST_SERIES + 50):
        m.request("cluster", f"Garbage{i}Request", 403, 0.001)
    m.request("cluster", "Garbage0Request", 403, 0.001)  # an existing series still counts as itself
    assert m.request_count("cluster", "Garbage0Request", 403) == 2
    assert m.request_count("cluster", OVERFLOW_TYPE, 403) == 50
    assert m.request_count("cluster", f"Garbage{MAX_REQUEST_SERIES + 1}Request", 403) == 0


def test_every_client_kind_has_a_nacos_version() -> None:
    """A scrape walks every client: a kind without a version would fail the whole scrape (it did,
    for persistent clients, until this mapping covered them)."""
    from shoal.model.client import ClientKind
    from shoal.node_metrics import VERSION_OF_KIND

    assert set(VERSION_OF_KIND) == set(ClientKind)
