"""Prometheus metrics of one node (served at /nacos/actuator/prometheus).

Three kinds of series share one registry per node (so tests can run several nodes in one
process):

* Nacos's own names, so Nacos dashboards work unchanged: ``nacos_monitor{module="naming"}``
  (naming MetricsMonitor), ``nacos_monitor{module="core"|<module>,name="longConnection"}`` (core
  MetricsMonitor), ``nacos_naming_subscriber`` / ``nacos_naming_publisher`` by version, and the
  Micrometer timers ``grpc_server_requests_seconds`` and ``http_server_requests_seconds`` (here
  histograms, plus Micrometer's ``_max`` gauge).
* Shoal's own ``shoal_*`` series: request counts, pushes, closed connections, model sizes, and
  the cluster (member states, Distro sync queues and failures, verify rounds and repairs).
* The process and Python GC collectors of ``prometheus_client``.

The request path costs one dict lookup and a few additions per request (:meth:`Metrics.request`);
everything else is read from the components at scrape time by collectors, so it costs nothing
between scrapes. ``*_created`` series are not exported (Nacos's Micrometer has none, and they
double the series count): the same effect as ``PROMETHEUS_DISABLE_CREATED_SERIES``.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

# No ``*_created`` samples, for every registry of this process (the library's switch is global).
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

PUSH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Distinct namespaces ``shoal_push_ack_seconds`` labels (the series stay bounded), and the label of the rest.
MAX_PUSH_NAMESPACES = 100
OVERFLOW_NAMESPACE = "other"

#: Upper bounds (seconds) of the request-duration histograms; +Inf is implied.
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Micrometer keeps a timer's ``_max`` over a sliding window (two minutes by default, rotated
#: every step); here the larger of the current and the previous window of this length.
MAX_WINDOW_S = 60.0

#: At most this many (transport, type, code, method) request series; later new ones are counted
#: under the type ``OVERFLOW_TYPE``.
MAX_REQUEST_SERIES = 2000
OVERFLOW_TYPE = "other"

#: Nacos's gRPC request types whose ``Request.getModule()`` is ``internal``.
INTERNAL_REQUEST_TYPES = frozenset({
    "ServerCheckRequest", "HealthCheckRequest", "ConnectionSetupRequest", "ServerLoaderInfoRequest",
    "ServerReloadRequest", "ClientDetectionRequest", "ConnectResetRequest", "PushAckRequest", "SetupAckRequest",
})

#: The naming MetricsMonitor's gauges in Nacos's declaration order (``nacos_monitor{module="naming"}``).
NAMING_MONITOR_NAMES = (
    "mysqlHealthCheck", "httpHealthCheck", "tcpHealthCheck", "serviceCount", "ipCount", "subscriberCount",
    "maxPushCost", "avgPushCost", "leaderStatus", "totalPush", "totalPushCountForAvg", "totalPushCostForAvg",
    "failedPush", "emptyPush", "serviceSubscribedEventQueueSize", "serviceChangedEventQueueSize",
    "pushPendingTaskCount",
)

#: A Distro member's states (Nacos NodeState), exported one series each.
MEMBER_STATES = ("STARTING", "UP", "SUSPICIOUS", "DOWN", "ISOLATION")


# --- figures the components hand over at scrape time ---------------------------------------------
@dataclass
class NamingFigures:
    """The model's counts at scrape time (what Nacos's naming and core MetricsMonitor gauge)."""

    service_count: int = 0
    ip_count: int = 0
    subscriber_count: int = 0
    push_pending: int = 0
    connections: int = 0
    connections_by_module: dict[str, int] = field(default_factory=dict)
    #: Published and subscribed services by Nacos's client "version": ``v1`` (ip:port clients of
    #: the HTTP API) and ``v2`` (gRPC connection clients), as NamingSubAndPubMetricsCollector.
    publishers_by_version: dict[str, int] = field(default_factory=dict)
    subscribers_by_version: dict[str, int] = field(default_factory=dict)


@dataclass
class PeerSyncFigures:
    """One peer's Distro send queue (``distro.sync.PeerQueue``)."""

    peer: str
    pending: int
    sent_batches: int
    failed_batches: int
    needs_full_verify: bool
    sent_records: int = 0


@dataclass
class ReceivedSyncFigures:
    """What one peer's sync batches brought to this node (``distro.sync.SyncReceiver.received``)."""

    peer: str
    batches: int
    records: int
    applied: int


