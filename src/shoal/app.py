"""Composition root: builds one node's components, owns start/stop and every background task."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import socket
from pathlib import Path
from typing import Any

from shoal.auth.service import AuthService
from shoal.clock import Clock, SystemClock
from shoal.config import Config, TestHooks
from shoal.cp.factory import CpRuntime, build_cp
from shoal.cp.store import Keyspace, json_view
from shoal.distro.members import MemberManager, parse_member_list, read_cluster_conf
from shoal.distro.protocol import DistroProtocol
from shoal.distro.responsibility import (
    DistroFallback,
    ForwardAllTo,
    MapperResponsibility,
    Responsibility,
    Standalone,
)
from shoal.errors import ConfigError
from shoal.export.eventlog import ChangeLog
from shoal.export.node_export import NodeExporter, export_and_rotate
from shoal.health.checker import CheckSettings, PersistentHealthChecker
from shoal.health.heartbeat import HeartbeatChecker
from shoal.health.keepalive import ConnectionKeepAlive
from shoal.health.rebalance import ServerLoader
from shoal.metrics import Metrics
from shoal.model.client import Client, ClientKind
from shoal.model.keys import ServiceKey
from shoal.node_metrics import watch_node
from shoal.push.fuzzy import FuzzyNotifier
from shoal.push.service import PushService
from shoal.service_layer import instance_ids
from shoal.service_layer.fuzzy import FuzzyWatchContext
from shoal.service_layer.namespaces import NamespaceService
from shoal.service_layer.persistent import PersistentNaming
from shoal.service_layer.switches import Switches
from shoal.stack import ModelStack
from shoal.tasks import Periodic, run_blocking
from shoal.tls import NodeTls
from shoal.transport.grpc.cluster_server import ClusterServer
from shoal.transport.grpc.connections import Connection, ConnectionManager
from shoal.transport.grpc.limits import LimitRuleFile
from shoal.transport.grpc.naming_handlers import NamingConnectionListener, naming_handlers
from shoal.transport.grpc.peer_client import GrpcPeerTransport
from shoal.transport.grpc.server import SdkServer
from shoal.transport.grpc.transports import transport_name
from shoal.transport.http import disabled_modules
from shoal.transport.http.api import Api
from shoal.transport.http.auth_routes import AuthRoutes
from shoal.transport.http.console_api import ClusterFiguresRoutes
from shoal.transport.http.export import ExportRoutes
from shoal.transport.http.forward import MemberList
from shoal.transport.http.loader import HttpLoaderPeers, LoaderRoutes
from shoal.transport.http.namespaces import NamespaceRoutes
from shoal.transport.http.open_api_rows import OpenApiRows
from shoal.transport.http.operator import OperatorRoutes
from shoal.transport.http.server import ADMIN, IDENTITY, HttpServer, self_member_json
from shoal.transport.http.v3 import V3Routes, install
from shoal.transport.http.v3_console import NodeViews, V3ConsoleRoutes
from shoal.transport.http.v3_core import V3CoreRoutes
from shoal.transport.http.v3_naming import V3NamingRoutes

log = logging.getLogger(__name__)


class Node:
    """One Shoal node: model, service layer, transports, push and health loops."""

    def __init__(self, config: Config, clock: Clock | None = None, hooks: TestHooks | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.hooks = hooks or TestHooks()
        self.model = ModelStack.build(config, self.clock)
        self.bus = self.model.bus
        self.clients = self.model.clients
        self.services = self.model.services
        self.index = self.model.index
        self.storage = self.model.storage
        self.naming = self.model.naming
        self.metrics = Metrics()
        self.auth = AuthService(config)

        self.grpc_transport = transport_name(config)  # a bad or unbuilt choice is a ConfigError here
        # Every configured certificate, key and CA file is read and checked here, before any port
        # opens: a bad one is a TlsConfigError (exit 2), never a plaintext port.
        self.tls = NodeTls.load(config)
        self.limits = LimitRuleFile(config.limit_rule_path)
        self.sdk_connections = ConnectionManager(config, self.clock, self.limits, source="sdk")
        # A naming connection's client is created and released by the service layer.
        self.sdk_connections.listeners.append(NamingConnectionListener(self.naming))
        self.sdk_connections.on_unregister_hooks.append(self._count_closed)
        self.fuzzy = FuzzyWatchContext(config, self.bus, self.services, self.index)
        self.sdk_server = SdkServer(config, self.sdk_connections, naming_handlers(self.naming, fuzzy=self.fuzzy),
                                    self.is_serving,
                                    self.metrics, config.grpc_port, auth=self.auth if config.auth_enabled else None,
                                    tls=self.tls.sdk)
        self.push = PushService(config, self.clock, self.bus, self.sdk_server, self.index.subscribers_of,
                                self._push_payload, self.metrics)
        self.fuzzy_notifier = FuzzyNotifier(config, self.sdk_server)
        self.fuzzy.notify = self.fuzzy_notifier.enqueue
        self.keepalive = ConnectionKeepAlive(config, self.sdk_connections, self.sdk_server, self.limits)
        self.http = HttpServer(config, self, self.metrics, self.naming, self.auth, tls=self.tls.http)
        instance_ids.configure(config.snowflake_worker_id)  # snowflake instance ids (docs/protocol.md §3.6)
        self.periodics = [
            Periodic("connection-keep-alive", config.connection_check_interval_ms, self.keepalive.scan,
                     initial_delay_ms=min(1000, config.connection_check_interval_ms)),
            Periodic("empty-service-cleaner", config.empty_service_clean_interval_ms, self._clean_services),
        ]
        self.members: MemberManager | None = None
        self.distro: DistroProtocol | None = None
        self.cluster_server: ClusterServer | None = None
        member_list = parse_member_list(config.members)
        if not member_list and config.cluster_conf:
            try:
                member_list = read_cluster_conf(Path(config.cluster_conf))
            except OSError as exc:
                raise ConfigError(f"cannot read cluster.conf {config.cluster_conf}: {exc.strerror}") from None
        if member_list:
            self.members = MemberManager.from_list(member_list, config.port, self.clock.now_ms,
                                                   self_ip=config.self_address, host=config.host,
                                                   fail_access_cnt=config.member_fail_access_cnt)
            identity = ((config.cluster_identity_key, config.cluster_identity_value)
                        if config.cluster_identity_key else None)
            transport = GrpcPeerTransport(self.members.self_address, config.cluster_port_offset, identity,
                                          tls=self.tls.peer)
            self.distro = DistroProtocol(config, self.clock, self.bus, self.clients, self.services, self.members,
                                         transport, self._renew_beats)
            self.distro.sync_receiver.drop_count = self.hooks.drop_incoming_sync
            self.cluster_server = ClusterServer(config, self.distro.dispatch, self.metrics, tls=self.tls.peer)
            self.http.members = MemberList(self.members.all_members)
        # Who handles an ip:port (HTTP forwarding, beat checks): the Distro mapper, or this node.
        self.responsibility: Responsibility = (
            ForwardAllTo(self.hooks.forward_all_to) if self.hooks.forward_all_to
            else MapperResponsibility(self.distro.mapper) if self.distro is not None else Standalone())
        self.http.forwarder.responsibility = self.responsibility
        if self.distro is not None and not self.hooks.forward_all_to:
            # an owner that does not answer a forwarded write in time: handle it here (docs/protocol.md §5.5)
            self.http.forwarder.fallback = DistroFallback(self.distro.members, self.distro.handoff)
        # The CP store (issue 12): persistent instances, service metadata, namespaces and auth data
        # are cluster-wide through it, fed into the model by the views' watches on every node.
        self.cp: CpRuntime = build_cp(config, [(m.ip, m.port) for m in self.members.all_members()]
                                      if self.members is not None else [],
                                      self.members.self_address if self.members is not None else "")
        self.namespace_view = json_view(self.cp.store, Keyspace.NAMESPACES)
        self.namespaces = NamespaceService(self.namespace_view, self.clock.now_ms)
        NamespaceRoutes(self.namespaces).register(self.http.add_route, ADMIN, IDENTITY)
        self.instance_view = json_view(self.cp.store, Keyspace.INSTANCES)
        self.service_view = json_view(self.cp.store, Keyspace.SERVICES)
        self.persistent = PersistentNaming(self.naming, self.instance_view, self.service_view)
        self.http.set_persistent(self.persistent)
        self.sdk_server.handlers.update(naming_handlers(self.naming, self.persistent, self.fuzzy))
        mapper = self.distro.mapper if self.distro is not None else None
        self.health_checker = PersistentHealthChecker(
            self.persistent, mapper.responsible if mapper is not None else (lambda _name: True),
            self.clock.monotonic_ms,
            CheckSettings(config.health_check_interval_ms, config.health_check_jitter_ms,
                          config.health_check_timeout_ms, config.health_check_times, config.health_check_concurrency),
            self.metrics.health_checked)
        self.periodics.append(Periodic("persistent-health-check", min(200, config.health_check_interval_ms),
                                       self.health_checker.tick))
        self.heartbeats = HeartbeatChecker(config, self.clock, self.clients, self.services, self.naming.beats,
                                           self.responsibility)
        self.periodics.append(Periodic("beat-check", config.beat_check_interval_ms, self.heartbeats.tick))
        # Naming switches (issue 14): one CP document every node watches; a change rebinds the
        # live settings its consumers read each tick.
        self.meta_view = json_view(self.cp.store, Keyspace.META)
        self.switches = Switches(config, self.meta_view)
        self.switches.subscribe(self._apply_switches)
        operator = OperatorRoutes(self.naming, self.persistent, self.switches, self.http.forwarder)
        operator.register(self.http.add_route, ADMIN)
        # Arrow snapshots: the change-event log is always kept; periodic export when configured.
        self.changelog = ChangeLog(self.bus, self.clock, self.clients, config.event_log_capacity)
        self.exporter = NodeExporter(self.address, self.clock, self.clients, self.services, self.index,
                                     self.storage, self.changelog, self._owner_of, self.naming.beats.last_beat_ms)
        if config.export_dir:
            self.periodics.append(Periodic("arrow-export", config.export_interval_ms, self._export_periodically))
        export_routes = ExportRoutes(self.exporter, Path(config.data_dir) / "export-scratch")
        self.http.add_route("GET", "/nacos/v1/shoal/export", export_routes.export, Api.CORE, ADMIN)
        # The console's cluster page: every member's Distro figures as this node sees them.
        cluster_figures = ClusterFiguresRoutes(config, self.distro, self.clients)
        self.http.add_route("GET", "/nacos/v1/console/cluster/distro", cluster_figures.distro_figures, Api.V1, ADMIN)
        # Connection rebalancing: the Nacos loader API, and the automatic round when enabled.
        self.loader_peers = HttpLoaderPeers(config, self.tls.http) if self.members is not None else None
        self.loader = ServerLoader(config, self.sdk_connections, self.sdk_server, self.address, self._member_addresses,
                                   self.loader_peers, self.is_serving, self.clock.monotonic_ms,
                                   on_move=self.naming.moved.mark, kept=lambda: len(self.naming.moved.kept))
        loader_routes = LoaderRoutes(self.loader, self.sdk_connections)
        loader_routes.install(self.http, Api.CORE, ADMIN)
        if config.rebalance_grace_ms > 0:  # moved clients kept listed until they are back (beyond Nacos)
            self.periodics.append(Periodic("moved-client-grace", min(500, config.rebalance_grace_ms),
                                           self._release_moved))
        # The Nacos 3.x surface (docs/protocol.md §5.7): route tables over the same handlers.
        v3_core = V3CoreRoutes(self.namespaces, loader_routes, self.http.server_state, self.http.cluster_nodes_v2,
                               self._self_member, self.readiness_problem)
        install(self.http.add_route, v3_core.routes(ADMIN))
        if self.http.naming_routes is not None:
            auth_routes = AuthRoutes(self.auth) if self.auth is not None else None
            install(self.http.add_route, V3Routes(self.http.naming_routes, auth_routes).routes(ADMIN, IDENTITY))
            v3_naming = V3NamingRoutes(self.http.naming_routes, operator, self._responsible_server)
            install(self.http.add_route, v3_naming.routes(ADMIN))
            # The 3.x console and the last 2.x Open API rows (issue 24; docs/protocol.md §5.7).
            node_views = NodeViews(self.http.server_state, self._member_jsons, self.readiness_problem)
            install(self.http.add_route, V3ConsoleRoutes(self.http.naming_routes, v3_naming, self.namespaces,
                                                         node_views).routes(ADMIN, IDENTITY))
            install(self.http.add_route, OpenApiRows(self.naming, self.http.naming_routes, operator, self._self_member,
                                                     self._responsible_server, self.metrics.push_state,
                                                     self.readiness_problem, self._member_jsons).routes(ADMIN))
        install(self.http.add_route, disabled_modules.routes())  # config and AI: 501 / 40001
        if config.rebalance_enabled:
            self.periodics.append(Periodic("rebalance", config.rebalance_interval_ms, self.loader.rebalance_tick))
        self._serving = False
        self._started = False
        self._cp_started = False
        self.metrics.add_sizes(self._sizes)
        watch_node(self.metrics, self)

    # --- status -------------------------------------------------------------------------
    def is_serving(self) -> bool:
        return self._serving

    def readiness_problem(self) -> str | None:
        if self._serving:
            return None
        if self.distro is not None and not self.distro.loaded and self._started:
            return "node is loading a snapshot from its peers"
        if self._started and not (self.instance_view.ready and self.service_view.ready):
            return "node is reading its CP store"
        return "node is starting"

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Open the listeners (answering 300 until ready), start the loops, then serve."""
        await run_blocking(self.limits.reload_if_changed)  # limits hold from the first connection
        await self.cp.start()  # the store (and, managed, this node's etcd member) before any listener
        self._cp_started = True
        self.namespace_view.start()
        self.instance_view.start()
        self.service_view.start()
        self.meta_view.start()
        await self.auth.start(self.cp.store, wait_s=0)  # users and the cluster's token key, from the CP store
        cp_ready = asyncio.get_running_loop().create_task(self._wait_cp_ready(), name="cp-ready")
        await self.http.start()
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
        log.info("node serving: HTTP %d, gRPC SDK %d", self.config.port, self.config.grpc_port)

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
        await self.fuzzy_notifier.stop()
        if self.loader_peers is not None:
            await self.loader_peers.stop()
        await self.http.stop()
        await self.namespace_view.stop()
        await self.instance_view.stop()
        await self.service_view.stop()
        await self.meta_view.stop()
        await self.auth.stop()
        if self._cp_started:
            await self.cp.stop()
        log.info("node stopped")

    async def _wait_cp_ready(self) -> None:
        """Readiness waits for the CP views' first full read (namespaces, persistent instances,
        service metadata, switches) and the auth data and token key, all within one load-timeout bound: a
        node whose store has no quorum yet serves AP traffic meanwhile, and its views fill later."""
        timeout_s = self.config.load_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await self.namespace_view.wait_ready()
                await self.instance_view.wait_ready()
                await self.service_view.wait_ready()
                await self.meta_view.wait_ready()  # the cluster's switches are in force before serving
                await self.auth.wait_ready()
        except TimeoutError:
            log.warning("CP store (%s) not readable after %.1f s: serving AP traffic; persistent instances, "
                        "service metadata, namespaces, users and tokens follow once it is", self.cp.mode, timeout_s)

    # --- glue ---------------------------------------------------------------------------
    def _apply_switches(self, effective: Config) -> None:
        """Hand the switches' effective settings to the consumers that read them each tick."""
        self.naming.config = effective  # clientBeatInterval answered to beats, cacheMillis
        self.push.config = effective  # pushEnabled
        self.heartbeats.config = effective  # healthCheckEnabled
        self.health_checker.settings = dataclasses.replace(self.health_checker.settings,
                                                           check_times=effective.health_check_times)

    @functools.cached_property
    def address(self) -> str:
        """This node's ip:port as peers and snapshots name it (resolved once, at construction)."""
        if self.members is not None:
            return self.members.self_address
        host = self.config.self_address or self.config.host
        if host in ("", "0.0.0.0", "::"):
            try:
                host = socket.gethostbyname(socket.gethostname())
            except OSError:
                host = "127.0.0.1"
        return f"{host}:{self.config.port}"

    def _self_member(self) -> dict[str, Any]:
        """This node's Member JSON (v3 ``cluster/node/self``)."""
        if self.members is not None:
            return self.members.self_member.to_nacos()
        return self_member_json(self.config)

    def _member_jsons(self) -> list[dict[str, Any]]:
        """Every member's Member JSON (this node's alone when standalone)."""
        return self.http.members.members() if self.http.members is not None else [self._self_member()]

    def _responsible_server(self, tag: str) -> str:
        """The member responsible for an ``ip:port`` (v3 ``client/distro``)."""
        return self.http.forwarder.owner_of(tag) or self.address

    def _member_addresses(self) -> list[str]:
        return [m.address for m in self.members.all_members()] if self.members is not None else [self.address]

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
        return self.naming.push_payload(service, subscriber.clusters)

    async def _clean_services(self) -> None:
        self.naming.clean_empty_services()

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
