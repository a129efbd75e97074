"""Naming switches (Nacos's SwitchDomain / SwitchManager): cluster-wide, live, persistent.

The switches are one JSON document in the CP store (``Keyspace.META`` / ``switches``) holding
only the entries an operator changed; every node watches it, so a ``PUT
/nacos/v1/ns/operator/switches`` on any node changes every node, and the document survives
restarts (Nacos keeps its SwitchDomain in its CP store too). A node's effective value of an
entry is the document's, else its own configured setting.

Each entry an operator may set changes the running node: it maps to the :class:`Config` field
its consumer reads through the node's one :class:`~shoal.config.LiveConfig` (``LIVE_SETTINGS``),
so nothing is restarted or re-wired. The other SwitchDomain entries (``REFUSED``) would have no
effect here: a write of one is refused with a 400 naming it, and reads show Nacos's fixed value.
The table of every entry is in docs/protocol.md ("Naming switches").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.config import Config, LiveConfig
from shoal.cp.store import CpView
from shoal.errors import InvalidParam

log = logging.getLogger(__name__)

#: The name of the switches document in ``Keyspace.META``.
SWITCHES_DOC = "switches"
#: SwitchDomain's name as Nacos serialises it.
SWITCH_DOMAIN_NAME = "00-00---000-NACOS_SWITCH_DOMAIN-000---00-00"


@dataclass(frozen=True, slots=True)
class _Entry:
    kind: str  # "bool" | "int" | "float" | "str"
    default: Any
    low: float | None = None  # inclusive lower bound of a number
    high: float | None = None  # inclusive upper bound


#: Every SwitchDomain entry with its Nacos default (live ones are overridden by Config), in the
#: order Nacos shows them.
ENTRIES: dict[str, _Entry] = {
    "pushEnabled": _Entry("bool", True),
    "clientBeatInterval": _Entry("int", 5000, 1000, 3_600_000),
    "healthCheckEnabled": _Entry("bool", True),
    "defaultPushCacheMillis": _Entry("int", 10000, 0, 3_600_000),
    "checkTimes": _Entry("int", 3, 1, 100),
    "defaultCacheMillis": _Entry("int", 3000, 0, 3_600_000),
    "distroThreshold": _Entry("float", 0.7, 0.01, 1.0),
    "distroEnabled": _Entry("bool", True),
    "autoChangeHealthCheckEnabled": _Entry("bool", True),
    "enableStandalone": _Entry("bool", True),
    "lightBeatEnabled": _Entry("bool", True),
    "disableAddIP": _Entry("bool", False),
    "sendBeatOnly": _Entry("bool", False),
    "defaultInstanceEphemeral": _Entry("bool", True),
    "serverStatusSynchronizationPeriodMillis": _Entry("int", 2000, 1, 3_600_000),
    "serviceStatusSynchronizationPeriodMillis": _Entry("int", 5000, 1, 3_600_000),
    "distroServerExpiredMillis": _Entry("int", 10000, 1, 3_600_000),
    "pushGoVersion": _Entry("str", "0.1.0"),
    "pushJavaVersion": _Entry("str", "0.1.0"),
    "pushPythonVersion": _Entry("str", "0.4.3"),
    "pushCVersion": _Entry("str", "1.0.12"),
    "pushCSharpVersion": _Entry("str", "0.9.0"),
    "overriddenServerStatus": _Entry("str", None),
}

#: Switch entry → the Config field its consumer reads live.
LIVE_SETTINGS: dict[str, str] = {
    "pushEnabled": "push_enabled",
    "clientBeatInterval": "client_beat_interval_ms",
    "healthCheckEnabled": "health_check_enabled",
    "defaultPushCacheMillis": "push_cache_millis",
    "checkTimes": "health_check_times",
    "autoChangeHealthCheckEnabled": "health_check_auto_change",
}

#: Entries shown (Nacos's value, fixed) but refused on write: they would change nothing here.
#: Each with why, as the 400 says it.
REFUSED: dict[str, str] = {
    "defaultCacheMillis": "cacheMillis comes from defaultPushCacheMillis on every read",
    "distroThreshold": "Distro has no threshold (Nacos 1.x only)",
    "distroEnabled": "Distro always runs in a cluster",
    "enableStandalone": "standalone or cluster is chosen at start (cluster.conf, nacos.member.list)",
    "lightBeatEnabled": "beat answers always allow light beats",
    "disableAddIP": "registration by IP is always allowed (Nacos 1.x only)",
    "sendBeatOnly": "Nacos 1.x only",
    "defaultInstanceEphemeral": "an HTTP write without 'ephemeral' is always ephemeral",
    "serverStatusSynchronizationPeriodMillis": "member state comes from the member reports",
    "serviceStatusSynchronizationPeriodMillis": "service state is replicated by Distro and the CP store",
    "distroServerExpiredMillis": "member health comes from the member reports",
    "pushGoVersion": "every gRPC client is pushed to; no UDP push (Nacos 1.x)",
    "pushJavaVersion": "every gRPC client is pushed to; no UDP push (Nacos 1.x)",
    "pushPythonVersion": "every gRPC client is pushed to; no UDP push (Nacos 1.x)",
    "pushCVersion": "every gRPC client is pushed to; no UDP push (Nacos 1.x)",
    "pushCSharpVersion": "every gRPC client is pushed to; no UDP push (Nacos 1.x)",
    "overriddenServerStatus": "the server status follows readiness (the health endpoints)",
}

_TRUE = ("true",)
_FALSE = ("false",)


def parse_entry(entry: str, value: str) -> Any:
    """The typed value of ``entry=value`` (as SwitchManager.update parses it), or InvalidParam."""
    spec = ENTRIES.get(entry)
    if spec is None:
        raise InvalidParam(f"update entry not found: {entry}")
    if entry in REFUSED:
        raise InvalidParam(f"switch {entry} is not supported: it would have no effect ({REFUSED[entry]})")
    raw = value.strip()
    if spec.kind == "bool":
        if raw.lower() not in _TRUE + _FALSE:
            raise InvalidParam(f"Param 'value' of {entry} must be true or false.")
        return raw.lower() == "true"
    if spec.kind == "str":
        if entry == "overriddenServerStatus":
            if raw.upper() not in ("", "UP", "DOWN", "WRITE_ONLY", "READ_ONLY", "STARTING"):
                raise InvalidParam(f"Param 'value' of {entry} must be a server status (UP, DOWN, ...).")
            return raw.upper() or None
        if not raw or len(raw) > 64:
            raise InvalidParam(f"Param 'value' of {entry} must be a version (1 to 64 characters).")
        return raw
    try:
        number: float = int(raw) if spec.kind == "int" else float(raw)
    except ValueError:
        raise InvalidParam(f"Param 'value' of {entry} must be {'an integer' if spec.kind == 'int' else 'a number'}.") \
            from None
    if (spec.low is not None and number < spec.low) or (spec.high is not None and number > spec.high):
        raise InvalidParam(f"Param 'value' of {entry} must be between {spec.low:g} and {spec.high:g}.")
    return number


class Switches:
    """The switches of one node: the CP document's overrides over the node's own settings.

    Every change reloads ``live``, the node's one :class:`LiveConfig` (the loaded configuration
    with the live entries replaced), which the push service, the beat checker, the naming
    service and the health checker read each time.
    """

    def __init__(self, live: LiveConfig, view: CpView[Any] | None = None) -> None:
        self.live = live
        self.base = live.base
        self.view = view
        self.overrides: dict[str, Any] = {}
        if view is not None:
            view.subscribe(self._on_doc)

    @property
    def config(self) -> Config:
        """The node's effective configuration."""
        return self.live.current

    # --- reads -------------------------------------------------------------------------------
    def value(self, entry: str) -> Any:
        """The effective value of ``entry``."""
        if entry in self.overrides:
            return self.overrides[entry]
        setting = LIVE_SETTINGS.get(entry)
        return getattr(self.base, setting) if setting is not None else ENTRIES[entry].default

    def domain(self) -> dict[str, Any]:
        """SwitchDomain as Nacos serialises it, with this node's effective values."""
        v = self.value
        return {
            "name": SWITCH_DOMAIN_NAME, "masters": None, "adWeightMap": {},
            **{entry: v(entry) for entry in ENTRIES},
            "httpHealthParams": {"max": 5000, "min": 500, "factor": 0.85},
            "tcpHealthParams": {"max": 5000, "min": 1000, "factor": 0.75},
            "mysqlHealthParams": {"max": 3000, "min": 2000, "factor": 0.65},
            "incrementalList": [], "limitedUrlMap": {}, "enableAuthentication": self.base.auth_enabled,
            "healthCheckWhiteList": [], "checksum": None,
        }

    # --- writes ------------------------------------------------------------------------------
    async def update(self, entry: str, value: str, debug: bool = False) -> None:
        """Set one entry: on this node only when ``debug`` (as Nacos), else in the CP document
        (every node applies it from its watch, this one included before this returns)."""
        parsed = parse_entry(entry, value)
        if debug or self.view is None:
            self._apply({**self.overrides, entry: parsed})
            return
        for _attempt in range(16):  # CAS: two operators setting two entries at once both win
            current = self.view.get(SWITCHES_DOC)
            doc = dict(current) if isinstance(current, Mapping) else {}
            doc[entry] = parsed
            if await self.view.compare_and_put(SWITCHES_DOC, doc, self.view.mod_revision(SWITCHES_DOC)):
                return
        raise InvalidParam("switches are being changed concurrently; try again")

    def _on_doc(self, name: str, old: Any, new: Any) -> None:
        if name != SWITCHES_DOC:
            return
        overrides: dict[str, Any] = {}
        if isinstance(new, Mapping):
            for entry, raw in new.items():
                spec = ENTRIES.get(str(entry))
                if spec is None or entry in REFUSED or not _well_typed(spec, raw):
                    log.warning("switches document: ignoring entry %r (unknown, not supported or wrongly typed)",
                                entry)
                    continue
                overrides[str(entry)] = raw
        self._apply(overrides)

    def _apply(self, overrides: dict[str, Any]) -> None:
        self.overrides = overrides
        changes = {setting: overrides[entry] for entry, setting in LIVE_SETTINGS.items() if entry in overrides}
        self.live.reload(dataclasses.replace(self.base, **changes) if changes else self.base)
        log.info("naming switches now %s", overrides or "at the node's settings")


def _well_typed(spec: _Entry, raw: Any) -> bool:
    if spec.kind == "bool":
        return isinstance(raw, bool)
    if spec.kind == "int":
        return isinstance(raw, int) and not isinstance(raw, bool)
    if spec.kind == "float":
        return isinstance(raw, int | float) and not isinstance(raw, bool)
    return raw is None or isinstance(raw, str)
