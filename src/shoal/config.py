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
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from shoal.errors import ConfigError

log = logging.getLogger(__name__)

#: A constraint on one setting: returns what is wrong with ``value`` ("must be positive"), or None.
Check = Callable[[Any], str | None]


def positive(value: Any) -> str | None:
    """Constraint: a number above zero."""
    return None if value > 0 else "must be positive"


def non_negative(value: Any) -> str | None:
    """Constraint: zero or more."""
    return None if value >= 0 else "must not be negative"


def port_number(value: Any) -> str | None:
    """Constraint: a TCP port (1..65535)."""
    return None if 0 < value < 65536 else "is not a usable port"


def one_of(*choices: str) -> Check:
    """Constraint: one of ``choices``, compared case-insensitively."""

    def check(value: Any) -> str | None:
        return None if str(value).lower() in choices else f"must be one of {'/'.join(choices)}"

    return check


def port_offset(value: Any) -> str | None:
    """Constraint: a distance between two ports (-65535..65535)."""
    return None if -65536 < value < 65536 else "is not a usable port offset"


def host_port_or_empty(value: Any) -> str | None:
    """Constraint: empty, or ``ip:port``."""
    return None if not value or ":" in str(value) else "must be ip:port"


def _setting(default: Any, prop: str, doc: str, check: Check | None = None) -> Any:
    """A setting: its default, property name, one-line doc and (optionally) its constraint.

    :meth:`Config.validate` applies every field's ``check``; a new field is validated by
    declaring its constraint here, next to it, and nowhere else.
    """
    return field(default=default, metadata={"prop": prop, "doc": doc, "check": check})


def check_fields(obj: Any) -> None:
    """Raise ConfigError naming the first field of dataclass ``obj`` whose constraint fails."""
    for f in dataclasses.fields(obj):
        check: Check | None = f.metadata.get("check")
        if check is None:
            continue
        value = getattr(obj, f.name)
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"{f.metadata.get('prop', f.name)} {problem}, got {value!r}")


