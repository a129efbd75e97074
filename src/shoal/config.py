"""One typed, frozen configuration object, loaded from file + environment + flags.

Every setting has a property name; where Nacos has one we use it verbatim so operators can
carry settings over (``nacos.naming.push.pushTaskDelay``...). Precedence, lowest first:
defaults (Nacos's, except where a field says otherwise) < properties file (``--config``, a
Nacos application.properties in full Java syntax, ``${VAR:default}`` placeholders) < the Nacos
Docker image's environment (``MODE``, ``NACOS_SERVERS``, ...) < environment (``SHOAL_<FIELD>``,
e.g. ``SHOAL_PUSH_TASK_DELAY_MS``) < command-line flags (``-D property=value`` and the
dedicated flags such as ``--port``). Reading and checking the sources is
:mod:`shoal.config_sources`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from shoal.config_sources import (
    PlaceholderResolver,
    Report,
    classify,
    cluster_mode_problem,
    docker_environment,
    read_properties,
    shoal_variables,
)
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


def not_empty(value: Any) -> str | None:
    """Constraint: a non-blank text."""
    return None if str(value).strip() else "must not be empty"


def dns_suffix(value: Any) -> str | None:
    """Constraint: a DNS name of letters, digits, '-' and '.' (the zone the DNS port answers)."""
    labels = str(value).strip(".").split(".")
    if not all(label and len(label) < 64 and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
               for label in labels):
        return "must be a DNS name such as nacos or svc.example"
    return None


#: The most workers ``shoal.server.workers=0`` (auto) starts, whatever the core count: each
#: worker holds a full copy of the registry (measured: 66 MiB idle + ~2.2 KB per instance, about
#: 2.1 GiB per worker at 1M instances) and applies every write of the cluster, so past 4 workers
#: memory keeps growing while only queries gain (docs/workers-model.md, "Memory, and the default
#: worker cap"). More can still be asked for explicitly.
AUTO_WORKERS_CAP = 4
#: Where a container's CPU quota is read (cgroup v2, then v1).
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX, v1: tuple[Path, Path] = CGROUP_V1_QUOTA) -> int:
    """The cores this process may use: the CPUs it may run on (``sched_getaffinity``), fewer when
    its cgroup's CPU quota allows less (a container given ``--cpus 2`` on a 32-core host: 2,
    rounded up), as Go's automaxprocs and the JVM's container support count them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = period = 0
    try:
        fields = cpu_max.read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            quota, period = int(fields[0]), int(fields[1])
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            quota, period = int(v1[0].read_text()), int(v1[1].read_text())
    if quota > 0 and period > 0:
        cores = min(cores, max(1, -(-quota // period)))
    return max(1, cores)


#: The most workers a node may be asked for.
MAX_WORKERS = 256
#: The most samples the console's charts keep (``shoal.console.chart.window-ms`` / ``interval-ms``).
MAX_CHART_SAMPLES = 10_000


def worker_count(value: Any) -> str | None:
    """Constraint: 0 (auto) or 1..MAX_WORKERS worker processes."""
    return None if 0 <= value <= MAX_WORKERS else f"must be 0 (auto) or between 1 and {MAX_WORKERS}"


def _setting(default: Any, prop: str, doc: str, check: Check | None = None) -> Any:
    """A setting: its default, property name, one-line doc and (optionally) its constraint.

    :meth:`Config.validate` applies every field's ``check``; a new field is validated by
    declaring its constraint here, next to it, and nowhere else.
    """
    return field(default=default, metadata={"prop": prop, "doc": doc, "check": check})


def check_fields(obj: Any) -> None:
    """Raise one ConfigError naming every field of dataclass ``obj`` whose constraint fails."""
    problems: list[str] = []
    for f in dataclasses.fields(obj):
        check: Check | None = f.metadata.get("check")
        if check is None:
            continue
        value = getattr(obj, f.name)
        problem = check(value)
        if problem is not None:
            problems.append(f"{f.metadata.get('prop', f.name)} {problem}, got {value!r}")
    if problems:
        raise ConfigError("; ".join(problems))


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
    log_format: str = _setting(
        "text", "shoal.log.format", "Log line format: text, or json (one object per line: ts, level, logger, msg...).",
        check=one_of("text", "json"),
    )
    log_file: str = _setting(
        "", "shoal.log.file", "Write the log to this file (rotated by size) instead of standard error.",
    )
    log_file_max_bytes: int = _setting(
        100 * 1024 * 1024, "shoal.log.file.max-bytes", "Size at which the log file (and the access log) rotates.",
        check=positive,
    )
    log_file_count: int = _setting(
        7, "shoal.log.file.count", "Rotated log files kept besides the current one.", check=positive,
    )
    access_log_enabled: bool = _setting(
        False, "server.tomcat.accesslog.enabled",
        "HTTP access log (method, path, status, duration, remote); Nacos's shipped file turns it on.",
    )
    access_log_file: str = _setting(
        "", "shoal.log.access-file",
        "Access log file (rotated like the log); empty = <data_dir>/logs/access_log.log, '-' = the main log.",
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
    # Default auto: a node uses the cores it may run on (its CPU affinity and its cgroup's CPU quota),
    # at most AUTO_WORKERS_CAP. Workers see each other's writes through Distro and the CP store; an
    # HTTP or CP write waits for its siblings before it is answered (workers_write_wait_ms, docs/workers.md).
    server_workers: int = _setting(
        0, "shoal.server.workers",
        "Worker processes serving this node's ports (SO_REUSEPORT), each on its own core, under one supervisor; "
        f"0 = auto (the default): the cores this process may use (CPU affinity and cgroup quota), at most "
        f"{AUTO_WORKERS_CAP}; 1 = one process, no supervisor.",
        check=worker_count,
    )
    workers_write_wait_ms: int = _setting(
        200, "shoal.server.workers.write-wait-ms",
        "With workers: the longest an HTTP ephemeral write or a CP write waits, before it is answered, for the "
        "node's sibling workers to apply it (read-your-writes on any worker; a gRPC client's writes never wait: it "
        "reads over its own connection); a sibling that fails or passes it catches up later; 0 = answer at once.",
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
    rebalance_enabled: bool = _setting(
        False, "shoal.rebalance.enabled",
        "Move SDK connections from busy members to idle ones when their counts drift apart (beyond Nacos).",
    )
    rebalance_threshold: float = _setting(
        0.1, "shoal.rebalance.threshold",
        "Rebalance when max - min connection count exceeds this fraction of the members' average.",
        check=positive,
    )
    rebalance_rate: int = _setting(
        50, "shoal.rebalance.rate", "Most connections one member moves per rebalancing round.", check=positive,
    )
    rebalance_floor: int = _setting(
        0, "shoal.rebalance.floor", "Rebalancing never leaves a member with fewer SDK connections than this.",
        check=non_negative,
    )
    rebalance_interval_ms: int = _setting(
        5000, "shoal.rebalance.interval-ms",
        "Interval of the automatic rebalancing round (long enough for moved clients to land).",
        check=positive,
    )
    rebalance_grace_ms: int = _setting(
        45000, "shoal.rebalance.grace-ms",
        "How long a client moved by rebalancing (loader API or automatic) keeps its instances listed until it "
        "has re-registered on its new node; longer than nacos-sdk-python's 30 s redo tick. 0 removes them at "
        "once, as Nacos does (beyond Nacos).",
        check=non_negative,
    )
    push_backlog_per_connection: int = _setting(
        1024,
        "shoal.remote.server.connection.max-pending-requests",
        "Server requests in flight on one connection before new pushes wait (bounded backlog).",
        check=positive,
    )

    # --- naming --------------------------------------------------------------------------
    push_task_delay_ms: int = _setting(
        0,
        "nacos.naming.push.pushTaskDelay",
        "Coalescing window for pushes of one service (Nacos: 500 ms; ours is 0: changes before the push "
        "engine runs, and during an unacknowledged push, still merge).",
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
    push_empty_protection: bool = _setting(
        False, "shoal.naming.push.empty-protection",
        "Withhold a push without hosts from a subscriber whose last list had hosts (server-side empty-push "
        "protection; per service: metadata shoal.push.empty-protection=true|false).",
    )
    fuzzy_watch_max_pattern_count: int = _setting(
        20, "nacos.naming.fuzzy.watch.max.pattern.count",
        "Distinct fuzzy-watch patterns this node keeps (a new one beyond it is refused with 50310).",
        check=positive,
    )
    fuzzy_watch_max_match_count: int = _setting(
        500, "nacos.naming.fuzzy.watch.max.pattern.match.service.count",
        "Services one fuzzy-watch pattern tracks (beyond it the watch answers 50311 and stops reporting).",
        check=positive,
    )
    fuzzy_watch_batch_size: int = _setting(
        100, "shoal.naming.fuzzy-watch.sync-batch-size",
        "Service keys per NamingFuzzyWatchSyncRequest of an initial or diff sync.",
        check=positive,
    )
    fuzzy_watch_max_pending: int = _setting(
        10_000, "shoal.naming.fuzzy-watch.max-pending",
        "Fuzzy-watch notifications queued for delivery on this node; beyond it the oldest are dropped.",
        check=positive,
    )
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
    expired_metadata_clean_interval_ms: int = _setting(
        5_000, "nacos.naming.clean.expired-metadata.interval",
        "Period of the cleaner of operators' instance edits whose instance is gone.",
        check=positive,
    )
    expired_metadata_expired_ms: int = _setting(
        60_000,
        "nacos.naming.clean.expired-metadata.expired-time",
        "An operator's edit of an ephemeral instance is removed after its instance has been gone this long "
        "(an instance registered again within it keeps the edit).",
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
    health_check_interval_ms: int = _setting(
        2000, "shoal.health.check-interval-ms",
        "Base period of a persistent instance's server-side check (Nacos checkRtNormalized lower bound).",
        check=positive,
    )
    health_check_jitter_ms: int = _setting(
        5000, "shoal.health.check-jitter-ms",
        "Each check waits interval + random(0, random(0, jitter)) more (Nacos TcpHealthParams.max).",
        check=non_negative,
    )
    health_check_timeout_ms: int = _setting(
        500, "shoal.health.check-timeout-ms", "A TCP/HTTP probe not answered within this fails (Nacos 500 ms).",
        check=positive,
    )
    health_check_times: int = _setting(
        3, "shoal.health.check-times",
        "Consecutive disagreeing results before a persistent instance's health flips (SwitchDomain.checkTimes).",
        check=positive,
    )
    health_check_auto_change: bool = _setting(
        True, "shoal.health.auto-change-enabled",
        "SwitchDomain.autoChangeHealthCheckEnabled: the persistent checker may flip an instance's health.",
    )
    health_check_concurrency: int = _setting(
        64, "shoal.health.check-concurrency", "Probes of persistent instances in flight at once, per node.",
        check=positive,
    )
    beat_check_interval_ms: int = _setting(
        5000, "shoal.naming.beat-check-interval-ms", "Period of the heartbeat checker (ClientBeatCheckTaskV2).",
        check=positive,
    )
    http_forward_timeout_ms: int = _setting(
        300, "shoal.http.forward-timeout-ms",
        "Timeout of an HTTP write forwarded to the responsible node; past it the write is handled here, and so "
        "is every write for that node until it answers again (docs/protocol.md §5.5).",
        check=positive,
    )
    snowflake_worker_id: int = _setting(
        -1, "nacos.core.snowflake.worker-id",
        "Worker id (0..1023) of the snowflake instance-id generator; -1: the low 10 bits of the node's IPv4 "
        "address, as Nacos derives it (docs/protocol.md §3.6). Give each node its own when those collide.",
        check=lambda v: None if -1 <= v <= 1023 else "must be -1 or between 0 and 1023",
    )
    prometheus_sd_enabled: bool = _setting(
        False, "nacos.prometheus.metrics.enabled",
        "Serve Prometheus HTTP service discovery at /nacos/prometheus (Nacos's PrometheusController).",
    )

    # --- auth (Nacos default auth plugin) -------------------------------------------------
    # Nacos 3.x's three switches, each on by default (3.3 turned on the client one too).
    auth_enabled: bool = _setting(
        True, "nacos.core.auth.enabled",
        "Require a login on the client (open) APIs: v1/v2/v3 naming over HTTP and the SDK gRPC port.")
    auth_admin_enabled: bool = _setting(
        True, "nacos.core.auth.admin.enabled",
        "Require a login on the admin APIs: operator and cluster routes, /v3/admin/*, users, roles, permissions.")
    auth_console_enabled: bool = _setting(
        True, "nacos.core.auth.console.enabled",
        "Require a login on the console's APIs (/v1/console, /v3/console, the console's catalog routes).")
    auth_system_type: str = _setting(
        "nacos", "nacos.core.auth.system.type",
        "Where logins are checked: nacos (the CP store's users) or ldap (then the CP store's users).",
        check=one_of("nacos", "ldap"))
    ldap_url: str = _setting("", "nacos.core.auth.ldap.url", "LDAP server URL (ldap://host:port), type ldap.")
    ldap_basedc: str = _setting("", "nacos.core.auth.ldap.basedc", "Base DN users are searched under.")
    ldap_user_dn: str = _setting(
        "", "nacos.core.auth.ldap.userDn", "DN Shoal binds as to search for users; empty = anonymous search.")
    ldap_password: str = _setting("", "nacos.core.auth.ldap.password", "Password of nacos.core.auth.ldap.userDn.")
    ldap_filter_prefix: str = _setting(
        "uid", "nacos.core.auth.ldap.filter.prefix", "Attribute a login name is matched against: (prefix=name).")
    ldap_case_sensitive: bool = _setting(
        True, "nacos.core.auth.ldap.case.sensitive", "false = login names are lower-cased before the lookup.")
    ldap_timeout_ms: int = _setting(
        3000, "nacos.core.auth.ldap.timeout", "Connect and answer timeout towards the LDAP server.",
        check=positive)
    auth_token_expire_s: int = _setting(
        18000, "nacos.core.auth.plugin.nacos.token.expire.seconds", "Lifetime of an access token.",
        check=positive,
    )
    auth_token_secret_key: str = _setting(
        "", "nacos.core.auth.plugin.nacos.token.secret.key",
        "Base64 HS256 key (>= 32 bytes); empty = generated once per cluster into the CP store.",
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
    snapshot_request_timeout_ms: int = _setting(
        3000, "shoal.distro.snapshot.request-timeout-ms",
        "Timeout of one snapshot page request: a peer that does not answer in time is left for the next one.",
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

    # --- instance history (issue 23 item 5) -----------------------------------------------------
    history_enabled: bool = _setting(
        True, "shoal.history.enabled",
        "Keep a rotated log of instance events and pushes under <data_dir>/history (shoal history).",
    )
    history_max_bytes: int = _setting(
        64 * 1024 * 1024, "shoal.history.max-bytes",
        "Bound on the history files' total size; the oldest segment is deleted to stay within it.",
        check=positive,
    )
    history_segment_bytes: int = _setting(
        8 * 1024 * 1024, "shoal.history.segment-bytes",
        "Size at which the history log starts a new segment file (at most half of max-bytes).",
        check=positive,
    )
    history_flush_ms: int = _setting(
        500, "shoal.history.flush-interval-ms",
        "How often the history rows queued on the event loop are written (off the loop) to disk.",
        check=positive,
    )
    history_queue: int = _setting(
        200_000, "shoal.history.queue-capacity",
        "History rows queued between two writes; beyond it rows are dropped and counted.",
        check=positive,
    )

    # --- consistency check (issue 23 item 4) ----------------------------------------------------
    consistency_recheck_ms: int = _setting(
        1000, "shoal.consistency.recheck-ms",
        "A difference between members' digests is reported only if it shows again this much later.",
        check=non_negative,
    )
    consistency_peer_timeout_ms: int = _setting(
        2000, "shoal.consistency.peer-timeout-ms", "How long a member's digests are waited for.", check=positive
    )
    consistency_check_interval_ms: int = _setting(
        0, "shoal.consistency.check-interval-ms",
        "Period of the members' digest comparison behind shoal_consistency_disagreements (0 = only on request).",
        check=non_negative,
    )

    # --- console charts (issue 23 item 6) -------------------------------------------------------
    console_chart_interval_ms: int = _setting(
        5000, "shoal.console.chart.interval-ms",
        "How often the console's cluster charts take a sample of the node's figures (kept in memory).",
        check=positive,
    )
    console_chart_window_ms: int = _setting(
        900_000, "shoal.console.chart.window-ms",
        "How far back the console's cluster charts reach; at most "
        "10000 samples (window / interval) are kept.",
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
    cluster_client_transport: str = _setting(
        "", "shoal.cluster.client.transport",
        "Client transport of the calls to peers' cluster ports: native (libnghttp2) or grpcio; empty = native "
        "when built.",
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
    # HTTP/2 abuse limits of the native transport (grpc.aio has grpc core's own, see native_server.py)
    h2_max_concurrent_streams: int = _setting(
        1000, "shoal.remote.h2.max-concurrent-streams",
        "Streams one HTTP/2 connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused.",
        check=positive,
    )
    h2_max_header_list_size: int = _setting(
        16384, "shoal.remote.h2.max-header-list-size",
        "Largest header list of one request, in bytes (SETTINGS_MAX_HEADER_LIST_SIZE); a larger one "
        "resets its stream.",
        check=positive,
    )
    h2_reset_burst: int = _setting(
        1000, "shoal.remote.h2.reset-burst",
        "Rapid-reset budget: RST_STREAM frames a connection may send at once before GOAWAY (token bucket).",
        check=positive,
    )
    h2_reset_rate: int = _setting(
        33, "shoal.remote.h2.reset-rate",
        "Rapid-reset budget: tokens per second returned to a connection's RST_STREAM bucket.",
        check=positive,
    )
    h2_max_outbound_ack: int = _setting(
        1000, "shoal.remote.h2.max-outbound-ack",
        "PING/SETTINGS acknowledgements queued unsent (a flood) before the connection is closed.",
        check=positive,
    )
    h2_max_settings: int = _setting(
        32, "shoal.remote.h2.max-settings",
        "Entries accepted in one SETTINGS frame; more close the connection.",
        check=positive,
    )
    h2_max_continuations: int = _setting(
        8, "shoal.remote.h2.max-continuations",
        "CONTINUATION frames accepted after one HEADERS frame; more close the connection.",
        check=non_negative,
    )
    h2_preface_timeout_ms: int = _setting(
        10_000, "shoal.remote.h2.preface-timeout-ms",
        "A connection that has not sent the HTTP/2 preface and its SETTINGS this long after it opened "
        "is closed.",
        check=positive,
    )
    h2_max_read_buffer_bytes: int = _setting(
        16 * 1024 * 1024, "shoal.remote.h2.max-read-buffer-bytes",
        "Bytes of unfinished request messages one connection may hold across its streams (at least "
        "one message of the port's max-inbound-message-size); a message that does not fit is refused.",
        check=positive,
    )

    # --- TLS (Nacos RpcServerTlsConfig for the gRPC ports; Spring Boot server.ssl.* for HTTP) ---
    # Shoal takes PEM files. With TLS on, a port serves TLS only: never plaintext beside it.
    rpc_tls_enabled: bool = _setting(
        False, "nacos.remote.server.rpc.tls.enableTls", "Serve the SDK gRPC port over TLS (ALPN h2) only.")
    rpc_tls_cert_chain_file: str = _setting(
        "", "nacos.remote.server.rpc.tls.certChainFile", "PEM certificate chain of the SDK gRPC port.")
    rpc_tls_cert_private_key: str = _setting(
        "", "nacos.remote.server.rpc.tls.certPrivateKey", "PEM private key of the SDK gRPC port.")
    rpc_tls_cert_private_key_password: str = _setting(
        "", "nacos.remote.server.rpc.tls.certPrivateKeyPassword", "Password of an encrypted SDK port key.")
    rpc_tls_trust_collection_cert_file: str = _setting(
        "", "nacos.remote.server.rpc.tls.trustCollectionCertFile",
        "PEM CA certificates client certificates are verified against (needed with mutualAuthEnable).")
    rpc_tls_mutual_auth_enable: bool = _setting(
        False, "nacos.remote.server.rpc.tls.mutualAuthEnable", "Refuse SDK clients without a trusted certificate.")
    rpc_tls_compatibility: bool = _setting(
        False, "nacos.remote.server.rpc.tls.compatibility",
        "Nacos: plaintext beside TLS on one port. Shoal never does that; true is refused with TLS on.")
    peer_tls_enabled: bool = _setting(
        False, "nacos.remote.peer.rpc.tls.enableTls",
        "Serve the cluster port over TLS only, and call peers' cluster ports over TLS.")
    peer_tls_cert_chain_file: str = _setting(
        "", "nacos.remote.peer.rpc.tls.certChainFile",
        "PEM certificate chain of the cluster port (also shown to peers when calling them).")
    peer_tls_cert_private_key: str = _setting(
        "", "nacos.remote.peer.rpc.tls.certPrivateKey", "PEM private key of the cluster port.")
    peer_tls_cert_private_key_password: str = _setting(
        "", "nacos.remote.peer.rpc.tls.certPrivateKeyPassword", "Password of an encrypted cluster port key.")
    peer_tls_trust_collection_cert_file: str = _setting(
        "", "nacos.remote.peer.rpc.tls.trustCollectionCertFile",
        "PEM CA certificates peers are verified against (both ways); empty = the system's CAs.")
    peer_tls_mutual_auth_enable: bool = _setting(
        False, "nacos.remote.peer.rpc.tls.mutualAuthEnable", "Refuse peers without a trusted certificate.")
    peer_tls_compatibility: bool = _setting(
        False, "nacos.remote.peer.rpc.tls.compatibility",
        "Nacos: plaintext beside TLS on one port. Shoal never does that; true is refused with TLS on.")
    http_ssl_enabled: str = _setting(
        "", "server.ssl.enabled",
        "Serve the HTTP port over HTTPS only: true/false; unset = on when server.ssl.certificate or "
        "server.ssl.certificate-private-key is set (as in Spring Boot).", check=one_of("", "true", "false"))
    http_ssl_certificate: str = _setting("", "server.ssl.certificate", "PEM certificate chain of the HTTP port.")
    http_ssl_certificate_private_key: str = _setting(
        "", "server.ssl.certificate-private-key", "PEM private key of the HTTP port.")
    http_ssl_key_password: str = _setting("", "server.ssl.key-password", "Password of an encrypted HTTP port key.")
    http_ssl_trust_certificate: str = _setting(
        "", "server.ssl.trust-certificate",
        "PEM CA certificates client certificates (and peers, when forwarding) are verified against.")
    http_ssl_client_auth: str = _setting(
        "none", "server.ssl.client-auth", "Client certificates on the HTTP port: none, want or need.",
        check=one_of("none", "want", "need"))
    http_ssl_key_store: str = _setting(
        "", "server.ssl.key-store",
        "Not supported (PKCS12/JKS key stores): give PEM files with server.ssl.certificate and "
        "server.ssl.certificate-private-key.")

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
    cp_etcd_log_max_bytes: int = _setting(
        64 * 1024 * 1024, "shoal.cp.etcd-log.max-bytes",
        "Size past which the managed etcd member's <data-dir>/cp/etcd.log is rotated (copied to etcd.log.1, "
        "then truncated).", check=positive,
    )
    cp_etcd_log_count: int = _setting(
        2, "shoal.cp.etcd-log.count", "Rotated etcd.log files kept besides the current one.", check=positive,
    )
    cp_etcd_log_check_interval_ms: int = _setting(
        30_000, "shoal.cp.etcd-log.check-interval-ms",
        "How often the managed etcd member's log size is checked (also at every start of the member).",
        check=positive,
    )
    cp_history_revisions: int = _setting(
        100_000, "shoal.cp.history-revisions", "Revisions of history kept for watch resume (older compacted).",
        check=positive,
    )

    # --- built-in DNS (Nacos 3.3, docs/protocol.md §8) ----------------------------------------
    dns_enabled: bool = _setting(False, "nacos.naming.dns.enabled", "Answer DNS (A, AAAA, SRV) for services.")
    dns_bind_address: str = _setting("127.0.0.1", "nacos.naming.dns.bind-address", "Address the DNS port binds to.")
    dns_port: int = _setting(5353, "nacos.naming.dns.port", "DNS port (UDP and TCP).", check=port_number)
    dns_domain_suffix: str = _setting(
        "nacos", "nacos.naming.dns.domain-suffix",
        "Zone answered: {service}.{suffix} or {service}.{group}.{suffix}; names outside it are REFUSED.",
        check=dns_suffix)
    dns_default_group: str = _setting(
        "DEFAULT_GROUP", "nacos.naming.dns.default-group", "Group of a {service}.{suffix} name.", check=not_empty)
    dns_namespace: str = _setting("public", "nacos.naming.dns.namespace", "Namespace whose services DNS answers.")
    dns_ttl: int = _setting(60, "nacos.naming.dns.ttl", "TTL (seconds) of every DNS answer.", check=non_negative)
    dns_rate_limit: int = _setting(
        200, "shoal.dns.rate-limit",
        "DNS queries per second answered for one source address (burst of as many); the rest are dropped.",
        check=positive)

    # --- lock module (Nacos 3.x LockOperationRequest, docs/protocol.md §9) ------------------
    lock_default_expire_ms: int = _setting(
        30_000, "nacos.lock.default_expire_time", "Expiry of a lock whose expiredTime is negative (ms).",
        check=positive)
    lock_max_expire_ms: int = _setting(
        1_800_000, "nacos.lock.max_expire_time", "Longest expiry a lock may ask for (ms).", check=positive)

    # ------------------------------------------------------------------------------------
    @property
    def grpc_port(self) -> int:
        return self.port + self.grpc_port_offset

    @property
    def cluster_port(self) -> int:
        return self.port + self.cluster_port_offset

    @property
    def workers(self) -> int:
        """The worker processes to run (``shoal.server.workers`` with auto resolved); 1 = one process."""
        if self.server_workers:
            return int(self.server_workers)
        return max(1, min(usable_cores(), AUTO_WORKERS_CAP))

    @property
    def http_tls_on(self) -> bool:
        """Whether the HTTP port serves HTTPS (server.ssl.enabled, or unset with a certificate given)."""
        flag = self.http_ssl_enabled.strip().lower()
        if flag:
            return flag == "true"
        return bool(self.http_ssl_certificate or self.http_ssl_certificate_private_key)

    @property
    def limit_rule_path(self) -> Path:
        if self.connection_limit_rule_file:
            return Path(self.connection_limit_rule_file)
        return Path(self.data_dir) / "loader" / "limitRule"

    @property
    def any_auth(self) -> bool:
        """Whether any API family needs a login (Nacos 3.x's three switches)."""
        return self.auth_enabled or self.auth_admin_enabled or self.auth_console_enabled

    def validate(self) -> Config:
        """Raise ConfigError naming the first bad setting; return self for chaining.

        Every field's own constraint (``check=`` in its declaration) is applied first; what
        follows here are the rules that involve more than one field.
        """
        check_fields(self)
        if bool(self.cluster_identity_key) != bool(self.cluster_identity_value):
            raise ConfigError("nacos.core.auth.server.identity.key and .value must be set together")
        if self.any_auth and (self.members or self.cluster_conf) and not self.cluster_identity_key:
            raise ConfigError("with auth on, cluster members must prove a shared identity: set "
                              "nacos.core.auth.server.identity.key and .value on every node (or turn auth off: "
                              "nacos.core.auth.enabled, .admin.enabled and .console.enabled = false)")
        if self.auth_system_type.lower() == "ldap" and not self.ldap_url:
            raise ConfigError("nacos.core.auth.system.type=ldap needs nacos.core.auth.ldap.url")
        if self.history_segment_bytes * 2 > self.history_max_bytes:
            raise ConfigError(f"shoal.history.segment-bytes ({self.history_segment_bytes}) must be at most half of "
                              f"shoal.history.max-bytes ({self.history_max_bytes})")
        if self.console_chart_window_ms < self.console_chart_interval_ms or \
                self.console_chart_window_ms // self.console_chart_interval_ms > MAX_CHART_SAMPLES:
            raise ConfigError(f"shoal.console.chart.window-ms ({self.console_chart_window_ms}) must hold between 1 "
                              f"and {MAX_CHART_SAMPLES} samples of shoal.console.chart.interval-ms "
                              f"({self.console_chart_interval_ms})")
        self._validate_tls()
        if not 0 < self.grpc_port < 65536 or not 0 < self.cluster_port < 65536:
            raise ConfigError(f"server.port {self.port} (+{self.grpc_port_offset}) is not a usable port")
        return self

    def _validate_tls(self) -> None:
        """TLS settings that cannot work together; the files themselves are read by shoal.tls."""
        if self.http_ssl_key_store:
            raise ConfigError("server.ssl.key-store is not supported (PKCS12/JKS): give PEM files with "
                              "server.ssl.certificate and server.ssl.certificate-private-key")
        for prefix, enabled, chain, key, trust, mutual, compat in (
            ("nacos.remote.server.rpc.tls", self.rpc_tls_enabled, self.rpc_tls_cert_chain_file,
             self.rpc_tls_cert_private_key, self.rpc_tls_trust_collection_cert_file,
             self.rpc_tls_mutual_auth_enable, self.rpc_tls_compatibility),
            ("nacos.remote.peer.rpc.tls", self.peer_tls_enabled, self.peer_tls_cert_chain_file,
             self.peer_tls_cert_private_key, self.peer_tls_trust_collection_cert_file,
             self.peer_tls_mutual_auth_enable, self.peer_tls_compatibility),
        ):
            if not enabled:
                continue
            if not chain or not key:
                raise ConfigError(f"{prefix}.enableTls=true needs {prefix}.certChainFile and {prefix}.certPrivateKey")
            if mutual and not trust:
                raise ConfigError(f"{prefix}.mutualAuthEnable=true needs {prefix}.trustCollectionCertFile "
                                  "(the CA certificates clients are verified against)")
            if compat:
                raise ConfigError(f"{prefix}.compatibility=true (plaintext beside TLS) is not supported: "
                                  "a TLS port serves TLS only")
        if self.http_tls_on:
            if not self.http_ssl_certificate or not self.http_ssl_certificate_private_key:
                raise ConfigError("server.ssl.enabled=true needs server.ssl.certificate and "
                                  "server.ssl.certificate-private-key (PEM files)")
            if self.http_ssl_client_auth.lower() != "none" and not self.http_ssl_trust_certificate:
                raise ConfigError("server.ssl.client-auth needs server.ssl.trust-certificate "
                                  "(the CA certificates clients are verified against)")

    # ------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> Config:
        """Defaults < file < Nacos Docker env < ``SHOAL_<FIELD>`` env < overrides (property or field names)."""
        return cls.load_with_report(file, env, overrides)[0]

    @classmethod
    def load_with_report(
        cls,
        file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> tuple[Config, Report]:
        """:meth:`load`, and the report of keys accepted but not used (to log once logging is set up).

        Every problem found in every source is raised together in one ConfigError.
        """
        env = os.environ if env is None else env
        report = Report()
        raw_overrides = dict(overrides or {})
        known_props = set(_BY_PROP)
        props = read_properties(Path(file)) if file else {}
        resolver = PlaceholderResolver(props, env, raw_overrides)
        layers: list[tuple[str, dict[str, str]]] = []
        if file:
            layers.append((str(file), classify(props, known_props, str(file), report)))
        layers.append(("Nacos Docker environment", docker_environment(env, report)))
        layers.append(("environment", shoal_variables(env, list(_BY_NAME), report)))
        layers.append(("command line", classify(raw_overrides, known_props | set(_BY_NAME), "command line", report)))
        values: dict[str, Any] = {}
        for source, layer in layers:
            for key, text in layer.items():
                f = _BY_PROP.get(key) or _BY_NAME[key]
                try:
                    resolved = resolver.resolve(text)
                except ConfigError as exc:
                    report.errors.append(f"{f.metadata['prop']} ({source}): {exc}")
                    continue
                try:
                    values[f.name] = _convert(f, resolved, source)
                except ConfigError as exc:
                    report.errors.append(str(exc))
        problem = cluster_mode_problem(env, values.get("members", ""), values.get("cluster_conf", ""))
        if problem:
            report.errors.append(problem)
        if not report.errors:
            try:
                cls(**values).validate()
            except ConfigError as exc:
                report.errors.append(str(exc))
        report.raise_if_errors()
        return cls(**values), report

    def describe(self) -> Iterator[tuple[str, Any, str]]:
        """(property, value, doc) for every setting: used by --help and the startup log."""
        for f in _fields():
            yield f.metadata["prop"], getattr(self, f.name), f.metadata["doc"]


class LiveConfig:
    """The node's settings as they are now (hashicorp raft's ``ReloadableConfig``): the loaded
    :class:`Config` with the naming switches' overrides. A component whose setting may change
    while the node runs holds this one object and reads :attr:`current` each time it needs the
    value; only the switches :meth:`reload` it. Nothing keeps a copy, so nothing is re-wired."""

    __slots__ = ("_current", "base")

    def __init__(self, base: Config) -> None:
        self.base = base
        self._current = base

    @property
    def current(self) -> Config:
        return self._current

    def reload(self, current: Config) -> None:
        self._current = current


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