@dataclass
class ClusterFigures:
    """This node's view of the cluster: members, sync queues, verify counters."""

    self_address: str
    members: list[tuple[str, str]]  # (address, state)
    peers: list[PeerSyncFigures]
    loaded: bool
    verify_rounds: int
    verify_requests: int
    verify_bytes: int
    verify_repairs: int
    verify_mismatched: dict[str, int]  # peer → differences found in the last round
    received: list[ReceivedSyncFigures] = field(default_factory=list)
    #: a worker's writes that waited for its sibling workers, by outcome (distro/barrier.py); {} otherwise
    write_waits: dict[str, int] = field(default_factory=dict)


# --- request timers ------------------------------------------------------------------------------
class _RequestStats:
    """Counts and durations of handled requests, kept as plain numbers.

    One entry per (transport, type or route, code, method): ``[count, timed count, sum of seconds,
    max of this window, max of the previous window, bucket counts...]`` with the bucket counts
    not cumulative (one increment per request). Turned into metric families at scrape time. One
    event loop writes it (architecture.md §4 rule 1), so no lock is needed.
    """

    __slots__ = ("entries", "window_start")

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, int, str], list[float]] = {}
        self.window_start = time.monotonic()

    def rotate_max(self) -> None:
        """Start a new max window when the current one is over (called at scrape time)."""
        now = time.monotonic()
        if now - self.window_start < MAX_WINDOW_S:
            return
        stale = now - self.window_start >= 2 * MAX_WINDOW_S
        for entry in self.entries.values():
            entry[4] = 0.0 if stale else entry[3]
            entry[3] = 0.0
        self.window_start = now

    def collect(self) -> Iterator[Any]:
        self.rotate_max()
        requests = CounterMetricFamily("shoal_requests", "Requests handled, by transport, request type and Nacos code",
                                       labels=["transport", "type", "code"])
        counts: dict[tuple[str, str, int], float] = {}
        grpc = _TimerFamilies("grpc_server_requests_seconds",
                              "gRPC requests handled (Nacos GrpcRequestAcceptor's timer)",
                              ["requestClass", "success", "errorCode", "throwableClass", "module"])
        http = _TimerFamilies("http_server_requests_seconds", "HTTP requests handled (Spring Boot's timer)",
                              ["exception", "method", "outcome", "status", "uri"])
        for (transport, type_name, code, method), entry in list(self.entries.items()):
            key = (transport, type_name, code)
            counts[key] = counts.get(key, 0) + entry[0]
            if entry[1] == 0:
                continue
            if transport == "http":
                http.add(["None", method or "GET", _outcome(code), str(code), type_name], entry)
            else:
                module = "cluster" if transport == "cluster" else _grpc_module(type_name)
                error_code = 0 if code == 200 else code
                grpc.add([type_name, "true" if code == 200 else "false", str(error_code), "None", module], entry)
        for (transport, type_name, code), value in counts.items():
            requests.add_metric([transport, type_name, str(code)], value)
        yield requests
        yield from grpc.families()
        yield from http.families()


class _TimerFamilies:
    """A histogram family plus Micrometer's ``<name>_max`` gauge, filled from request entries."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        self.histogram = HistogramMetricFamily(name, documentation, labels=labels)
        self.max = GaugeMetricFamily(f"{name}_max", f"{documentation}: the longest in the last window",
                                     labels=labels)

    def add(self, labels: list[str], entry: list[float]) -> None:
        buckets: list[tuple[str, float]] = []
        running = 0.0
        for bound, count in zip(REQUEST_BUCKETS, entry[5:], strict=False):
            running += count
            buckets.append((_bound_text(bound), running))
        buckets.append(("+Inf", entry[1]))
        self.histogram.add_metric(labels, buckets, entry[2])
        self.max.add_metric(labels, max(entry[3], entry[4]))

    def families(self) -> Iterator[Any]:
        yield self.histogram
        yield self.max


def _bound_text(bound: float) -> str:
    return repr(float(bound))


def _grpc_module(type_name: str) -> str:
    if type_name == "unknown":
        return "unknown"
    if type_name in INTERNAL_REQUEST_TYPES:
        return "internal"
    if type_name.startswith("Config"):
        return "config"
    return "naming"


def _outcome(status: int) -> str:
    """Spring's ``Outcome`` of an HTTP status."""
    if status < 200:
        return "INFORMATIONAL"
    if status < 300:
        return "SUCCESS"
    if status < 400:
        return "REDIRECTION"
    if status < 500:
        return "CLIENT_ERROR"
    return "SERVER_ERROR"


