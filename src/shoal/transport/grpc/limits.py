"""Connection limit rules (Nacos 2.0–2.2 ConnectionLimitRule, docs/protocol.md §2.7).

The rule file is JSON: ``countLimit`` (all SDK connections), ``countLimitPerClientIpDefault``,
``countLimitPerClientIp`` {ip: n}, ``countLimitPerClientApp`` {app: n}, ``monitorIpList``;
-1 or absent means unlimited. Per client ip the limit is the ip's own, else its app's, else
the default. It is re-read whenever its modification time changes.

A node of workers (``--workers N``) enforces the rule against the **node's** connections: each
worker adds what its siblings last said they hold (:class:`SiblingConnections`, fed by the member
reports the workers exchange every ``shoal.member.report-interval-ms``) to its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimitRule:
    """One parsed limit rule file (Nacos 2.0–2.2 ``ConnectionLimitRule``); -1 means unlimited,
    and ``limit_for`` picks the per-ip, per-app or default limit for a client."""

    count_limit: int = -1
    count_limit_per_ip_default: int = -1
    count_limit_per_ip: dict[str, int] = field(default_factory=dict)
    count_limit_per_app: dict[str, int] = field(default_factory=dict)
    monitor_ips: frozenset[str] = frozenset()

    @property
    def limits_per_ip(self) -> bool:
        """True when some client ip may be limited (a default, an ip's or an app's limit)."""
        return (self.count_limit_per_ip_default >= 0 or any(v >= 0 for v in self.count_limit_per_ip.values())
                or any(v >= 0 for v in self.count_limit_per_app.values()))

    def limit_for(self, client_ip: str, app: str) -> int:
        limit = self.count_limit_per_ip.get(client_ip, -1)
        if limit < 0:
            limit = self.count_limit_per_app.get(app, -1)
        if limit < 0:
            limit = self.count_limit_per_ip_default
        return limit

    @classmethod
    def parse(cls, text: str) -> ConnectionLimitRule:
        data = json.loads(text) if text.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("the rule must be a JSON object")

        def number(key: str) -> int:
            value = data.get(key, -1)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key} must be an integer")
            return value

        def table(key: str) -> dict[str, int]:
            value = data.get(key) or {}
            if not isinstance(value, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()
            ):
                raise ValueError(f"{key} must map names to integers")
            return {str(k): int(v) for k, v in value.items()}

        monitor = data.get("monitorIpList") or []
        if not isinstance(monitor, list):
            raise ValueError("monitorIpList must be a list")
        return cls(number("countLimit"), number("countLimitPerClientIpDefault"),
                   table("countLimitPerClientIp"), table("countLimitPerClientApp"),
                   frozenset(str(ip) for ip in monitor))


class LimitRuleFile:
    """Reloads the rule when the file's mtime changes; a bad file keeps the last good rule."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rule = ConnectionLimitRule()
        self._mtime_ns: int | None = None

    def reload_if_changed(self) -> bool:
        """Blocking (stat + read of a small file): call it through the executor helper."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            if self._mtime_ns is not None:
                log.info("connection limit rule %s removed: no limits", self.path)
                self.rule, self._mtime_ns = ConnectionLimitRule(), None
                return True
            return False
        except OSError as exc:
            log.warning("cannot stat connection limit rule %s: %s", self.path, exc)
            return False
        if mtime == self._mtime_ns:
            return False
        self._mtime_ns = mtime
        try:
            self.rule = ConnectionLimitRule.parse(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.error("connection limit rule %s is invalid, keeping the previous one: %s", self.path, exc)
            return False
        log.info("connection limit rule loaded from %s: %s", self.path, self.rule)
        return True


#: At most this many client ips a worker reports to its siblings (the most connected first).
MAX_REPORTED_IPS = 10_000


@dataclass(frozen=True, slots=True)
class _Heard:
    total: int
    per_ip: dict[str, int]
    at_ms: int


class SiblingConnections:
    """The SDK connections of this worker's sibling workers, as their last member reports said.

    A worker's report to a sibling carries ``{"total": n, "perIp": {ip: n}}`` (:meth:`outgoing`;
    ``perIp`` only while the rule limits some ip, the :data:`MAX_REPORTED_IPS` most connected);
    what a sibling sent is kept (:meth:`received`) for ``max_age_ms`` (a sibling that stopped
    reporting took its connections with it). The limit checks add :meth:`total` and
    :meth:`per_ip` to the worker's own counts, so the node's total is at most one report
    interval stale. A single-process node has none (no siblings: both are 0)."""

    def __init__(self, own: Callable[[], tuple[int, Mapping[str, int]]],
                 rule: Callable[[], ConnectionLimitRule], now_ms: Callable[[], int], max_age_ms: int) -> None:
        self._own = own
        self._rule = rule
        self._now_ms = now_ms
        self.max_age_ms = max_age_ms
        self._heard: dict[str, _Heard] = {}

    def outgoing(self) -> dict[str, Any]:
        """What this worker tells its siblings: its SDK connections, and per client ip when needed."""
        total, per_ip = self._own()
        figures: dict[str, Any] = {"total": total}
        if self._rule().limits_per_ip:
            items = list(per_ip.items())
            if len(items) > MAX_REPORTED_IPS:
                items = sorted(items, key=lambda kv: -kv[1])[:MAX_REPORTED_IPS]
            figures["perIp"] = dict(items)
        return figures

    def received(self, member: str, figures: Any) -> None:
        """A sibling's figures from its report (or its answer to ours); a malformed one is ignored."""
        if not isinstance(figures, dict):
            return
        total = figures.get("total")
        per_ip = figures.get("perIp") or {}
        if isinstance(total, bool) or not isinstance(total, int) or total < 0 or not isinstance(per_ip, dict):
            return
        clean = {str(ip): n for ip, n in per_ip.items() if isinstance(n, int) and not isinstance(n, bool) and n > 0}
        self._heard[member] = _Heard(total, clean, self._now_ms())

    def _fresh(self) -> list[_Heard]:
        oldest = self._now_ms() - self.max_age_ms
        return [h for h in self._heard.values() if h.at_ms >= oldest]

    def total(self) -> int:
        """The siblings' SDK connections as last heard."""
        return sum(h.total for h in self._fresh())

    def per_ip(self, client_ip: str) -> int:
        """The siblings' SDK connections from ``client_ip`` as last heard."""
        return sum(h.per_ip.get(client_ip, 0) for h in self._fresh())

    def by_member(self) -> dict[str, int]:
        """Each sibling's last heard total (fresh ones only), for the loader's figures."""
        oldest = self._now_ms() - self.max_age_ms
        return {m: h.total for m, h in sorted(self._heard.items()) if h.at_ms >= oldest}
