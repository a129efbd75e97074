"""One typed, frozen configuration object, loaded from file + environment + flags.

Every setting has a property name; where Nacos has one we use it verbatim so operators can
carry settings over (``nacos.naming.push.pushTaskDelay``...). Precedence, lowest first:
defaults (Nacos's, except where a field says otherwise) < properties file (``--config``,
``key=value`` lines as in Nacos's application.properties) < environment (``SHOAL_<FIELD>``,
e.g. ``SHOAL_PUSH_TASK_DELAY_MS``) < command-line flags (``-D property=value`` and the
dedicated flags such as ``--port``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.errors import ConfigError


def _setting(default: Any, prop: str, doc: str) -> Any:
    return field(default=default, metadata={"prop": prop, "doc": doc})


@dataclass(frozen=True)
class Config:
    """Settings of one Shoal node. Build with :meth:`load`; check with :meth:`validate`."""

    # --- node and transport -------------------------------------------------------------
    host: str = _setting("0.0.0.0", "server.address", "Address every listener binds to.")
    port: int = _setting(8848, "server.port", "Main (HTTP) port; gRPC SDK port = port + grpc offset.")
    grpc_port_offset: int = _setting(
        1000, "nacos.server.grpc.port.offset", "Offset of the SDK gRPC port from the main port."
    )
    data_dir: str = _setting("./.data", "nacos.home", "Directory for rule files, keys and exports.")
    log_level: str = _setting("info", "shoal.log.level", "Log level: debug, info, warning, error.")
    max_inbound_message_size: int = _setting(
        10 * 1024 * 1024,
        "nacos.remote.server.grpc.sdk.max-inbound-message-size",
        "Largest gRPC message accepted from a client, in bytes.",
    )
    grpc_permit_keepalive_ms: int = _setting(
        10_000,
        "nacos.remote.server.grpc.sdk.permit-keep-alive-time",
        "Shortest client keepalive-ping interval tolerated (SDKs ping every 60 s).",
    )
    shutdown_grace_ms: int = _setting(
        3000, "shoal.shutdown.grace-ms", "Time given to in-flight calls on SIGTERM before they are cut."
    )
    startup_delay_ms: int = _setting(
        0,
        "shoal.startup.delay-ms",
        "Extra time the node answers 300 (starting) before it serves; for tests of client retry.",
    )

    # --- connections and keep-alive (RuntimeConnectionEjector constants) -----------------
    connection_check_interval_ms: int = _setting(
        3000, "nacos.remote.server.connection.check-interval-ms", "Keep-alive scan period."
    )
    connection_keep_alive_ms: int = _setting(
        20_000,
        "nacos.remote.server.connection.keep-alive-ms",
        "Idle time after which a connection is probed with ClientDetectionRequest.",
    )
    client_detection_timeout_ms: int = _setting(
        1000,
        "nacos.remote.server.connection.detection-timeout-ms",
        "How long a probed connection has to answer before it is unregistered.",
    )
    connection_setup_timeout_ms: int = _setting(
        20_000,
        "shoal.connection.setup-timeout-ms",
        "A transport that did ServerCheck but never set up its stream is forgotten after this.",
    )
    connection_limit_rule_file: str = _setting(
        "",
        "nacos.remote.server.connection.limit-rule-file",
        "JSON connection-limit rule file (default <data_dir>/loader/limitRule); reloaded on change.",
    )
    connection_redirect_address: str = _setting(
        "",
        "nacos.remote.server.connection.redirect-address",
        "ip:port sent in ConnectResetRequest to connections expelled by the limit rules.",
    )
    push_backlog_per_connection: int = _setting(
        1024,
        "shoal.remote.server.connection.max-pending-requests",
        "Server requests in flight on one connection before new pushes wait (bounded backlog).",
    )

    # --- naming --------------------------------------------------------------------------
    push_task_delay_ms: int = _setting(
        10,
        "nacos.naming.push.pushTaskDelay",
        "Coalescing window for pushes of one service (Nacos: 500 ms; ours is far lower).",
    )
    push_task_timeout_ms: int = _setting(
        5000, "nacos.naming.push.pushTaskTimeout", "Time a subscriber has to acknowledge a push."
    )
    push_task_retry_delay_ms: int = _setting(
        1000, "nacos.naming.push.pushTaskRetryDelay", "Delay before a failed push is retried."
    )
    push_max_retries: int = _setting(
        3, "shoal.naming.push.max-retries", "Retries of a failed push to one subscriber before giving up."
    )
    push_enabled: bool = _setting(True, "nacos.naming.push.enabled", "Push service changes to subscribers.")
    push_cache_millis: int = _setting(
        10_000, "nacos.naming.push.defaultPushCacheMillis", "cacheMillis stamped on pushed ServiceInfo."
    )
    param_check_enabled: bool = _setting(
        True, "nacos.core.param.check.enabled", "Apply Nacos's request parameter checker."
    )
    metadata_max_length: int = _setting(
        1024,
        "nacos.naming.service.metadata.length",
        "Largest total length of an instance's metadata keys and values.",
    )
    empty_service_clean_interval_ms: int = _setting(
        60_000, "nacos.naming.clean.empty-service.interval", "Period of the empty-service cleaner."
    )
    empty_service_expired_ms: int = _setting(
        60_000,
        "nacos.naming.clean.empty-service.expired-time",
        "An empty service is removed after this long without publishers.",
    )
    client_expired_time_ms: int = _setting(
        180_000,
        "nacos.naming.client.expired.time",
        "A synced or idle ip:port client expires after this long without renewal.",
    )

    # --- heartbeats of ip:port clients (HTTP Open API, 1.x SDKs) -------------------------
    expire_instance: bool = _setting(
        True, "nacos.naming.expireInstance", "Remove ip:port instances whose beats stopped (ip delete timeout)."
    )
    health_check_enabled: bool = _setting(
        True, "shoal.naming.health-check-enabled", "SwitchDomain.healthCheckEnabled: run the beat checker at all."
    )
    client_beat_interval_ms: int = _setting(
        5000, "shoal.naming.client-beat-interval-ms",
        "SwitchDomain.clientBeatInterval: beat period told to clients without a per-instance value.",
    )
    beat_check_interval_ms: int = _setting(
        5000, "shoal.naming.beat-check-interval-ms", "Period of the heartbeat checker (ClientBeatCheckTaskV2)."
    )
    http_forward_timeout_ms: int = _setting(
        5000, "shoal.http.forward-timeout-ms", "Timeout of an HTTP write forwarded to the responsible node."
    )
    test_forward_all_to: str = _setting(
        "", "shoal.test.forward-all-to", "TEST HOOK: treat the node at this ip:port as responsible for every ip:port."
    )

    # --- auth (Nacos default auth plugin) -------------------------------------------------
    auth_enabled: bool = _setting(False, "nacos.core.auth.enabled", "Require a token on the naming APIs.")
    auth_token_expire_s: int = _setting(
        18000, "nacos.core.auth.plugin.nacos.token.expire.seconds", "Lifetime of an access token."
    )
    auth_token_secret_key: str = _setting(
        "", "nacos.core.auth.plugin.nacos.token.secret.key",
        "Base64 HS256 key (>= 32 bytes); empty = generated once into <data_dir>/auth/token.secret.key.",
    )
    auth_login_max_failures: int = _setting(
        5, "shoal.auth.login.max-failures", "Failed logins from one source ip before it is refused for a while."
    )
    auth_login_failure_window_ms: int = _setting(
        60_000, "shoal.auth.login.failure-window-ms", "Window in which failed logins are counted (and refused)."
    )

    # --- Distro cluster ----------------------------------------------------------------
    members: str = _setting(
        "", "nacos.member.list", "Cluster members as ip:port,ip:port (main ports); empty = standalone."
    )
    cluster_conf: str = _setting(
        "", "nacos.cluster.conf", "Nacos cluster.conf file (one ip[:port] per line); reloaded on change."
    )
    self_address: str = _setting(
        "", "nacos.inetutils.ip-address", "This node's ip as peers know it (default: detected from the list)."
    )
    cluster_port_offset: int = _setting(
        1001, "nacos.server.grpc.cluster.port.offset", "Offset of the cluster gRPC port from the main port."
    )
    sync_delay_ms: int = _setting(
        10, "nacos.core.protocol.distro.data.sync.delayMs",
        "Delay that merges changes of one client before they are synced (Nacos: 1000 ms).",
    )
    sync_timeout_ms: int = _setting(
        3000, "nacos.core.protocol.distro.data.sync.timeoutMs", "Timeout of one sync request to a peer."
    )
    sync_retry_delay_ms: int = _setting(
        3000, "nacos.core.protocol.distro.data.sync.retryDelayMs",
        "Longest back-off between retries of a failed sync (it starts at 100 ms and doubles).",
    )
    sync_batch_max: int = _setting(
        500, "shoal.distro.sync.batch-max", "Most clients carried by one sync request."
    )
    sync_queue_max: int = _setting(
        100_000, "shoal.distro.sync.queue-max",
        "Pending client keys per peer before the queue collapses to 'needs full verify'.",
    )
    verify_interval_ms: int = _setting(
        5000, "nacos.core.protocol.distro.data.verify.intervalMs", "Period of the revision verify round."
    )
    verify_timeout_ms: int = _setting(
        3000, "nacos.core.protocol.distro.data.verify.timeoutMs", "Timeout of one verify request."
    )
    load_retry_delay_ms: int = _setting(
        1000, "nacos.core.protocol.distro.data.load.retryDelayMs",
        "Pause before the snapshot load tries the peers again (Nacos: 30000 ms).",
    )
    load_timeout_ms: int = _setting(
        30_000, "nacos.core.protocol.distro.data.load.timeoutMs",
        "A starting node serves after this long even if no peer gave it a snapshot.",
    )
    snapshot_chunk_bytes: int = _setting(
        4 * 1024 * 1024, "shoal.distro.snapshot.chunk-bytes", "Size of one snapshot page (below the message cap)."
    )
    member_report_interval_ms: int = _setting(
        2000, "shoal.member.report-interval-ms", "How often a node reports itself to every peer."
    )
    member_fail_access_cnt: int = _setting(
        3, "nacos.core.member.fail-access-cnt", "Failed reports after which a SUSPICIOUS peer is DOWN."
    )
    cluster_identity_key: str = _setting(
        "", "nacos.core.auth.server.identity.key", "Header name peers prove the shared cluster identity with."
    )
    cluster_identity_value: str = _setting(
        "", "nacos.core.auth.server.identity.value", "Header value of the shared cluster identity."
    )
    test_drop_sync_count: int = _setting(
        0, "shoal.test.drop-incoming-sync", "TEST HOOK: silently drop this many incoming sync batches."
    )

    # --- Arrow snapshots ----------------------------------------------------------------
    export_dir: str = _setting(
        "", "shoal.export.dir", "Write periodic Arrow snapshots here (empty = no periodic export)."
    )
    export_interval_ms: int = _setting(
        60_000, "shoal.export.interval-ms", "Period of the Arrow snapshot export to the export dir."
    )
    export_keep: int = _setting(10, "shoal.export.keep", "Snapshots kept in the export dir (oldest removed).")
    event_log_capacity: int = _setting(
        100_000, "shoal.export.event-log-capacity", "Change events kept in memory for the events table."
    )

    # --- Distro and membership timings that were constants (one block; task "distro") -------
    member_report_timeout_ms: int = _setting(
        3000, "shoal.member.report-timeout-ms", "Timeout of one member report to a peer."
    )
    cluster_conf_reload_interval_ms: int = _setting(
        5000, "shoal.member.conf-reload-interval-ms", "How often cluster.conf is checked for changes."
    )
    client_expire_check_interval_ms: int = _setting(
        5000, "shoal.distro.expire-check-interval-ms",
        "How often synced clients unrenewed for nacos.naming.client.expired.time are removed.",
    )
    snapshot_session_ttl_ms: int = _setting(
        60_000, "shoal.distro.snapshot.session-ttl-ms",
        "A paged snapshot session is dropped after this long without a page request.",
    )
    sync_initial_backoff_ms: int = _setting(
        100, "shoal.distro.sync.initial-backoff-ms",
        "First back-off after a failed sync batch; it doubles up to ...sync.retryDelayMs.",
    )

    # --- CP store (one block; task "cpstore"; checked by shoal.cp.factory) -----------------
    cp_mode: str = _setting(
        "", "shoal.cp.mode",
        "CP store: embedded (SQLite in the data dir), etcd (--cp-endpoints) or managed-etcd (one etcd "
        "member per node on port - 1000); empty = embedded standalone, etcd with endpoints, else managed-etcd.",
    )
    cp_endpoints: str = _setting("", "shoal.cp.endpoints", "etcd client endpoints host:port,... (mode etcd).")
    cp_tls_ca: str = _setting("", "shoal.cp.tls.ca", "CA file to verify etcd's TLS certificate (https).")
    cp_tls_cert: str = _setting("", "shoal.cp.tls.cert", "Client certificate file for etcd TLS.")
    cp_tls_key: str = _setting("", "shoal.cp.tls.key", "Client key file for etcd TLS.")
    cp_user: str = _setting("", "shoal.cp.auth.user", "etcd user (auth enabled in etcd); empty = no auth.")
    cp_password: str = _setting("", "shoal.cp.auth.password", "Password of shoal.cp.auth.user.")
    cp_etcd_binary: str = _setting("/usr/bin/etcd", "shoal.cp.etcd-binary", "etcd binary run in managed-etcd mode.")
    cp_request_timeout_ms: int = _setting(
        5000, "shoal.cp.request-timeout-ms", "Bound of one CP store call; past it a write fails as unavailable."
    )
    cp_client_port_offset: int = _setting(
        -1000, "shoal.cp.client-port-offset", "Managed etcd client port offset from the main port."
    )
    cp_peer_port_offset: int = _setting(
        -999, "shoal.cp.peer-port-offset", "Managed etcd peer port offset from the main port."
    )
    cp_history_revisions: int = _setting(
        100_000, "shoal.cp.history-revisions", "Revisions of history kept for watch resume (older compacted)."
    )

    # ------------------------------------------------------------------------------------
    @property
    def grpc_port(self) -> int:
        return self.port + self.grpc_port_offset

    @property
    def cluster_port(self) -> int:
        return self.port + self.cluster_port_offset

    @property
    def limit_rule_path(self) -> Path:
        if self.connection_limit_rule_file:
            return Path(self.connection_limit_rule_file)
        return Path(self.data_dir) / "loader" / "limitRule"

    def validate(self) -> Config:
        """Raise ConfigError naming the first bad setting; return self for chaining."""
        if bool(self.cluster_identity_key) != bool(self.cluster_identity_value):
            raise ConfigError("nacos.core.auth.server.identity.key and .value must be set together")
        if self.auth_enabled and (self.members or self.cluster_conf) and not self.cluster_identity_key:
            raise ConfigError("with auth on, cluster members must prove a shared identity: set "
                              "nacos.core.auth.server.identity.key and .value on every node")
        if not 0 < self.port < 65536 or not 0 < self.grpc_port < 65536 or not 0 < self.cluster_port < 65536:
            raise ConfigError(f"server.port {self.port} (+{self.grpc_port_offset}) is not a usable port")
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ConfigError(f"shoal.log.level must be debug/info/warning/error, not {self.log_level!r}")
        positive = (
            "max_inbound_message_size", "connection_check_interval_ms", "connection_keep_alive_ms",
            "client_detection_timeout_ms", "connection_setup_timeout_ms", "push_task_timeout_ms",
            "push_backlog_per_connection", "metadata_max_length", "empty_service_clean_interval_ms",
            "client_expired_time_ms", "grpc_permit_keepalive_ms", "sync_timeout_ms", "sync_retry_delay_ms",
            "sync_batch_max", "sync_queue_max", "verify_interval_ms", "verify_timeout_ms", "load_retry_delay_ms",
            "load_timeout_ms", "snapshot_chunk_bytes", "member_report_interval_ms", "member_fail_access_cnt",
            "export_interval_ms", "export_keep", "event_log_capacity",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{prop_of(name)} must be positive, got {getattr(self, name)}")
        non_negative = (
            "push_task_delay_ms", "push_task_retry_delay_ms", "push_max_retries", "push_cache_millis",
            "empty_service_expired_ms", "shutdown_grace_ms", "startup_delay_ms", "sync_delay_ms",
            "test_drop_sync_count",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{prop_of(name)} must not be negative, got {getattr(self, name)}")
        if self.connection_redirect_address and ":" not in self.connection_redirect_address:
            raise ConfigError("nacos.remote.server.connection.redirect-address must be ip:port")
        for name in ("client_beat_interval_ms", "beat_check_interval_ms", "http_forward_timeout_ms",
                     "auth_token_expire_s", "auth_login_max_failures", "auth_login_failure_window_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{prop_of(name)} must be positive, got {getattr(self, name)}")
        if self.test_forward_all_to and ":" not in self.test_forward_all_to:
            raise ConfigError("shoal.test.forward-all-to must be ip:port")
        for name in ("member_report_timeout_ms", "cluster_conf_reload_interval_ms", "client_expire_check_interval_ms",
                     "snapshot_session_ttl_ms", "sync_initial_backoff_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{prop_of(name)} must be positive, got {getattr(self, name)}")
        return self

    # ------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> Config:
        """Defaults < file < env < overrides (keys: property names or field names)."""
        values: dict[str, Any] = {}
        if file:
            values.update(_convert_all(read_properties(Path(file)), source=str(file)))
        env = os.environ if env is None else env
        env_values = {
            f.name: env[f"SHOAL_{f.name.upper()}"] for f in _fields() if f"SHOAL_{f.name.upper()}" in env
        }
        values.update(_convert_all(env_values, source="environment"))
        values.update(_convert_all(dict(overrides or {}), source="command line"))
        return cls(**values).validate()

    def describe(self) -> Iterator[tuple[str, Any, str]]:
        """(property, value, doc) for every setting: used by --help and the startup log."""
        for f in _fields():
            yield f.metadata["prop"], getattr(self, f.name), f.metadata["doc"]


def _fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(Config)


_BY_PROP = {f.metadata["prop"]: f for f in dataclasses.fields(Config)}
_BY_NAME = {f.name: f for f in dataclasses.fields(Config)}


def prop_of(field_name: str) -> str:
    return str(_BY_NAME[field_name].metadata["prop"])


def read_properties(path: Path) -> dict[str, str]:
    """Parse a Java-style properties file: ``key=value`` or ``key: value``, ``#``/``!`` comments."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {raw!r}")
        out[line[:sep].strip()] = line[sep + 1 :].strip()
    return out


def _convert_all(raw: Mapping[str, str], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, text in raw.items():
        f = _BY_PROP.get(key) or _BY_NAME.get(key)
        if f is None:
            if key.startswith(("nacos.", "server.", "shoal.")):
                # Nacos properties we do not implement are accepted and ignored, so an existing
                # application.properties can be reused; typos in our own names are not.
                if key.startswith("shoal."):
                    raise ConfigError(f"unknown setting {key!r} ({source})")
                continue
            raise ConfigError(f"unknown setting {key!r} ({source})")
        out[f.name] = _convert(f, text, source)
    return out


def _convert(f: dataclasses.Field[Any], text: str, source: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    prop = f.metadata["prop"]
    try:
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text.strip())
        if kind == "float":
            return float(text.strip())
    except ValueError:
        raise ConfigError(f"{prop} ({source}): {text!r} is not a valid {kind}") from None
    return text