# --- scrape-time collectors ------------------------------------------------------------------------
class _SizeCollector:
    def __init__(self, sizes: Callable[[], dict[str, float]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[Any]:
        for name, value in self._sizes().items():
            family = GaugeMetricFamily(f"shoal_{name}", f"Current number of {name.replace('_', ' ')}")
            family.add_metric([], value)
            yield family


class _GaugeCollector:
    def __init__(self, name: str, doc: str, value: Callable[[], float]) -> None:
        self._name, self._doc, self._value = name, doc, value

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._name, self._doc)
        family.add_metric([], self._value())
        yield family


class _PushStats:
    """Push outcomes in Nacos's terms (totalPush, failedPush, push cost), since the node started."""

    __slots__ = ("cost_count", "cost_max_ms", "cost_sum_ms", "empty", "failed", "total")

    def __init__(self) -> None:
        self.total = 0
        self.failed = 0
        self.empty = 0
        self.cost_count = 0
        self.cost_sum_ms = 0
        self.cost_max_ms = -1  # Nacos's "no push yet"


class _NamingCollector:
    """``nacos_monitor`` (naming and connection modules) and the naming publisher/subscriber gauges."""

    def __init__(self, figures: Callable[[], NamingFigures], push: _PushStats) -> None:
        self._figures = figures
        self._push = push

    def collect(self) -> Iterator[Any]:
        f = self._figures()
        p = self._push
        values = {
            "serviceCount": f.service_count,
            "ipCount": f.ip_count,
            "subscriberCount": f.subscriber_count,
            "maxPushCost": p.cost_max_ms,
            "avgPushCost": p.cost_sum_ms // p.cost_count if p.cost_count else -1,
            "totalPush": p.total,
            "totalPushCountForAvg": p.cost_count,
            "totalPushCostForAvg": p.cost_sum_ms,
            "failedPush": p.failed,
            "emptyPush": p.empty,
            "pushPendingTaskCount": f.push_pending,
        }
        monitor = GaugeMetricFamily("nacos_monitor", "Nacos MetricsMonitor gauges", labels=["module", "name"])
        # Persistent-instance health checks, the CP leader and event queues do not exist here
        # (events are dispatched synchronously): Nacos's names, always 0.
        for name in NAMING_MONITOR_NAMES:
            monitor.add_metric(["naming", name], values.get(name, 0))
        monitor.add_metric(["core", "longConnection"], f.connections)
        for module, count in sorted(f.connections_by_module.items()):
            if module and module != "core":
                monitor.add_metric([module, "longConnection"], count)
        yield monitor
        subscriber = GaugeMetricFamily("nacos_naming_subscriber", "Subscribed services by client version",
                                       labels=["version"])
        publisher = GaugeMetricFamily("nacos_naming_publisher", "Published services by client version",
                                      labels=["version"])
        for version in ("v1", "v2"):
            subscriber.add_metric([version], f.subscribers_by_version.get(version, 0))
            publisher.add_metric([version], f.publishers_by_version.get(version, 0))
        yield subscriber
        yield publisher
        load = GaugeMetricFamily("system_load_average_1m", "The host's one-minute load average")
        load.add_metric([], os.getloadavg()[0])
        yield load
        cpus = GaugeMetricFamily("system_cpu_count", "Processors available to the process")
        cpus.add_metric([], float(os.cpu_count() or 1))
        yield cpus


class _ClusterCollector:
    """Member states, Distro sync queues and failures, verify rounds and repairs."""

    def __init__(self, figures: Callable[[], ClusterFigures | None]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Any]:
        f = self._figures()
        if f is None:  # standalone: no cluster series at all
            return
        state = GaugeMetricFamily("shoal_cluster_member_state",
                                  "1 for the state this node sees each member in (Nacos NodeState), else 0",
                                  labels=["member", "state"])
        for address, current in f.members:
            for name in MEMBER_STATES:
                state.add_metric([address, name], 1.0 if current == name else 0.0)
        yield state
        members = GaugeMetricFamily("shoal_cluster_members", "Members by state, as this node sees them",
                                    labels=["state"])
        for name in MEMBER_STATES:
            members.add_metric([name], sum(1 for _, current in f.members if current == name))
        yield members
        loaded = GaugeMetricFamily("shoal_distro_loaded", "1 once the initial snapshot load is done")
        loaded.add_metric([], 1.0 if f.loaded else 0.0)
        yield loaded
        depth = GaugeMetricFamily("shoal_distro_sync_queue_depth", "Clients waiting to be synced, by peer",
                                  labels=["peer"])
        batches = CounterMetricFamily("shoal_distro_sync_batches", "Sync batches sent to a peer, by result",
                                      labels=["peer", "result"])
        full = GaugeMetricFamily("shoal_distro_sync_needs_full_verify",
                                 "1 while a peer's queue was dropped and waits for a full verify", labels=["peer"])
        sent_records = CounterMetricFamily("shoal_distro_sync_records",
                                           "Client records in the sync batches a peer acknowledged, by peer",
                                           labels=["peer"])
        for peer in f.peers:
            depth.add_metric([peer.peer], peer.pending)
            batches.add_metric([peer.peer, "success"], peer.sent_batches)
            batches.add_metric([peer.peer, "failed"], peer.failed_batches)
            full.add_metric([peer.peer], 1.0 if peer.needs_full_verify else 0.0)
            sent_records.add_metric([peer.peer], peer.sent_records)
        yield depth
        yield batches
        yield full
        yield sent_records
        received = CounterMetricFamily("shoal_distro_sync_received_batches",
                                       "Sync batches received from a peer, by sender", labels=["peer"])
        received_records = CounterMetricFamily("shoal_distro_sync_received_records",
                                               "Client records in the sync batches received, by sender",
                                               labels=["peer"])
        applied = CounterMetricFamily("shoal_distro_sync_applied_records",
                                      "Received client records that changed a client here, by sender",
                                      labels=["peer"])
        for source in f.received:
            received.add_metric([source.peer], source.batches)
            received_records.add_metric([source.peer], source.records)
            applied.add_metric([source.peer], source.applied)
        yield received
        yield received_records
        yield applied
        for name, doc, value in (
            ("shoal_distro_verify_rounds", "Verify rounds this node ran as owner", f.verify_rounds),
            ("shoal_distro_verify_requests", "Verify requests sent to peers", f.verify_requests),
            ("shoal_distro_verify_bytes", "Bytes of verify requests sent to peers", f.verify_bytes),
            ("shoal_distro_verify_repairs", "Clients re-synced because verify found them missing or stale",
             f.verify_repairs),
        ):
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], value)
            yield counter
        mismatched = GaugeMetricFamily("shoal_distro_verify_mismatched",
                                       "Differences the last verify round found, by peer", labels=["peer"])
        for peer_address, count in sorted(f.verify_mismatched.items()):
            mismatched.add_metric([peer_address], count)
        yield mismatched
        if f.write_waits:
            waits = CounterMetricFamily("shoal_workers_write_waits",
                                        "Writes (HTTP ephemeral, CP) that waited for the sibling workers before "
                                        "their answer, "
                                        "by outcome (acked; failed or timeout: answered unconfirmed)",
                                        labels=["outcome"])
            for outcome, count in sorted(f.write_waits.items()):
                waits.add_metric([outcome], count)
            yield waits


