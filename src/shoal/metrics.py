"""Prometheus metrics of one node (served at /nacos/actuator/prometheus).

Counters and histograms are updated on the hot paths; sizes (connections, clients, services,
instances) are read from the model at scrape time by a collector, so they cost nothing between
scrapes. One registry per node, so tests can run several nodes in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _SizeCollector:
    def __init__(self, sizes: Callable[[], dict[str, float]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[Any]:
        for name, value in self._sizes().items():
            family = GaugeMetricFamily(f"shoal_{name}", f"Current number of {name.replace('_', ' ')}")
            family.add_metric([], value)
            yield family


class _RequestCounter:
    """``shoal_requests_total`` by (transport, type, code), kept as plain ints.

    Counted once per request on the hot path: a dict increment instead of a labelled
    prometheus Counter child (whose ``inc`` takes a lock), turned into a counter family at scrape
    time. One event loop writes it (architecture.md §4 rule 1)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int], int] = {}

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily("shoal_requests", "Requests handled, by transport, request type and Nacos code",
                                     labels=["transport", "type", "code"])
        for (transport, type_name, code), value in list(self.counts.items()):
            family.add_metric([transport, type_name, str(code)], value)
        yield family


class Metrics:
    """The node's metric families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = _RequestCounter()
        self.registry.register(self._requests)
        self.pushes = Counter("shoal_push", "Pushes to subscribers by result", ["result"], registry=self.registry)
        self.push_latency = Histogram(
            "shoal_push_latency_seconds", "Time from a service change to the subscriber's ack",
            buckets=PUSH_BUCKETS, registry=self.registry,
        )
        self.connections_closed = Counter(
            "shoal_connections_closed", "Connections unregistered, by reason", ["reason"], registry=self.registry,
        )

    def add_sizes(self, sizes: Callable[[], dict[str, float]]) -> None:
        self.registry.register(_SizeCollector(sizes))

    def request(self, transport: str, type_name: str, code: int) -> None:
        counts = self._requests.counts
        key = (transport, type_name, code)
        counts[key] = counts.get(key, 0) + 1

    def request_count(self, transport: str, type_name: str, code: int) -> int:
        """How many requests of this kind were counted (what the scrape shows)."""
        return self._requests.counts.get((transport, type_name, code), 0)

    def push_done(self, result: str, latency_s: float | None) -> None:
        self.pushes.labels(result).inc()
        if latency_s is not None:
            self.push_latency.observe(latency_s)

    def connection_closed(self, reason: str) -> None:
        self.connections_closed.labels(reason.split(":", 1)[0]).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