@dataclass(frozen=True)
class Config:
    """Settings of one Shoal node: frozen, typed, one field per setting.

    Build with :meth:`load` (defaults < properties file < ``SHOAL_<FIELD>`` environment <
    overrides) and check with :meth:`validate`. Each field is declared with :func:`_setting`,
    which carries its property name, its ``--help`` line and its constraint (``check=``);
    ``validate()`` is derived from those declarations. Fault-injection switches for tests are
    not settings: see :class:`TestHooks`.
    """

    # --- node and transport -------------------------------------------------------------
    host: str = _setting("0.0.0.0", "server.address", "Address every listener binds to.")
    port: int = _setting(
        8848, "server.port", "Main (HTTP) port; gRPC SDK port = port + grpc offset.", check=port_number
    )
    grpc_port_offset: int = _setting(
        1000, "nacos.server.grpc.port.offset", "Offset of the SDK gRPC port from the main port."
    )
    data_dir: str = _setting("./.data", "nacos.home", "Directory for rule files, keys and exports.")
    log_level: str = _setting(
        "info", "shoal.log.level", "Log level: debug, info, warning, error.",
        check=one_of("debug", "info", "warning", "error", "critical"),
    )
    max_inbound_message_size: int = _setting(
        10 * 1024 * 1024,
        "nacos.remote.server.grpc.sdk.max-inbound-message-size",
        "Largest gRPC message accepted from a client, in bytes.",
        check=positive,
    )
    grpc_permit_keepalive_ms: int = _setting(
        10_000,
        "nacos.remote.server.grpc.sdk.permit-keep-alive-time",
        "Shortest client keepalive-ping interval tolerated (SDKs ping every 60 s).",
        check=positive,
    )
    shutdown_grace_ms: int = _setting(
        3000, "shoal.shutdown.grace-ms", "Time given to in-flight calls on SIGTERM before they are cut.",
        check=non_negative,
    )
    startup_delay_ms: int = _setting(
        0,
        "shoal.startup.delay-ms",
        "Extra time the node answers 300 (starting) before it serves; for tests of client retry.",
        check=non_negative,
    )

    # --- connections and keep-alive (RuntimeConnectionEjector constants) -----------------
    connection_check_interval_ms: int = _setting(
        3000, "nacos.remote.server.connection.check-interval-ms", "Keep-alive scan period.",
        check=positive,
    )
    connection_keep_alive_ms: int = _setting(
        20_000,
        "nacos.remote.server.connection.keep-alive-ms",
        "Idle time after which a connection is probed with ClientDetectionRequest.",
        check=positive,
    )
    client_detection_timeout_ms: int = _setting(
        1000,
        "nacos.remote.server.connection.detection-timeout-ms",
        "How long a probed connection has to answer before it is unregistered.",
        check=positive,
    )
    connection_setup_timeout_ms: int = _setting(
        20_000,
        "shoal.connection.setup-timeout-ms",
        "A transport that did ServerCheck but never set up its stream is forgotten after this.",
        check=positive,
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
        check=host_port_or_empty,
    )
    push_backlog_per_connection: int = _setting(
        1024,
        "shoal.remote.server.connection.max-pending-requests",
        "Server requests in flight on one connection before new pushes wait (bounded backlog).",
        check=positive,
    )

    # --- naming --------------------------------------------------------------------------
    push_task_delay_ms: int = _setting(
        10,
        "nacos.naming.push.pushTaskDelay",
        "Coalescing window for pushes of one service (Nacos: 500 ms; ours is far lower).",
        check=non_negative,
    )
    push_task_timeout_ms: int = _setting(
        5000, "nacos.naming.push.pushTaskTimeout", "Time a subscriber has to acknowledge a push.",
        check=positive,
    )
    push_task_retry_delay_ms: int = _setting(
        1000, "nacos.naming.push.pushTaskRetryDelay", "Delay before a failed push is retried.",
        check=non_negative,
    )
    push_max_retries: int = _setting(
        3, "shoal.naming.push.max-retries", "Retries of a failed push to one subscriber before giving up.",
        check=non_negative,
    )
    push_enabled: bool = _setting(True, "nacos.naming.push.enabled", "Push service changes to subscribers.")
    push_cache_millis: int = _setting(
        10_000, "nacos.naming.push.defaultPushCacheMillis", "cacheMillis stamped on pushed ServiceInfo.",
        check=non_negative,
    )
    param_check_enabled: bool = _setting(
        True, "nacos.core.param.check.enabled", "Apply Nacos's request parameter checker."
    )
    metadata_max_length: int = _setting(
        1024,
        "nacos.naming.service.metadata.length",
        "Largest total length of an instance's metadata keys and values.",
        check=positive,
    )
    empty_service_clean_interval_ms: int = _setting(
        60_000, "nacos.naming.clean.empty-service.interval", "Period of the empty-service cleaner.",
        check=positive,
    )
    empty_service_expired_ms: int = _setting(
        60_000,
        "nacos.naming.clean.empty-service.expired-time",
        "An empty service is removed after this long without publishers.",
        check=non_negative,
    )
    client_expired_time_ms: int = _setting(
        180_000,
        "nacos.naming.client.expired.time",
        "A synced or idle ip:port client expires after this long without renewal.",
        check=positive,
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
        check=positive,
    )
    beat_check_interval_ms: int = _setting(
        5000, "shoal.naming.beat-check-interval-ms", "Period of the heartbeat checker (ClientBeatCheckTaskV2).",
        check=positive,
    )
    http_forward_timeout_ms: int = _setting(
        5000, "shoal.http.forward-timeout-ms", "Timeout of an HTTP write forwarded to the responsible node.",
        check=positive,
    )

    # --- auth (Nacos default auth plugin) -------------------------------------------------
    auth_enabled: bool = _setting(False, "nacos.core.auth.enabled", "Require a token on the naming APIs.")
    auth_token_expire_s: int = _setting(
        18000, "nacos.core.auth.plugin.nacos.token.expire.seconds", "Lifetime of an access token.",
        check=positive,
    )
    auth_token_secret_key: str = _setting(
        "", "nacos.core.auth.plugin.nacos.token.secret.key",
        "Base64 HS256 key (>= 32 bytes); empty = generated once into <data_dir>/auth/token.secret.key.",
    )
    auth_login_max_failures: int = _setting(
        5, "shoal.auth.login.max-failures", "Failed logins from one source ip before it is refused for a while.",
        check=positive,
    )
    auth_login_failure_window_ms: int = _setting(
        60_000, "shoal.auth.login.failure-window-ms", "Window in which failed logins are counted (and refused).",
        check=positive,
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
        check=non_negative,
    )
    sync_timeout_ms: int = _setting(
        3000, "nacos.core.protocol.distro.data.sync.timeoutMs", "Timeout of one sync request to a peer.",
        check=positive,
    )
    sync_retry_delay_ms: int = _setting(
        3000, "nacos.core.protocol.distro.data.sync.retryDelayMs",
        "Longest back-off between retries of a failed sync (it starts at 100 ms and doubles).",
        check=positive,
    )
    sync_batch_max: int = _setting(
        500, "shoal.distro.sync.batch-max", "Most clients carried by one sync request.",
        check=positive,
    )
    sync_queue_max: int = _setting(
        100_000, "shoal.distro.sync.queue-max",
        "Pending client keys per peer before the queue collapses to 'needs full verify'.",
        check=positive,
    )
    verify_interval_ms: int = _setting(
        5000, "nacos.core.protocol.distro.data.verify.intervalMs", "Period of the revision verify round.",
        check=positive,
    )
    verify_timeout_ms: int = _setting(
        3000, "nacos.core.protocol.distro.data.verify.timeoutMs", "Timeout of one verify request.",
        check=positive,
    )
    load_retry_delay_ms: int = _setting(
        1000, "nacos.core.protocol.distro.data.load.retryDelayMs",
        "Pause before the snapshot load tries the peers again (Nacos: 30000 ms).",
        check=positive,
    )
    load_timeout_ms: int = _setting(
        30_000, "nacos.core.protocol.distro.data.load.timeoutMs",
        "A starting node serves after this long even if no peer gave it a snapshot.",
        check=positive,
    )
    snapshot_chunk_bytes: int = _setting(
        4 * 1024 * 1024, "shoal.distro.snapshot.chunk-bytes", "Size of one snapshot page (below the message cap).",
        check=positive,
    )
    member_report_interval_ms: int = _setting(
        2000, "shoal.member.report-interval-ms", "How often a node reports itself to every peer.",
        check=positive,
    )
    member_fail_access_cnt: int = _setting(
        3, "nacos.core.member.fail-access-cnt", "Failed reports after which a SUSPICIOUS peer is DOWN.",
        check=positive,
    )
    cluster_identity_key: str = _setting(
        "", "nacos.core.auth.server.identity.key", "Header name peers prove the shared cluster identity with."
    )
    cluster_identity_value: str = _setting(
        "", "nacos.core.auth.server.identity.value", "Header value of the shared cluster identity."
    )

    # --- Arrow snapshots ----------------------------------------------------------------
    export_dir: str = _setting(
        "", "shoal.export.dir", "Write periodic Arrow snapshots here (empty = no periodic export)."
    )
    export_interval_ms: int = _setting(
        60_000, "shoal.export.interval-ms", "Period of the Arrow snapshot export to the export dir.",
        check=positive,
    )
    export_keep: int = _setting(
        10, "shoal.export.keep", "Snapshots kept in the export dir (oldest removed).", check=positive
    )
    event_log_capacity: int = _setting(
        100_000, "shoal.export.event-log-capacity", "Change events kept in memory for the events table.",
        check=positive,
    )

    # --- Distro and membership timings ---------------------------------------------------------
    member_report_timeout_ms: int = _setting(
        3000, "shoal.member.report-timeout-ms", "Timeout of one member report to a peer.", check=positive
    )
    cluster_conf_reload_interval_ms: int = _setting(
        5000, "shoal.member.conf-reload-interval-ms", "How often cluster.conf is checked for changes.", check=positive
    )
    client_expire_check_interval_ms: int = _setting(
        5000, "shoal.distro.expire-check-interval-ms",
        "How often synced clients unrenewed for nacos.naming.client.expired.time are removed.",
        check=positive,
    )
    snapshot_session_ttl_ms: int = _setting(
        60_000, "shoal.distro.snapshot.session-ttl-ms",
        "A paged snapshot session is dropped after this long without a page request.",
        check=positive,
    )
    sync_initial_backoff_ms: int = _setting(
        100, "shoal.distro.sync.initial-backoff-ms",
        "First back-off after a failed sync batch; it doubles up to ...sync.retryDelayMs.",
        check=positive,
    )

    # --- gRPC transports (native over libnghttp2, or grpc.aio) -----------------------------
    remote_transport: str = _setting(
        "", "shoal.remote.transport",
        "gRPC server transport of both gRPC ports: native (libnghttp2) or grpcio; empty = native when built.",
        check=one_of("", "native", "grpcio"),
    )
    cluster_max_inbound_message_size: int = _setting(
        64 * 1024 * 1024, "nacos.remote.server.grpc.cluster.max-inbound-message-size",
        "Largest gRPC message accepted from a peer on the cluster port, in bytes.",
        check=positive,
    )
    outbound_queue_bytes: int = _setting(
        4 * 1024 * 1024, "shoal.remote.outbound-queue-bytes",
        "Unsent bytes queued to one connection's stream before the connection is closed.",
        check=positive,
    )
    write_stall_timeout_ms: int = _setting(
        30_000, "shoal.remote.write-stall-timeout-ms",
        "A connection whose peer reads nothing of its queued output for this long is closed.",
        check=positive,
    )

    # --- CP store (modes and their combinations are checked by shoal.cp.factory) ----------
    cp_mode: str = _setting(
        "", "shoal.cp.mode",
        "CP store: embedded (SQLite in the data dir), etcd (--cp-endpoints) or managed-etcd (one etcd "
        "member per node on port - 1000); empty = embedded standalone, etcd with endpoints, else managed-etcd.",
        check=one_of("", "embedded", "etcd", "managed-etcd"),
    )
    cp_endpoints: str = _setting("", "shoal.cp.endpoints", "etcd client endpoints host:port,... (mode etcd).")
    cp_tls_ca: str = _setting("", "shoal.cp.tls.ca", "CA file to verify etcd's TLS certificate (https).")
    cp_tls_cert: str = _setting("", "shoal.cp.tls.cert", "Client certificate file for etcd TLS.")
    cp_tls_key: str = _setting("", "shoal.cp.tls.key", "Client key file for etcd TLS.")
    cp_user: str = _setting("", "shoal.cp.auth.user", "etcd user (auth enabled in etcd); empty = no auth.")
    cp_password: str = _setting("", "shoal.cp.auth.password", "Password of shoal.cp.auth.user.")
    cp_etcd_binary: str = _setting("/usr/bin/etcd", "shoal.cp.etcd-binary", "etcd binary run in managed-etcd mode.")
    cp_request_timeout_ms: int = _setting(
        5000, "shoal.cp.request-timeout-ms", "Bound of one CP store call; past it a write fails as unavailable.",
        check=positive,
    )
    cp_client_port_offset: int = _setting(
        -1000, "shoal.cp.client-port-offset", "Managed etcd client port offset from the main port.",
        check=port_offset,
    )
    cp_peer_port_offset: int = _setting(
        -999, "shoal.cp.peer-port-offset", "Managed etcd peer port offset from the main port.",
        check=port_offset,
    )
    cp_history_revisions: int = _setting(
        100_000, "shoal.cp.history-revisions", "Revisions of history kept for watch resume (older compacted).",
        check=positive,
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
        """Raise ConfigError naming the first bad setting; return self for chaining.

        Every field's own constraint (``check=`` in its declaration) is applied first; what
        follows here are the rules that involve more than one field.
        """
        check_fields(self)
        if bool(self.cluster_identity_key) != bool(self.cluster_identity_value):
            raise ConfigError("nacos.core.auth.server.identity.key and .value must be set together")
        if self.auth_enabled and (self.members or self.cluster_conf) and not self.cluster_identity_key:
            raise ConfigError("with auth on, cluster members must prove a shared identity: set "
                              "nacos.core.auth.server.identity.key and .value on every node")
        if not 0 < self.grpc_port < 65536 or not 0 < self.cluster_port < 65536:
            raise ConfigError(f"server.port {self.port} (+{self.grpc_port_offset}) is not a usable port")
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


@dataclass(frozen=True)
class TestHooks:
    """Fault injection for the real-process tests; deliberately not part of :class:`Config`.

    Read only from the ``SHOAL_TEST_HOOKS`` environment variable (a JSON object with the field
    names as keys), never from flags, files or ``-D``, and not shown in ``--help``; a node with
    any hook active says so at WARNING when it starts.
    """

    __test__: ClassVar[bool] = False  # not a pytest test class, whatever its name says
    ENV: ClassVar[str] = "SHOAL_TEST_HOOKS"

    forward_all_to: str = field(default="", metadata={
        "prop": "SHOAL_TEST_HOOKS.forward_all_to", "check": host_port_or_empty,
        "doc": "treat the node at this ip:port as responsible for every ip:port (HTTP forwarding)"})
    drop_incoming_sync: int = field(default=0, metadata={
        "prop": "SHOAL_TEST_HOOKS.drop_incoming_sync", "check": non_negative,
        "doc": "silently drop this many incoming Distro sync batches"})

    @property
    def active(self) -> bool:
        """Whether any hook changes the node's behaviour."""
        return self != TestHooks()

    def to_env(self) -> dict[str, str]:
        """The environment entry that makes a started node read these hooks."""
        return {self.ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TestHooks:
        """Parse ``SHOAL_TEST_HOOKS``; no variable means no hooks. Raises ConfigError when malformed."""
        env = os.environ if env is None else env
        text = env.get(cls.ENV, "").strip()
        if not text:
            return cls()
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{cls.ENV} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{cls.ENV} must be a JSON object")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            f = known.get(key)
            if f is None:
                raise ConfigError(f"{cls.ENV}: unknown hook {key!r} (known: {', '.join(known)})")
            expected = int if f.type in ("int", int) else str
            if type(value) is not expected:
                raise ConfigError(f"{cls.ENV}: {key} must be a JSON {expected.__name__}, got {value!r}")
            values[key] = value
        hooks = cls(**values)
        check_fields(hooks)
        return hooks


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
