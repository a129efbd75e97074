"""Connection limit rules (Nacos 2.0–2.2 ConnectionLimitRule, docs/protocol.md §2.7).

The rule file is JSON: ``countLimit`` (all SDK connections), ``countLimitPerClientIpDefault``,
``countLimitPerClientIp`` {ip: n}, ``countLimitPerClientApp`` {app: n}, ``monitorIpList``;
-1 or absent means unlimited. Per client ip the limit is the ip's own, else its app's, else
the default. It is re-read whenever its modification time changes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

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
