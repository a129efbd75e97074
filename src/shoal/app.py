"""Composition root: builds one node's components, owns start/stop and every background task."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.auth.service import AuthService
from shoal.clock import Clock, SystemClock
from shoal.config import Config, LiveConfig, TestHooks
from shoal.cp.factory import CpRuntime, build_cp
from shoal.cp.store import CpView, Keyspace, SiblingViews, json_view
from shoal.distro.barrier import waits_for_siblings
from shoal.distro.members import MemberManager, build_members
from shoal.distro.protocol import DistroProtocol
from shoal.distro.responsibility import (
    DistroFallback,
    ForwardAllTo,
    MapperResponsibility,
    Responsibility,
    Standalone,
)
from shoal.dns import DnsServer
from shoal.export.eventlog import ChangeLog
from shoal.export.history import HistoryLog
from shoal.export.node_export import NodeExporter, export_and_rotate
from shoal.health.checker import CheckSettings, PersistentHealthChecker
from shoal.health.heartbeat import HeartbeatChecker
from shoal.health.keepalive import ConnectionKeepAlive
from shoal.health.rebalance import ServerLoader
from shoal.metrics import Metrics
from shoal.metrics_history import ChartHistory
from shoal.model.client import Client, ClientKind
from shoal.model.keys import ServiceKey
from shoal.node_metrics import chart_sources, watch_node
from shoal.push.fuzzy import FuzzyNotifier
from shoal.push.service import PushService
from shoal.service_layer import instance_ids
from shoal.service_layer.barrier import WriteBarrier
from shoal.service_layer.digests import ServiceDigests
from shoal.service_layer.fuzzy import FuzzyWatchContext
from shoal.service_layer.lock import LockService
from shoal.service_layer.namespaces import NamespaceService
from shoal.service_layer.persistent import PersistentNaming
from shoal.service_layer.switches import Switches
from shoal.stack import ModelStack
from shoal.tasks import Periodic, run_blocking
from shoal.tls import NodeTls
from shoal.transport.grpc.client_requests import ClientRequests
from shoal.transport.grpc.cluster_server import ClusterServer
from shoal.transport.grpc.connections import Connection, ConnectionManager
from shoal.transport.grpc.limits import LimitRuleFile, SiblingConnections
from shoal.transport.grpc.lock_handlers import LockConnectionListener, lock_handlers
from shoal.transport.grpc.naming_handlers import NamingConnectionListener, naming_handlers
from shoal.transport.grpc.server import SdkServer
from shoal.transport.grpc.transports import transport_name
from shoal.transport.http import disabled_modules
from shoal.transport.http.auth_routes import AuthRoutes
from shoal.transport.http.consistency import ConsistencyCheck, ConsistencyRoutes, DisagreementGauge
from shoal.transport.http.console_api import ClusterFiguresRoutes, ConsoleRoutes
from shoal.transport.http.console_charts import ChartRoutes
from shoal.transport.http.export import ExportRoutes
from shoal.transport.http.forward import Forwarder, MemberList
from shoal.transport.http.history import HistoryRoutes
from shoal.transport.http.loader import HttpLoaderPeers, LoaderRoutes
from shoal.transport.http.namespaces import NamespaceRoutes
from shoal.transport.http.naming import NamingRoutes
from shoal.transport.http.node_scrape import NodeScrape
from shoal.transport.http.open_api_rows import OpenApiRows
from shoal.transport.http.operator import OperatorRoutes
from shoal.transport.http.prometheus_sd import PrometheusSdRoutes
from shoal.transport.http.routes import ADMIN, IDENTITY, Route
from shoal.transport.http.server import HttpServer, NodeStatus, self_member_json
from shoal.transport.http.v3 import V3Routes
from shoal.transport.http.v3_console import NodeViews, V3ConsoleRoutes
from shoal.transport.http.v3_core import V3CoreRoutes
from shoal.transport.http.v3_naming import V3NamingRoutes
from shoal.transport.selection import make_peer_transport
from shoal.transport.sharing import PortSharing
from shoal.workers.placement import WorkerPlacement
from shoal.workers.worker import worker_dir

log = logging.getLogger(__name__)


# --- the phases: each builds one layer from the ones before it and returns it as a bundle ----------
@dataclass(frozen=True, slots=True)
class CpPhase:
    """The CP store and the views of it that the node itself watches (namespaces, the switches
    document); the model's own views (persistent instances, service documents) are built by
    :class:`ModelStack`. All are started by :meth:`Node.start` before any listener."""

    runtime: CpRuntime
    namespaces: CpView[Any]
    meta: CpView[Any]


@dataclass(frozen=True, slots=True)
class ModelPhase:
    """The registry (ModelStack: model + NamingService) and the CP use cases over the views."""

    stack: ModelStack
    persistent: PersistentNaming  # the CP half of the naming use cases (``stack.naming.persistent``)
    namespaces: NamespaceService
    switches: Switches
    locks: LockService  # the Nacos 3.3 lock module on the CP store (docs/protocol.md §9)


@dataclass(frozen=True, slots=True)
class ClusterPhase:
    """Membership, Distro and who handles an ``ip:port`` (all standalone values when alone)."""

    members: MemberManager | None
    distro: DistroProtocol | None
    responsibility: Responsibility
    fallback: DistroFallback | None  # an owner that does not answer a forwarded write: handle it here

    def checks_service(self, name: str) -> bool:
        """Whether this node runs the persistent health checks of a service."""
        return self.distro.mapper.responsible(name) if self.distro is not None else True


@dataclass(frozen=True, slots=True)
class TransportPhase:
    """The listeners, and what the SDK side needs around them."""

    connections: ConnectionManager
    requests: ClientRequests
    fuzzy: FuzzyWatchContext
    fuzzy_notifier: FuzzyNotifier
    sdk: SdkServer
    http: HttpServer
    cluster: ClusterServer | None
    dns: DnsServer | None  # Nacos 3.3 built-in DNS (docs/protocol.md §8), when enabled


def build_cp_phase(config: Config, members: MemberManager | None, worker: bool = False,
                   siblings: SiblingViews | None = None) -> CpPhase:
    """The CP store: persistent instances, service metadata, namespaces, switches and auth data are
    cluster-wide through it, fed into the model by the views' watches on every node. Its members are
    the NODES (one etcd member per node, whatever its workers); a standalone node has none. A worker
    never runs an etcd member (its supervisor does): standalone, it opens the node's one embedded
    store, polled often, since its siblings write it too; ``siblings``: what its writes wait for."""
    clustered = members is not None and (len(members.nodes()) > 1 or bool(config.members or config.cluster_conf))
    runtime = build_cp(config, [(m.ip, m.port) for m in members.nodes()] if clustered and members else [],
                       members.self_node_address if clustered and members else "", worker=worker, siblings=siblings)
    store = runtime.store
    return CpPhase(runtime, json_view(store, Keyspace.NAMESPACES), json_view(store, Keyspace.META))


def build_model_phase(config: Config, clock: Clock, live: LiveConfig, cp: CpPhase, address: str,
                      barrier: WriteBarrier | None = None) -> ModelPhase:
    """The registry and the use cases over it; the switches reload ``live`` from the CP document.
    ``barrier``: what an answered ephemeral write waits for (a worker's sibling workers)."""
    instance_ids.configure(config.snowflake_worker_id)  # snowflake instance ids (docs/protocol.md §3.6)
    stack = ModelStack.build(config, clock, cp.runtime.store, live, barrier)
    locks = LockService(cp.runtime.store, address, clock.now_ms, config.lock_default_expire_ms,
                        config.lock_max_expire_ms)
    return ModelPhase(stack, stack.naming.persistent,
                      NamespaceService(cp.namespaces, clock.now_ms), Switches(live, cp.meta), locks)


def build_cluster_phase(config: Config, clock: Clock, hooks: TestHooks, tls: NodeTls, stack: ModelStack,
                        members: MemberManager | None, on_renew: Callable[[Client, int], object],
                        siblings: SiblingConnections | None = None) -> ClusterPhase:
    """Distro over the member list (None standalone) and the node's ``Responsibility``: the Distro
    mapper, this node alone, or every write forwarded to one node (a test hook). A worker's
    member reports carry its connections to its siblings (``siblings``)."""
    distro = None
    if members is not None:
        identity = ((config.cluster_identity_key, config.cluster_identity_value)
                    if config.cluster_identity_key else None)
        transport = make_peer_transport(config, members.self_address, identity, tls.peer, members.introduction())
        distro = DistroProtocol(config, clock, stack.bus, stack.clients, stack.services, members, transport,
                                on_renew, drop_incoming_sync=hooks.drop_incoming_sync, siblings=siblings,
                                cp_store=stack.cp_store)
    responsibility: Responsibility = (
        ForwardAllTo(hooks.forward_all_to) if hooks.forward_all_to
        else MapperResponsibility(distro.mapper) if distro is not None else Standalone())
    fallback = (DistroFallback(distro.members, distro.handoff)  # docs/protocol.md §5.5
                if distro is not None and not hooks.forward_all_to else None)
    return ClusterPhase(members, distro, responsibility, fallback)


def build_transport_phase(config: Config, tls: NodeTls, metrics: Metrics, auth: AuthService, status: NodeStatus,
                          model: ModelPhase, cluster: ClusterPhase, limits: LimitRuleFile,
                          on_closed: Callable[[Connection, str], None],
                          sharing: PortSharing | None = None,
                          siblings: SiblingConnections | None = None,
                          scrape: NodeScrape | None = None) -> TransportPhase:
    """The SDK port (its connection clients created and released by the service layer), the HTTP
    port (routes installed by the node) and, in a cluster, the cluster port; a worker shares the
    node's ports with its siblings and has a private HTTP and cluster port besides (``sharing``)."""
    stack = model.stack
    connections = ConnectionManager(config, stack.clock, limits, source="sdk",
                                    listeners=[NamingConnectionListener(stack.naming)],
                                    on_unregister=[on_closed, LockConnectionListener(model.locks)],
                                    siblings=siblings)
    requests = ClientRequests(connections)
    fuzzy_notifier = FuzzyNotifier(config, requests)
    fuzzy = FuzzyWatchContext(config, stack.bus, stack.services, stack.index, fuzzy_notifier.enqueue)
    handlers = {**naming_handlers(stack.naming, fuzzy), **lock_handlers(model.locks)}
    sdk = SdkServer(config, connections, handlers, status.is_serving, metrics, config.grpc_port,
                    auth=auth if config.auth_enabled else None, tls=tls.sdk, reuse_port=sharing is not None)
    forwarder = Forwarder(cluster.responsibility, config.http_forward_timeout_ms,
                          tls.http.client_context() if tls.http is not None else None, cluster.fallback)
    members = MemberList(cluster.members.nodes) if cluster.members is not None else None  # one per node
    http = HttpServer(config, status, metrics, auth, forwarder, members, tls=tls.http, sharing=sharing,
                      scrape=scrape)
    cluster_server = (ClusterServer(config, cluster.distro.dispatch, metrics, tls=tls.peer, sharing=sharing)
                      if cluster.distro is not None else None)
    dns = (DnsServer(config, stack.naming, status.is_serving, reuse_port=sharing is not None,
                     workers=sharing.workers if sharing is not None else 1)
           if config.dns_enabled else None)
    return TransportPhase(connections, requests, fuzzy, fuzzy_notifier, sdk, http, cluster_server, dns)


def node_address(config: Config, members: MemberManager | None) -> str:
    """This node's ip:port as peers, snapshots and lock holders name it."""
    if members is not None:
        return members.self_address
    host = config.self_address or config.host
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return f"{host}:{config.port}"


class Node:
    """One Shoal node: model, service layer, transports, push and health loops (or, with a
    ``placement``, one worker of a multi-worker node: shoal/workers/).

    Built in phases (members → CP → model → cluster → transports → loops → routes), each from
    the bundles before it, so no component is changed after it is built. The settings that may
    change while the node runs (the naming switches) are one :class:`LiveConfig` its consumers
    read by reference.
    """

    def __init__(self, config: Config, clock: Clock | None = None, hooks: TestHooks | None = None,
                 placement: WorkerPlacement | None = None) -> None:
        self.config = config  # a worker's as shoal.workers.worker.worker_config made it
        self.placement = placement
        #: where this process writes its own scratch files (a worker: a directory of its own)
        self.scratch_dir = worker_dir(config, placement) if placement is not None else Path(config.data_dir)
        sharing = (PortSharing(placement.index, placement.private_port,
                               placement.private_port + config.cluster_port_offset, placement.count)
                   if placement is not None else None)
        self.clock = clock = clock or SystemClock()
        self.hooks = hooks = hooks or TestHooks()
        self.live = LiveConfig(config)
        self.metrics = Metrics()
        self.auth = AuthService(config)
        self.grpc_transport = transport_name(config)  # a bad or unbuilt choice is a ConfigError here
        # Every configured certificate, key and CA file is read and checked here, before any port
        # opens: a bad one is a TlsConfigError (exit 2), never a plaintext port.
        self.tls = NodeTls.load(config)
        self.limits = LimitRuleFile(config.limit_rule_path)
        # A worker's sibling workers' connections, from their member reports: the limits are the node's.
        self.sibling_connections = (
            SiblingConnections(lambda: self.sdk_connections.own_counts(), lambda: self.limits.rule,
                               clock.monotonic_ms,
                               2 * config.member_report_interval_ms + config.member_report_timeout_ms)
            if placement is not None and placement.count > 1 else None)

        members = build_members(config, clock, placement)
        #: a worker's siblings: (index, private ip:port), where it asks them for their own figures
        self.sibling_workers = ([(i, f"{members.self_member.ip}:{p}") for i, p in enumerate(placement.ports)
                                 if i != placement.index] if placement is not None and members is not None else [])
        # a worker answers an HTTP write once its siblings hold it; a single process: no barrier at all
        waits = waits_for_siblings(config, members)
        cp = self.cp_phase = build_cp_phase(config, members, worker=placement is not None,
                                            siblings=self._cp_wait_for_siblings if waits else None)
        barrier = self._wait_for_siblings if waits else None
        model = self.model_phase = build_model_phase(config, clock, self.live, cp, node_address(config, members),
                                                     barrier)
        cluster = self.cluster = build_cluster_phase(config, clock, hooks, self.tls, model.stack, members,
                                                     self._renew_beats, self.sibling_connections)
        net = self.transports = build_transport_phase(config, self.tls, self.metrics, self.auth, self, model,
                                                      cluster, self.limits, self._count_closed, sharing,
                                                      self.sibling_connections,
                                                      NodeScrape(self.sibling_workers, self.tls.http)
                                                      if self.sibling_workers else None)
        # the names the rest of the code (metrics, tests, tools) reads
        self.cp: CpRuntime = cp.runtime
        self.model = model.stack
        self.bus, self.clients, self.services = self.model.bus, self.model.clients, self.model.services
        self.index, self.storage, self.naming = self.model.index, self.model.storage, self.model.naming
        self.persistent, self.namespaces, self.switches = model.persistent, model.namespaces, model.switches
        self.members, self.distro, self.responsibility = cluster.members, cluster.distro, cluster.responsibility
        self.sdk_connections, self.sdk_server, self.http = net.connections, net.sdk, net.http
        self.cluster_server, self.fuzzy, self.fuzzy_notifier = net.cluster, net.fuzzy, net.fuzzy_notifier
        self.locks, self.dns = model.locks, net.dns
        self.instance_view, self.service_view = self.model.instance_view, self.model.service_view
        #: every CP view the node starts, waits for and stops (the switches' document too)
        self.cp_views = (cp.namespaces, *self.model.views, cp.meta)

        # --- the loops over them ------------------------------------------------------------------
        # The instance history (issue 23 item 5): model events and pushes, on disk under the data dir.
        self.history = (HistoryLog(self.bus, clock, self.clients, self.address, self.scratch_dir / "history",
                                   config.history_max_bytes, config.history_segment_bytes, config.history_queue)
                        if config.history_enabled else None)
        self.push = PushService(self.live, clock, self.bus, net.requests, self.index.subscribers_of,
                                self._push_payload, self.metrics, self.services, self.grpc_transport,
                                observer=self.history)
        self.keepalive = ConnectionKeepAlive(config, net.connections, net.sdk, self.limits)
        self.heartbeats = HeartbeatChecker(self.live, clock, self.clients, self.services, self.naming.beats,
                                           cluster.responsibility)
        self.health_checker = PersistentHealthChecker(model.persistent, cluster.checks_service, clock.monotonic_ms,
                                                      CheckSettings.of(config), self.live, self.metrics.health_checked)
        # Arrow snapshots: the change-event log is always kept; periodic export when configured.
        self.changelog = ChangeLog(self.bus, clock, self.clients, config.event_log_capacity)
        self.exporter = NodeExporter(self.address, clock, self.clients, self.services, self.index,
                                     self.storage, self.changelog, self._owner_of, self.naming.beats.last_beat_ms)
        # Connection rebalancing: the Nacos loader API, and the automatic round when enabled.
        self.loader_peers = HttpLoaderPeers(config, self.tls.http) if members is not None else None
        self.loader = ServerLoader(config, net.connections, net.sdk, self._node_address, self._member_addresses,
                                   self.loader_peers, self.is_serving, clock.monotonic_ms,
                                   on_move=self.naming.moved.mark, kept=lambda: len(self.naming.moved.kept),
                                   workers=[f"{members.self_member.ip}:{p}" for p in placement.ports]
                                   if placement is not None and members is not None else (),
                                   worker_index=placement.index if placement is not None else 0,
                                   sibling_connections=self.sibling_connections.total
                                   if self.sibling_connections is not None else None)
        # Which node is stale (issue 23 item 4): this node's digests, the members' comparison, its gauge.
        self.digests = ServiceDigests(self.services, self.storage)
        self.disagreements = DisagreementGauge()
        self.metrics.registry.register(self.disagreements)
        self.consistency = ConsistencyCheck(config, self.digests, self._node_address, self._member_addresses,
                                            self.tls.http, self.disagreements)
        # The console's charts (issue 23 item 6): the last minutes of the node's figures, in memory.
        self.charts = ChartHistory(chart_sources(self), clock, config.console_chart_interval_ms,
                                   config.console_chart_window_ms)
        self.periodics = self._periodics()

        # --- the HTTP routes, all installed here, one way (transport/http/routes.py) ---------------
        self.http.install(self._routes())
        self._serving = False
        self._started = False
        self._cp_started = False
        self.metrics.add_sizes(self._sizes)
        watch_node(self.metrics, self)

    def _periodics(self) -> list[Periodic]:
        """Every background loop of the node (``Node.start`` starts them, ``stop`` stops them)."""
        config = self.config
        periodics = [
            Periodic("connection-keep-alive", config.connection_check_interval_ms, self.keepalive.scan,
                     initial_delay_ms=min(1000, config.connection_check_interval_ms)),
            Periodic("empty-service-cleaner", config.empty_service_clean_interval_ms, self._clean_services),
            Periodic("expired-metadata-cleaner", config.expired_metadata_clean_interval_ms, self._clean_edits),
            Periodic("persistent-health-check", min(200, config.health_check_interval_ms),
                     self.health_checker.tick),
            Periodic("beat-check", config.beat_check_interval_ms, self.heartbeats.tick),
            Periodic("lock-sweep", 60_000, self.locks.sweep),
            Periodic("console-charts", config.console_chart_interval_ms, self.charts.tick),
        ]
        if self.history is not None:
            periodics.append(Periodic("history-flush", config.history_flush_ms, self.history.flush))
        if config.export_dir:
            periodics.append(Periodic("arrow-export", config.export_interval_ms, self._export_periodically))
        if config.rebalance_grace_ms > 0:  # moved clients kept listed until they are back (beyond Nacos)
            periodics.append(Periodic("moved-client-grace", min(500, config.rebalance_grace_ms), self._release_moved))
        if config.consistency_check_interval_ms:
            periodics.append(Periodic("consistency-check", config.consistency_check_interval_ms,
                                      self.consistency.tick))
        if config.rebalance_enabled:
            periodics.append(Periodic("rebalance", config.rebalance_interval_ms, self.loader.rebalance_tick))
        return periodics

    def _routes(self) -> list[Route]:
        """Every HTTP route of the node: each route module's table."""
        config, http = self.config, self.http
        naming = NamingRoutes(config, self.naming, self.is_serving, http.forwarder.owner_of, self.push)
        operator = OperatorRoutes(self.naming, self.switches)
        loader = LoaderRoutes(self.loader, self.sdk_connections, http.asks_node, self.loader_peers)
        auth = AuthRoutes(self.auth)
        # The Nacos 3.x surface (docs/protocol.md §5.7): route tables over the same handlers.
        v3_naming = V3NamingRoutes(self.naming, naming, operator, self._responsible_server, self.is_serving,
                                   http.forwarder.owner_of)
        node_views = NodeViews(http.server_state, self._member_jsons, self.readiness_problem)
        v3_core = V3CoreRoutes(self.namespaces, loader, http.state, http.cluster_nodes_v2,
                               self._self_member, self.readiness_problem)
        return [
            *http.routes(),
            *naming.routes(),
            *ConsoleRoutes(self.naming, self.push).routes(),
            *(PrometheusSdRoutes(self.naming, self.auth).routes() if config.prometheus_sd_enabled else []),
            *auth.routes(),
            *NamespaceRoutes(self.namespaces).routes(ADMIN, IDENTITY),
            *operator.routes(ADMIN),
            *ExportRoutes(self.exporter, self.scratch_dir / "export-scratch").routes(ADMIN),
            # the console's cluster page: every member's Distro figures as this node sees them
            *ClusterFiguresRoutes(config, self.distro, self.clients).routes(),
            *ChartRoutes(self.charts).routes(),
            *loader.routes(ADMIN),
            *ConsistencyRoutes(self.digests, self.consistency).routes(ADMIN),
            *HistoryRoutes(self.history, self.address).routes(ADMIN),
            *v3_core.routes(ADMIN),
            *V3Routes(self.naming, naming, self.auth).routes(ADMIN, IDENTITY),
            *v3_naming.routes(ADMIN),
            # the 3.x console and the last 2.x Open API rows (docs/protocol.md §5.7)
            *V3ConsoleRoutes(naming, v3_naming, self.namespaces, node_views).routes(ADMIN, IDENTITY),
            *OpenApiRows(self.naming, naming, operator, self._self_member, self._responsible_server,
                         self.metrics.push_state, self.readiness_problem, self._member_jsons).routes(ADMIN),
            *disabled_modules.routes(),  # config and AI: 501 / 40001
        ]

    # --- status -------------------------------------------------------------------------
    def is_serving(self) -> bool:
        return self._serving

    def readiness_problem(self) -> str | None:
        if self._serving:
            return None
        if self.distro is not None and not self.distro.loaded and self._started:
            return "node is loading a snapshot from its peers"
        if self._started and not all(view.ready for view in self.model.views):
            return "node is reading its CP store"
        return "node is starting"

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Open the listeners (answering 300 until ready), start the loops, then serve."""
        await run_blocking(self.limits.reload_if_changed)  # limits hold from the first connection
        await self.cp.start()  # the store (and, managed, this node's etcd member) before any listener
        self._cp_started = True
        for view in self.cp_views:
            view.start()
        await self.auth.start(self.cp.store, wait_s=0)  # users and the cluster's token key, from the CP store
        cp_ready = asyncio.get_running_loop().create_task(self._wait_cp_ready(), name="cp-ready")
        await self.http.start()  # a worker: its private port only, until it serves (_share_ports)
        if self.placement is None:
            if self.dns is not None:
                await self.dns.start()
            await self.sdk_server.start()
        self._started = True
        if self.cluster_server is not None and self.distro is not None:
            await self.cluster_server.start()
            await self.distro.start()
        self.push.start()
        self.fuzzy_notifier.start()
        for periodic in self.periodics:
            periodic.start()
        if self.distro is not None:  # a starting cluster node loads a peer's snapshot before serving
            await self.distro.wait_loaded(self.config.load_timeout_ms / 1000)
        await cp_ready  # waited for alongside the Distro load, under the same bound
        if self.config.startup_delay_ms:
            await asyncio.sleep(self.config.startup_delay_ms / 1000)
        self._serving = True
        if self.placement is not None:
            await self._share_ports()
        log.info("node serving: HTTP %d, gRPC SDK %d", self.config.port, self.config.grpc_port)

    async def _share_ports(self) -> None:
        """A worker joins its siblings on the node's public ports only once it serves, so the kernel
        never hands a client to a worker that is still starting (or restarting)."""
        await self.http.share()
        if self.dns is not None:
            await self.dns.start()
        await self.sdk_server.start()
        if self.cluster_server is not None:
            await self.cluster_server.share()

    async def stop(self) -> None:
        """Graceful stop: refuse new work, close streams, cancel every task."""
        self._serving = False
        for periodic in self.periodics:
            await periodic.stop()
        if self._started:
            await self.sdk_server.stop(self.config.shutdown_grace_ms / 1000)
        # clients kept for moved connections go with their node, as its other connection clients do
        self.naming.moved.release_all()
        if self.distro is not None:
            await self.distro.stop()
        if self.cluster_server is not None:
            await self.cluster_server.stop(0.5)
        await self.health_checker.stop()
        await self.push.stop()
        if self.history is not None:  # what the node's stop itself released is written too
            await self.history.close()
        await self.fuzzy_notifier.stop()
        if self.loader_peers is not None:
            await self.loader_peers.stop()
        await self.consistency.stop()
        await self.http.stop()
        if self.dns is not None:
            await self.dns.stop()
        await self.locks.stop()  # the lock module's pending releases of closed connections
        for view in self.cp_views:
            await view.stop()
        await self.auth.stop()
        if self._cp_started:
            await self.cp.stop()
        log.info("node stopped")

    async def _wait_cp_ready(self) -> None:
        """Readiness waits for the CP views' first full read (namespaces, persistent instances,
        service metadata, operators' instance edits, switches) and the auth data and token key, all
        within one load-timeout bound: a node whose store has no quorum yet serves AP traffic
        meanwhile, and its views fill later."""
        timeout_s = self.config.load_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                for view in self.cp_views:  # the cluster's switches too: in force before serving
                    await view.wait_ready()
                await self.auth.wait_ready()
        except TimeoutError:
            log.warning("CP store (%s) not readable after %.1f s: serving AP traffic; persistent instances, "
                        "service metadata, namespaces, users and tokens follow once it is", self.cp.mode, timeout_s)

    # --- glue ---------------------------------------------------------------------------
    @functools.cached_property
    def address(self) -> str:
        """This node's ip:port as peers and snapshots name it (resolved once, at construction)."""
        return node_address(self.config, self.members)

    @property
    def _node_address(self) -> str:
        """This node's ip:port as operators name it: its public port, even in a worker."""
        return self.members.self_node_address if self.members is not None else self.address

    def _member_jsons(self) -> list[dict[str, Any]]:
        """Every node's Member JSON, one per node (this node's alone when standalone)."""
        return self.http.members.members() if self.http.members is not None else [self._self_member()]

    def _self_member(self) -> dict[str, Any]:
        """This node's Member JSON (v3 ``cluster/node/self``): the node, not the worker."""
        if self.members is not None:
            return self.members.self_node_member().to_nacos()
        return self_member_json(self.config)

    def _responsible_server(self, tag: str) -> str:
        """The node responsible for an ``ip:port`` (v3 ``client/distro``): the owning worker's node."""
        owner = self.http.forwarder.owner_of(tag) or self.address
        return (self.members.node_of(owner) or owner) if self.members is not None else owner

    def _member_addresses(self) -> list[str]:
        """The nodes' addresses (rebalancing and the consistency check are between nodes)."""
        return [m.address for m in self.members.nodes()] if self.members is not None else [self.address]

    def _wait_for_siblings(self, client_id: str) -> Awaitable[None] | None:
        """The service layer's write barrier on a worker: Distro's (built after the model)."""
        barrier = self.distro.barrier if self.distro is not None else None
        return barrier(client_id) if barrier is not None else None

    def _cp_wait_for_siblings(self, keyspace: Keyspace, revision: int) -> Awaitable[None] | None:
        """The CP store's SiblingViews on a worker: Distro's catch-up requests (built after the store)."""
        siblings = self.distro.cp_siblings if self.distro is not None else None
        return siblings(keyspace, revision) if siblings is not None else None

    def _renew_beats(self, client: Client, now_mono_ms: int) -> None:
        """A verified ip:port copy is as fresh as its owner says (Nacos resets its beat time)."""
        if client.kind is ClientKind.IP_PORT:
            self.naming.beats.renew_client(client.client_id, now_mono_ms)

    def _owner_of(self, client: Client) -> str | None:
        if client.native:
            return self.address
        return client.owner or None

    async def _export_periodically(self) -> None:
        await export_and_rotate(self.exporter, Path(self.config.export_dir), self.config.export_keep)

    def _push_payload(self, client_id: str, service: ServiceKey) -> str | None:
        client = self.clients.get(client_id)
        subscriber = client.subscriptions.get(service) if client is not None else None
        if subscriber is None:
            return None
        return self.naming.reads.push_payload(service, subscriber.clusters)

    async def _clean_services(self) -> None:
        self.naming.cleaner.clean_empty_services()

    async def _clean_edits(self) -> None:
        """Operators' edits of instances gone for the expired-metadata time; only while serving, so
        a node still loading its peers' clients takes no instance for gone."""
        if self._serving:
            await self.naming.edits.clean()

    async def _release_moved(self) -> None:
        self.naming.moved.tick()

    def _count_closed(self, conn: Connection, reason: str) -> None:
        self.metrics.connection_closed(reason)

    def _sizes(self) -> dict[str, float]:
        return {
            "connections": len(self.sdk_connections),
            "clients": len(self.clients),
            "services": len(self.services),
            "instances": self.storage.instance_count(),
            "subscribers": sum(len(s) for s in self.index.subscribers.values()),
            "moved_clients_kept": len(self.naming.moved.kept),
        }