class _UptimeCollector:
    """Micrometer's ``process_uptime_seconds`` (dashboards show it as the node's uptime)."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily("process_uptime_seconds", "Seconds since this node's metrics were created")
        family.add_metric([], time.monotonic() - self._start)
        yield family


class Metrics:
    """The node's metric families (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = _RequestStats()
        self._entries = self._requests.entries  # the hot path's one lookup
        self.registry.register(self._requests)
        self.pushes = Counter("shoal_push", "Pushes to subscribers by result", ["result"], registry=self.registry)
        self.push_latency = Histogram(
            "shoal_push_latency_seconds", "Time from a service change to the subscriber's ack",
            buckets=PUSH_BUCKETS, registry=self.registry,
        )
        self.push_ack = Histogram(
            "shoal_push_ack_seconds", "Time from the change that caused a push to the subscriber's ack",
            ["namespace", "transport"], buckets=PUSH_BUCKETS, registry=self.registry,
        )
        self._push_ack_namespaces: set[str] = set()
        #: the same observations per bucket of PUSH_BUCKETS (+Inf last), over every label, not cumulative
        self._push_ack_counts = [0] * (len(PUSH_BUCKETS) + 1)
        self.connections_closed = Counter(
            "shoal_connections_closed", "Connections unregistered, by reason", ["reason"], registry=self.registry,
        )
        self._push = _PushStats()
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_UptimeCollector())
        self.health_checks = Counter(
            "shoal_health_checks", "Server-side checks of persistent instances run by this node, by type",
            ["type"], registry=self.registry,
        )

    def add_sizes(self, sizes: Callable[[], dict[str, float]]) -> None:
        self.registry.register(_SizeCollector(sizes))

    def add_gauge(self, name: str, doc: str, value: Callable[[], float]) -> None:
        """Export one unlabelled gauge whose ``value`` is read at scrape time."""
        self.registry.register(_GaugeCollector(name, doc, value))

    def add_naming(self, figures: Callable[[], NamingFigures]) -> None:
        """Export Nacos's naming and connection gauges from ``figures`` (called at scrape time)."""
        self.registry.register(_NamingCollector(figures, self._push))

    def add_cluster(self, figures: Callable[[], ClusterFigures | None]) -> None:
        """Export the cluster series from ``figures`` (called at scrape time; None: standalone)."""
        self.registry.register(_ClusterCollector(figures))

    def request(self, transport: str, type_name: str, code: int, seconds: float | None = None,
                method: str = "") -> None:
        """Count one handled request: ``transport`` is ``grpc``, ``cluster`` or ``http``;
        ``type_name`` the request type (gRPC) or route template (HTTP); ``code`` the Nacos code
        (gRPC, 200 for success) or HTTP status. With ``seconds`` it also lands in the duration
        histogram; ``method`` is the HTTP verb."""
        key = (transport, type_name, code, method)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_REQUEST_SERIES:  # bounded, whatever type names peers send
                key = (transport, OVERFLOW_TYPE, code, method)
                entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [0.0] * (6 + len(REQUEST_BUCKETS))
        entry[0] += 1
        if seconds is not None:
            entry[1] += 1
            entry[2] += seconds
            if seconds > entry[3]:
                entry[3] = seconds
            entry[5 + bisect_left(REQUEST_BUCKETS, seconds)] += 1

    def request_count(self, transport: str, type_name: str, code: int) -> int:
        """How many requests of this kind were counted (what the scrape shows)."""
        return int(sum(entry[0] for (t, n, c, _), entry in self._entries.items()
                       if (t, n, c) == (transport, type_name, code)))

    def requests_by_transport(self) -> dict[str, float]:
        """Requests counted since the start, by transport (``grpc``, ``cluster``, ``http``): one
        pass over the bounded request entries, for the console's charts."""
        totals: dict[str, float] = {}
        for (transport, _type, _code, _method), entry in list(self._entries.items()):
            totals[transport] = totals.get(transport, 0.0) + entry[0]
        return totals

    def push_ack_buckets(self) -> list[float]:
        """``shoal_push_ack_seconds`` summed over its labels: the cumulative count of each bucket
        of :data:`PUSH_BUCKETS`, then +Inf (kept as plain numbers next to the histogram, so the
        console's charts read 14 numbers instead of collecting every labelled child)."""
        out: list[float] = []
        running = 0
        for count in self._push_ack_counts:
            running += count
            out.append(float(running))
        return out

    def push_done(self, result: str, latency_s: float | None, empty: bool = False) -> None:
        """One push finished: ``result`` as PushService names it, the change → ack latency of a
        successful push, and whether it carried no hosts (Nacos's emptyPush)."""
        self.pushes.labels(result).inc()
        push = self._push
        if result in ("success", "failed", "timeout", "gone"):
            push.total += 1
            if result != "success":
                push.failed += 1
            if empty:
                push.empty += 1
        if latency_s is not None:
            self.push_latency.observe(latency_s)
            cost_ms = int(latency_s * 1000)
            push.cost_count += 1
            push.cost_sum_ms += cost_ms
            if cost_ms > push.cost_max_ms:
                push.cost_max_ms = cost_ms

    def push_state(self, reset: bool = False) -> tuple[int, int, int, int]:
        """``(total, failed, avg cost ms, max cost ms)`` of the pushes since the start or the last
        reset (Nacos's MetricsMonitor push figures); ``reset`` starts them again (resetPush)."""
        p = self._push
        figures = (p.total, p.failed, p.cost_sum_ms // p.cost_count if p.cost_count else -1, p.cost_max_ms)
        if reset:
            p.total = p.failed = p.empty = p.cost_count = p.cost_sum_ms = 0
            p.cost_max_ms = -1
        return figures

    def push_acked(self, namespace: str, transport: str, seconds: float) -> None:
        """One push acked ``seconds`` after the change that caused it (``shoal_push_ack_seconds``);
        namespaces beyond :data:`MAX_PUSH_NAMESPACES` share the label ``other``."""
        if namespace not in self._push_ack_namespaces:
            if len(self._push_ack_namespaces) >= MAX_PUSH_NAMESPACES:
                namespace = OVERFLOW_NAMESPACE
            else:
                self._push_ack_namespaces.add(namespace)
        self.push_ack.labels(namespace, transport).observe(seconds)
        self._push_ack_counts[bisect_left(PUSH_BUCKETS, seconds)] += 1

    def health_checked(self, kind: str) -> None:
        self.health_checks.labels(kind).inc()

    def connection_closed(self, reason: str) -> None:
        self.connections_closed.labels(reason.split(":", 1)[0]).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))

