"""Prometheus metrics of one node (served at /nacos/actuator/prometheus).

Counters and histograms are updated on the hot paths; sizes (connections, clients, services,
instances) are read from the model at scrape time by a collector, so they cost nothing between
scrapes. One registry per node, so tests can run several nodes in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

PUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _SizeCollector:
    def __init__(self, sizes: Callable[[], dict[str, float]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[Any]:
        for name, value in self._sizes().items():
            family = GaugeMetricFamily(f"shoal_{name}", f"Current number of {name.replace('_', ' ')}")
            family.add_metric([], value)
            yield family


class Metrics:
    """The node's metric families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "shoal_requests", "Requests handled, by transport, request type and Nacos code",
            ["transport", "type", "code"], registry=self.registry,
        )
        self.pushes = Counter("shoal_push", "Pushes to subscribers by result", ["result"], registry=self.registry)
        self.push_latency = Histogram(
            "shoal_push_latency_seconds", "Time from a service change to the subscriber's ack",
            buckets=PUSH_BUCKETS, registry=self.registry,
        )
        self.connections_closed = Counter(
            "shoal_connections_closed", "Connections unregistered, by reason", ["reason"], registry=self.registry,
        )
        self.health_checks = Counter(
            "shoal_health_checks", "Server-side checks of persistent instances run by this node, by type",
            ["type"], registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], Any] = {}

    def add_sizes(self, sizes: Callable[[], dict[str, float]]) -> None:
        self.registry.register(_SizeCollector(sizes))

    def request(self, transport: str, type_name: str, code: int) -> None:
        key = (transport, type_name, code)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(transport, type_name, str(code))
        child.inc()

    def push_done(self, result: str, latency_s: float | None) -> None:
        self.pushes.labels(result).inc()
        if latency_s is not None:
            self.push_latency.observe(latency_s)

    def health_checked(self, kind: str) -> None:
        self.health_checks.labels(kind).inc()

    def connection_closed(self, reason: str) -> None:
        self.connections_closed.labels(reason.split(":", 1)[0]).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
