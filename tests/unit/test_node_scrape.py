"""A node of workers' Prometheus answer: every worker's registry merged into one exposition."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from shoal.metrics import Metrics, NamingFigures
from shoal.testing import metric_sum
from shoal.testing.procs import metric_values
from shoal.transport.http.node_scrape import merge_expositions


def _worker(connections: int, pushes: list[float], checks: int) -> bytes:
    metrics = Metrics()
    metrics.add_naming(lambda: NamingFigures(service_count=7, ip_count=20, connections=connections))
    for _ in range(checks):
        metrics.request("grpc", "ServerCheckRequest", 200, 0.001)
    for seconds in pushes:
        metrics.push_done("success", seconds)
    return metrics.render()


def _monitor(text: str, name: str) -> float:
    return sum(v for labels, v in metric_values(text, "nacos_monitor") if labels.get("name") == name)


def test_nacos_families_are_the_nodes_and_shoals_are_labelled_by_worker() -> None:
    text = merge_expositions([(1, _worker(4, [0.030], 2)), (0, _worker(2, [0.010, 0.020], 3))]).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # a valid exposition
    assert "shoal_worker_up" in families and "nacos_monitor" in families
    # summed: what each worker holds or did
    assert _monitor(text, "longConnection") == 6 and _monitor(text, "totalPush") == 3
    assert metric_sum(text, "grpc_server_requests_seconds_count", requestClass="ServerCheckRequest") == 5
    assert metric_sum(text, "grpc_server_requests_seconds_bucket", requestClass="ServerCheckRequest",
                      le="+Inf") == 5
    # the largest: what every worker holds alike; the average recomputed over every push
    assert _monitor(text, "serviceCount") == 7 and _monitor(text, "ipCount") == 20
    assert _monitor(text, "maxPushCost") == 30 and _monitor(text, "avgPushCost") == 20
    assert not any("worker" in labels for labels, _ in metric_values(text, "nacos_monitor"))
    # per worker, in worker order
    assert [labels["worker"] for labels, _ in metric_values(text, "shoal_push_total")] == ["0", "1"]
    assert {labels["worker"] for labels, _ in metric_values(text, "process_uptime_seconds")} == {"0", "1"}
    assert [(labels["worker"], v) for labels, v in metric_values(text, "shoal_worker_up")] == [("0", 1), ("1", 1)]


def test_a_worker_that_did_not_answer_is_reported_down() -> None:
    text = merge_expositions([(0, _worker(2, [], 1)), (1, None)]).decode()
    assert [(labels["worker"], v) for labels, v in metric_values(text, "shoal_worker_up")] == [("0", 1), ("1", 0)]
    assert _monitor(text, "longConnection") == 2
    assert {labels["worker"] for labels, _ in metric_values(text, "process_uptime_seconds")} == {"0"}
