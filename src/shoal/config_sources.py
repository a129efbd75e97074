"""Where settings come from: a Nacos ``application.properties``, the Nacos Docker image's
environment variables, ``SHOAL_<FIELD>`` variables and ``-D`` flags.

:meth:`shoal.config.Config.load` layers these sources (lowest first): defaults < properties
file < Nacos Docker environment < ``SHOAL_<FIELD>`` environment < command line. This module
reads and checks each source; it knows nothing of the fields' types (config.py converts).

* The file is read with ``javaproperties`` (the whole Java ``Properties.load`` syntax:
  ``key=value``, ``key: value``, ``key value``, continuation lines, ``\\uXXXX`` escapes).
* ``${NAME:default}`` placeholders are resolved as Spring resolves them: from the command line,
  the environment (also under Spring's relaxed name, ``nacos.x-y`` → ``NACOS_X_Y``) and the other
  properties of the file, else the default; nested placeholders work. A placeholder that cannot
  be resolved is an error only in a key Shoal uses (Spring leaves it literal elsewhere).
* Keys of other Nacos modules and of Spring are accepted and listed once at INFO as not used.
  A key that looks like a typo of a known one (``nacos.*``, ``server.*``, ``shoal.*`` and
  ``SHOAL_*``) is reported with the closest known name; every problem of a start is reported
  together in one :class:`~shoal.errors.ConfigError`.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import javaproperties

from shoal.errors import ConfigError

log = logging.getLogger("shoal.config")

#: Nacos property names that mean one of ours (Nacos 3.x / its Docker image use the first).
ALIASES: Mapping[str, str] = {
    "nacos.server.main.port": "server.port",
    "nacos.server.ip": "nacos.inetutils.ip-address",
    "logging.file.name": "shoal.log.file",
}

#: Property names of Nacos modules (and the Spring Boot keys of Nacos's shipped files) that Shoal
#: does not implement: accepted, listed at INFO as not used, never taken for typos of ours.
#: From distribution/conf/application.properties (2.x and 1.x, commented keys included) and the
#: nacos-docker image's build/conf/application.properties and docker-startup.sh.
_FOREIGN_KEYS_TEXT = """
nacos.ai.mcp.registry.enabled nacos.ai.mcp.registry.port nacos.cmdb.dumpTaskInterval nacos.cmdb.eventTaskInterval
nacos.cmdb.labelTaskInterval nacos.cmdb.loadDataAtStart nacos.config.push.maxRetryTime nacos.console.contextPath
nacos.console.port nacos.console.remote.server.context-path nacos.console.ui.enabled nacos.core.address-server.retry
nacos.core.api.compatibility.admin.enabled nacos.core.api.compatibility.client.enabled
nacos.core.api.compatibility.console.enabled nacos.core.auth.caching.enabled
nacos.core.auth.enable.userAgentAuthWhite
nacos.core.auth.ldap.ignore.partial.result.exception nacos.core.auth.ldap.userdn
nacos.core.auth.nacos.anonymous.ai.enabled nacos.core.auth.plugin.nacos.token.cache.enable
nacos.core.config.plugin.fileformatcheck.enabled
nacos.core.config.plugin.webhook.contentMaxCapacity nacos.core.config.plugin.webhook.enabled
nacos.core.config.plugin.webhook.url nacos.core.config.plugin.whitelist.enabled
nacos.core.config.plugin.whitelist.suffixs nacos.core.member.lookup.type nacos.core.member.meta.adweight
nacos.core.member.meta.site nacos.core.member.meta.weight nacos.core.protocol.raft.data.cli_service_thread_num
nacos.core.protocol.raft.data.core_thread_num nacos.core.protocol.raft.data.election_timeout_ms
nacos.core.protocol.raft.data.read_index_type nacos.core.protocol.raft.data.rpc_request_timeout_ms
nacos.core.protocol.raft.data.snapshot_interval_secs nacos.core.snowflake.worker-id nacos.deployment.type
nacos.extension.ai.enabled nacos.inetutils.prefer-hostname-over-ip nacos.inetutils.use-only-site-local-interfaces
nacos.inetutils.preferred-networks nacos.inetutils.ignored-interfaces nacos.istio.mcp.server.enabled
nacos.k8s.sync.enabled nacos.k8s.sync.kubeConfig nacos.k8s.sync.outsideCluster
nacos.naming.data.warmup nacos.naming.empty-service.auto-clean nacos.naming.empty-service.clean.initial-delay-ms
nacos.naming.empty-service.clean.period-time-ms nacos.naming.distro.taskDispatchPeriod
nacos.naming.distro.batchSyncKeyCount nacos.naming.distro.syncRetryDelay nacos.plugin.ai-pipeline.enabled
nacos.plugin.ai-pipeline.skill-scanner.enabled nacos.plugin.ai-pipeline.type nacos.plugin.control.manager.type
nacos.plugin.control.rule.external.storage nacos.plugin.control.rule.local.basedir
nacos.plugin.datasource.log.enabled nacos.remote.server.grpc.cluster.keep-alive-time
nacos.remote.server.grpc.cluster.keep-alive-timeout nacos.remote.server.grpc.cluster.permit-keep-alive-time
nacos.remote.server.grpc.sdk.keep-alive-time nacos.remote.server.grpc.sdk.keep-alive-timeout
nacos.security.ignore.urls nacos.server.contextPath nacos.standalone nacos.functionMode nacos.preferHostnameOverIp
nacos.core.auth.admin.enable nacos.core.auth.console.enable nacos.core.protocol.raft.data.max_raft_log_size
server.contextPath server.servlet.contextPath server.error.include-message server.tomcat.accesslog.file-date-format
server.tomcat.accesslog.max-days server.tomcat.accesslog.pattern server.tomcat.accesslog.rotate
server.tomcat.basedir server.tomcat.mbeanregistry.enabled server.max-http-request-header-size
server.max-http-header-size server.compression.enabled
"""
NACOS_FOREIGN_KEYS: frozenset[str] = frozenset(_FOREIGN_KEYS_TEXT.split())

#: Prefixes whose unknown keys may be typos of ours (others belong to Spring or other modules).
OWN_PREFIXES = ("nacos.", "server.", "shoal.")

#: ``SHOAL_*`` variables that are not ``SHOAL_<FIELD>`` settings but are read elsewhere.
OTHER_SHOAL_VARIABLES = frozenset({"SHOAL_TEST_HOOKS", "SHOAL_NO_EXTENSIONS", "SHOAL_CYTHON_ANNOTATE",
                                   # a worker's place in its node (shoal/workers/placement.py)
                                   "SHOAL_WORKER_INDEX", "SHOAL_WORKER_PORTS", "SHOAL_SUPERVISOR_PID"})

#: Nacos Docker image variables (nacos-group/nacos-docker, README and docker-startup.sh) that map
#: straight to a property.
DOCKER_PROPERTIES: Mapping[str, str] = {
    "NACOS_APPLICATION_PORT": "server.port",
    "NACOS_SERVER_IP": "nacos.inetutils.ip-address",
    "NACOS_AUTH_ENABLE": "nacos.core.auth.enabled",
    "NACOS_AUTH_ADMIN_ENABLE": "nacos.core.auth.admin.enabled",
    "NACOS_AUTH_CONSOLE_ENABLE": "nacos.core.auth.console.enabled",
    "NACOS_AUTH_SYSTEM_TYPE": "nacos.core.auth.system.type",
    "NACOS_AUTH_TOKEN": "nacos.core.auth.plugin.nacos.token.secret.key",
    "NACOS_AUTH_TOKEN_EXPIRE_SECONDS": "nacos.core.auth.plugin.nacos.token.expire.seconds",
    "NACOS_AUTH_IDENTITY_KEY": "nacos.core.auth.server.identity.key",
    "NACOS_AUTH_IDENTITY_VALUE": "nacos.core.auth.server.identity.value",
    "NACOS_CORE_PARAM_CHECK_ENABLED": "nacos.core.param.check.enabled",
    "TOMCAT_ACCESSLOG_ENABLED": "server.tomcat.accesslog.enabled",
    "MEMBER_LIST": "nacos.member.list",
}
#: Nacos Docker image variables about the JVM, MySQL, the console or plugins: accepted, not used.
DOCKER_IGNORED_PREFIXES = ("JVM_", "MYSQL_", "NACOS_CONSOLE_", "NACOS_AUTH_")
DOCKER_IGNORED = frozenset({
    "FUNCTION_MODE", "NACOS_DEBUG", "SPRING_DATASOURCE_PLATFORM", "EMBEDDED_STORAGE", "NACOS_DEPLOYMENT_TYPE",
    "NACOS_EXT_PLUGIN_DIRS", "NACOS_SECURITY_IGNORE_URLS", "DB_POOL_CONNECTION_TIMEOUT", "JAVA_OPT_EXT",
    "USE_ONLY_SITE_INTERFACES", "PREFERRED_NETWORKS", "IGNORED_INTERFACES", "PREFER_HOST_MODE",
})

_PLACEHOLDER_START = "${"


@dataclass
class Report:
    """What one start found wrong (``errors``) or merely unused (``unused``), across all sources."""

    errors: list[str] = field(default_factory=list)
    unused: dict[str, str] = field(default_factory=dict)  # key -> source
    warnings: list[str] = field(default_factory=list)

    def raise_if_errors(self) -> None:
        """One ConfigError naming every problem (one per line), if there is any."""
        if self.errors:
            if len(self.errors) == 1:
                raise ConfigError(self.errors[0])
            raise ConfigError(f"{len(self.errors)} problems:\n  " + "\n  ".join(self.errors))

    def log(self) -> None:
        """Say once what was accepted but not used, and the warnings."""
        for warning in self.warnings:
            log.warning("%s", warning)
        if self.unused:
            by_source: dict[str, list[str]] = {}
            for key, source in self.unused.items():
                by_source.setdefault(source, []).append(key)
            for source, keys in by_source.items():
                log.info("not used by Shoal (%s, %d): %s", source, len(keys), ", ".join(sorted(keys)))


# --- the properties file ------------------------------------------------------------------------
def read_properties(path: Path) -> dict[str, str]:
    """Parse a Java properties file (``java.util.Properties.load`` syntax, UTF-8 as Spring reads it)."""
    try:
        with path.open(encoding="utf-8") as fp:
            return dict(javaproperties.load(fp))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc


def relaxed_env_name(name: str) -> str:
    """Spring's environment form of a property name: dots become underscores, dashes go, upper case.

    ``server.port`` → ``SERVER_PORT``, ``nacos.core.param.check-enabled`` → ``NACOS_CORE_PARAM_CHECKENABLED``.
    """
    return re.sub(r"[.\[\]]", "_", name).replace("-", "").upper()


class PlaceholderResolver:
    """Resolves ``${NAME}`` / ``${NAME:default}`` in values, as Spring's property resolver does.

    ``NAME`` is looked up in ``overrides`` (the command line), then the environment (verbatim,
    then in its relaxed form), then ``props`` (themselves resolved); nested placeholders and
    placeholders in defaults work; a cycle or an unresolvable name raises ConfigError.
    """

    def __init__(self, props: Mapping[str, str], env: Mapping[str, str], overrides: Mapping[str, str]) -> None:
        self.props = props
        self.env = env
        self.overrides = overrides

    def resolve(self, text: str, _seen: tuple[str, ...] = ()) -> str:
        """``text`` with every placeholder replaced."""
        out: list[str] = []
        i = 0
        while True:
            start = text.find(_PLACEHOLDER_START, i)
            if start < 0:
                out.append(text[i:])
                return "".join(out)
            end = self._closing(text, start)
            if end < 0:  # no closing brace: Spring keeps the text as it is
                out.append(text[i:])
                return "".join(out)
            out.append(text[i:start])
            out.append(self._value_of(text[start + 2:end], _seen))
            i = end + 1

    @staticmethod
    def _closing(text: str, start: int) -> int:
        depth = 0
        i = start
        while i < len(text):
            if text.startswith(_PLACEHOLDER_START, i):
                depth += 1
                i += 2
                continue
            if text[i] == "}":
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return -1

    def _split(self, inner: str) -> tuple[str, str | None]:
        """``NAME:default`` → (NAME, default); the first ':' outside nested placeholders separates."""
        depth = 0
        i = 0
        while i < len(inner):
            if inner.startswith(_PLACEHOLDER_START, i):
                depth += 1
                i += 2
                continue
            ch = inner[i]
            if ch == "}":
                depth -= 1
            elif ch == ":" and depth == 0:
                return inner[:i], inner[i + 1:]
            i += 1
        return inner, None

    def _value_of(self, inner: str, seen: tuple[str, ...]) -> str:
        name_text, default = self._split(inner)
        name = self.resolve(name_text, seen).strip()
        if name in seen:
            raise ConfigError(f"circular placeholder ${{{name}}} ({' -> '.join((*seen, name))})")
        found = self._lookup(name)
        if found is not None:
            return self.resolve(found, (*seen, name))
        if default is not None:
            return self.resolve(default, seen)
        raise ConfigError(f"cannot resolve placeholder ${{{name}}}: no such property or environment variable, "
                          "and no default (write ${NAME:default})")

    def _lookup(self, name: str) -> str | None:
        for source in (self.overrides, self.env):
            if name in source:
                return source[name]
        relaxed = relaxed_env_name(name)
        if relaxed in self.env:
            return self.env[relaxed]
        return self.props.get(name)


# --- the Nacos Docker image's environment --------------------------------------------------------
def docker_environment(env: Mapping[str, str], report: Report) -> dict[str, str]:
    """Properties set by the Nacos Docker image's variables (``MODE``, ``NACOS_SERVERS``, ...).

    ``MODE=standalone`` empties the member list; ``MODE=cluster`` takes the members from
    ``NACOS_SERVERS`` (space- or comma-separated ``ip[:port][?raft_port=N]``) or ``MEMBER_LIST``.
    Variables about the JVM, a database or the console are accepted and listed as not used.
    """
    out: dict[str, str] = {}
    for var, prop in DOCKER_PROPERTIES.items():
        if var in env:
            out[prop] = env[var]
    mode = env.get("MODE", "").strip().lower()
    servers = " ".join(env.get("NACOS_SERVERS", "").replace(",", " ").split())
    if mode not in ("", "standalone", "cluster"):  # MODE is a common name: not necessarily Nacos's
        report.warnings.append(f"MODE={env['MODE']!r} in the environment is not the Nacos Docker image's "
                               "standalone/cluster; ignored")
        mode = ""
    if mode == "standalone":
        out["nacos.member.list"] = ""
        if servers:
            report.warnings.append("MODE=standalone: NACOS_SERVERS is ignored")
    elif servers:
        out["nacos.member.list"] = servers.replace(" ", ",")
    for var in env:
        if var in DOCKER_IGNORED or (var.startswith(DOCKER_IGNORED_PREFIXES) and var not in DOCKER_PROPERTIES):
            report.unused[var] = "Nacos Docker environment"
    return out


def cluster_mode_problem(env: Mapping[str, str], members: str, cluster_conf: str) -> str | None:
    """``MODE=cluster`` without any member list is a mistake worth refusing to start on."""
    if env.get("MODE", "").strip().lower() == "cluster" and not members and not cluster_conf:
        return "MODE=cluster (environment) needs the members: set NACOS_SERVERS=\"ip1:port1 ip2:port2 ...\""
    return None


# --- classifying keys -------------------------------------------------------------------------------
def closest(name: str, known: Collection[str], cutoff: float) -> str | None:
    """The known name most like ``name`` (difflib ratio, case-insensitive), if any reaches ``cutoff``."""
    lowered = {k.lower(): k for k in known}
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=cutoff)
    return lowered[match[0]] if match else None


#: Above this similarity an unknown nacos.* / server.* key is taken for a typo of one of ours.
TYPO_CUTOFF = 0.88


def classify(raw: Mapping[str, str], known: Collection[str], source: str, report: Report) -> dict[str, str]:
    """Keep the keys Shoal knows (aliases mapped); note the others in ``report``.

    Unknown ``shoal.*`` keys are errors; unknown ``nacos.*`` / ``server.*`` keys close to a known
    name are errors (probable typos) and the rest, like every other key, are noted as unused.
    """
    kept: dict[str, str] = {}
    for key, value in raw.items():
        name = ALIASES.get(key, key)
        if name in known:
            kept[name] = value
            continue
        if key in NACOS_FOREIGN_KEYS:
            report.unused[key] = source
            continue
        if key.startswith("shoal."):
            guess = closest(key, known, 0.6)
            hint = f"; did you mean {guess}?" if guess else ""
            report.errors.append(f"unknown setting {key!r} ({source}){hint}")
            continue
        if key.startswith(OWN_PREFIXES):
            guess = closest(key, known, TYPO_CUTOFF)
            if guess is not None:
                report.errors.append(f"unknown setting {key!r} ({source}): probably a typo of {guess}")
                continue
        report.unused[key] = source
    return kept


def shoal_variables(env: Mapping[str, str], field_names: Collection[str], report: Report) -> dict[str, str]:
    """``SHOAL_<FIELD>`` values by field name; an unknown ``SHOAL_*`` close to a known one is an error."""
    by_var = {f"SHOAL_{name.upper()}": name for name in field_names}
    out: dict[str, str] = {}
    for var, value in env.items():
        if not var.startswith("SHOAL_") or var in OTHER_SHOAL_VARIABLES:
            continue
        if var in by_var:
            out[by_var[var]] = value
            continue
        guess = closest(var, [*by_var, *OTHER_SHOAL_VARIABLES], TYPO_CUTOFF - 0.08)
        if guess is not None:
            report.errors.append(f"unknown environment variable {var}: probably a typo of {guess}")
        else:
            report.warnings.append(f"environment variable {var} is not a Shoal setting; ignored")
    return out
