"""The console charts' ring buffer (shoal.metrics_history): bounded, rates from counter deltas,
push p99 from the ack histogram's bucket deltas, per-peer sync figures, the chunked count; fed
by a real :class:`Metrics` and a manual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shoal.clock import ManualClock
from shoal.config import MAX_CHART_SAMPLES, Config
from shoal.errors import ConfigError
from shoal.metrics import PUSH_BUCKETS, Metrics
from shoal.metrics_history import ChartHistory, ChartSources, PeerSync, count_in_chunks, quantile_from_buckets


class Status:
    def is_serving(self) -> bool:
        return True

    def readiness_problem(self) -> str | None:
        return None


class Figures:
    """The node-side figures a sample reads, set by the test."""

    def __init__(self) -> None:
        self.connections = 0
        self.instances = 0
        self.peers: list[PeerSync] = []
        self.disagreements: int | None = None

    async def instance_count(self) -> int:
        return self.instances


def history(metrics: Metrics, clock: ManualClock, figures: Figures, interval_ms: int = 1000,
            window_ms: int = 5000) -> ChartHistory:
    sources = ChartSources(requests=metrics.requests_by_transport, push_buckets=metrics.push_ack_buckets,
                           push_bounds=PUSH_BUCKETS, connections=lambda: figures.connections,
                           instances=figures.instance_count, peers=lambda: list(figures.peers),
                           disagreements=lambda: figures.disagreements)
    return ChartHistory(sources, clock, interval_ms, window_ms)


async def test_requests_per_second_by_kind_from_counter_deltas() -> None:
    metrics, clock, figures = Metrics(), ManualClock(), Figures()
    for _ in range(7):
        metrics.request("grpc", "InstanceRequest", 200)
    charts = history(metrics, clock, figures)  # takes the counters: the 7 are before its first interval
    for _ in range(20):
        metrics.request("grpc", "QueryRequest", 200)
    for _ in range(4):
        metrics.request("http", "/nacos/v1/ns/instance", 404, 0.002, "POST")
    figures.connections, figures.instances = 3, 11
    clock.advance(2000)
    sample = await charts.sample()
    # the 7 requests before the history was made are not in the rate; the interval's measured length is
    assert sample.requests_per_s == {"grpc": 10.0, "http": 2.0}
    assert (sample.connections, sample.instances, sample.pushes, sample.push_p99_ms) == (3, 11, 0, None)
    clock.advance(1000)
    quiet = await charts.sample()
    assert quiet.requests_per_s == {"grpc": 0.0, "http": 0.0}
    out = charts.to_json()
    assert [s["requests"] for s in out["samples"]] == [{"grpc": 10.0, "http": 2.0}, {"grpc": 0.0, "http": 0.0}]
    assert out["samples"][0]["time"] == clock.now_ms() - 1000
    assert (out["intervalMs"], out["windowMs"], out["capacity"]) == (1000, 5000, 5)


async def test_the_buffer_keeps_only_the_window() -> None:
    metrics, clock, figures = Metrics(), ManualClock(), Figures()
    charts = history(metrics, clock, figures, interval_ms=1000, window_ms=5000)
    for n in range(12):
        figures.instances = n
        clock.advance(1000)
        await charts.sample()
    assert charts.capacity == 5
    assert [s.instances for s in charts.samples] == [7, 8, 9, 10, 11]


async def test_push_p99_is_of_the_interval_alone() -> None:
    metrics, clock, figures = Metrics(), ManualClock(), Figures()
    charts = history(metrics, clock, figures)
    for _ in range(50):  # a slow interval: every ack in (0.5, 1] s
        metrics.push_acked("public", "grpc", 0.8)
    clock.advance(1000)
    slow = await charts.sample()
    assert slow.pushes == 50
    assert slow.push_p99_ms == pytest.approx(500 + 500 * 0.99)  # linear within the (0.5, 1] bucket
    for n in range(100):  # then a fast one, in two namespaces: the slow acks are not in its p99
        metrics.push_acked("public" if n % 2 else "dev", "grpc", 0.0015)
    clock.advance(1000)
    fast = await charts.sample()
    assert fast.pushes == 100
    assert fast.push_p99_ms == pytest.approx(1 + 1.5 * 0.99)  # within (1, 2.5] ms
    clock.advance(1000)
    idle = await charts.sample()
    assert (idle.pushes, idle.push_p99_ms) == (0, None)


def test_quantile_from_buckets() -> None:
    bounds = (0.01, 0.1, 1.0)
    assert quantile_from_buckets(0.99, bounds, [0, 0, 0, 0]) is None
    assert quantile_from_buckets(0.5, bounds, [10, 10, 10, 10]) == pytest.approx(0.005)
    assert quantile_from_buckets(0.99, bounds, [98, 99, 100, 100]) == pytest.approx(0.1)  # rank 99: top of (0.01, 0.1]
    assert quantile_from_buckets(0.99, bounds, [90, 100, 100, 100]) == pytest.approx(0.01 + 0.09 * 0.9)
    assert quantile_from_buckets(0.99, bounds, [0, 0, 0, 5]) == 1.0  # all above the last bound: the last bound


async def test_sync_per_member_and_disagreements() -> None:
    metrics, clock, figures = Metrics(), ManualClock(), Figures()
    figures.peers = [PeerSync("10.0.0.2:8848", 0, 4)]
    charts = history(metrics, clock, figures)
    figures.peers = [PeerSync("10.0.0.2:8848", 120, 7), PeerSync("10.0.0.3:8848", 5, 2)]
    figures.disagreements = 2
    clock.advance(1000)
    sample = await charts.sample()
    # failures counted in the interval; a member first seen now starts from its current count
    assert sample.to_json()["sync"] == {"10.0.0.2:8848": {"pending": 120, "failed": 3},
                                        "10.0.0.3:8848": {"pending": 5, "failed": 0}}
    assert sample.disagreements == 2


async def test_count_in_chunks() -> None:
    assert await count_in_chunks(range(12_345), lambda n: n % 3, chunk=1000) == sum(n % 3 for n in range(12_345))
    assert await count_in_chunks([], len) == 0


@pytest.mark.parametrize(("interval", "window"), [(5000, 1000), (100, 100 * (MAX_CHART_SAMPLES + 1))])
def test_a_window_that_holds_no_sample_or_too_many_is_refused(interval: int, window: int) -> None:
    with pytest.raises(ConfigError, match=r"shoal\.console\.chart\.window-ms"):
        Config(console_chart_interval_ms=interval, console_chart_window_ms=window).validate()


def test_the_default_window_is_fifteen_minutes_of_five_second_samples() -> None:
    config = Config().validate()
    assert config.console_chart_window_ms // config.console_chart_interval_ms == 180


async def test_the_route_serves_the_series(tmp_path: Path) -> None:
    from shoal.transport.http.console_charts import ChartRoutes
    from shoal.transport.http.server import HttpServer

    metrics, clock, figures = Metrics(), ManualClock(), Figures()
    charts = history(metrics, clock, figures)
    metrics.request("grpc", "QueryRequest", 200)
    metrics.push_acked("public", "grpc", 0.004)
    figures.instances = 2
    clock.advance(1000)
    await charts.sample()
    server = HttpServer(Config(data_dir=str(tmp_path), auth_enabled=False, auth_admin_enabled=False,
                               auth_console_enabled=False), Status(), metrics)
    server.install(ChartRoutes(charts).routes())
    client = TestClient(TestServer(server.app))
    await client.start_server()
    try:
        resp = await client.get("/nacos/v1/console/cluster/charts")
        assert resp.status == 200
        body = json.loads(await resp.text())
    finally:
        await client.close()
    [sample] = body["samples"]
    assert (sample["requests"], sample["pushes"], sample["instances"], sample["sync"]) == ({"grpc": 1.0}, 1, 2, {})
    assert 2.5 < sample["pushP99Ms"] <= 5.0  # in the (2.5, 5] ms bucket
    assert body["capacity"] == 5


def test_push_ack_buckets_match_the_histogram() -> None:
    """The plain bucket counts the charts read are the scrape's ``shoal_push_ack_seconds``, summed
    over namespaces and transports (bounds included in their bucket, as Prometheus's ``le``)."""
    metrics = Metrics()
    for n, seconds in enumerate((0.0005, 0.001, 0.004, 0.02, 0.3, 2.5, 7.0, 42.0) * 3):
        metrics.push_acked(f"ns{n % 4}", "grpc" if n % 2 else "http", seconds)
    scraped = [0.0] * (len(PUSH_BUCKETS) + 1)
    bounds = [repr(float(b)) for b in PUSH_BUCKETS] + ["+Inf"]
    for family in metrics.push_ack.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                scraped[bounds.index(sample.labels["le"])] += sample.value
    assert metrics.push_ack_buckets() == scraped
    assert scraped[-1] == 24
