"""Naming fuzzy watch (Nacos 3.x): which connections watch which service-key patterns, and what
each of them must be told.

Mirrors Nacos's ``NamingFuzzyWatchContextService`` (pattern → watching clients, pattern →
matched service keys, the two limits) and ``FuzzyGroupKeyPattern`` (the pattern syntax), with the
syncs of ``NamingFuzzyWatchRequestHandler`` / ``FuzzyWatchSyncNotifyTask`` (docs/protocol.md
§3.13). Everything here is synchronous and in-loop; what must be sent is handed to a
:class:`FuzzyNotify` callback (the delivery queue in :mod:`shoal.push.fuzzy`).

One deliberate difference from Nacos: a service is *matched* while it has at least one instance
(a publisher in the service index), not while its empty singleton lingers. So ``ADD_SERVICE`` is
reported when a matching service's first instance appears on this node (registered here or
arriving by Distro sync from a peer) and ``DELETE_SERVICE`` when its last instance goes; Nacos
reports the removal only when its empty-service cleaner deletes the singleton a minute or more
later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from shoal.config import Config
from shoal.errors import FuzzyWatchMatchOverLimit, FuzzyWatchPatternOverLimit, InvalidParam
from shoal.model.events import ClientReleased, EventBus, ServiceChanged
from shoal.model.keys import DEFAULT_NAMESPACE, ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager

log = logging.getLogger(__name__)

PATTERN_SPLITTER = ">>"  # Constants.FUZZY_WATCH_PATTERN_SPLITTER
SERVICE_KEY_SPLITTER = "@@"  # NamingUtils.getServiceKey: namespace@@group@@name
ALL = "*"

WATCH_TYPE_WATCH = "WATCH"
WATCH_TYPE_CANCEL_WATCH = "CANCEL_WATCH"

SYNC_INIT = "FUZZY_WATCH_INIT_NOTIFY"
SYNC_FINISH_INIT = "FINISH_FUZZY_WATCH_INIT_NOTIFY"
SYNC_DIFF = "FUZZY_WATCH_DIFF_SYNC_NOTIFY"
SYNC_RESOURCE_CHANGED = "FUZZY_WATCH_RESOURCE_CHANGED"

ADD_SERVICE = "ADD_SERVICE"
DELETE_SERVICE = "DELETE_SERVICE"

SYNC_REQUEST = "NamingFuzzyWatchSyncRequest"
CHANGE_REQUEST = "NamingFuzzyWatchChangeNotifyRequest"

#: (client id, request type, request fields) → queued for delivery.
FuzzyNotify = Callable[[str, str, dict[str, Any]], None]


def service_key_text(service: ServiceKey) -> str:
    """``namespace@@group@@name`` (NamingUtils.getServiceKey)."""
    return SERVICE_KEY_SPLITTER.join((service.namespace or DEFAULT_NAMESPACE, service.group, service.name))


def parse_pattern(pattern: str) -> tuple[str, str, str]:
    """``namespace>>groupPattern>>servicePattern`` → its three parts; InvalidParam otherwise."""
    parts = pattern.split(PATTERN_SPLITTER)
    if len(parts) != 3 or not all(p.strip() for p in parts[1:]):
        raise InvalidParam(f"Param 'groupKeyPattern' is illegal: {pattern!r} is not "
                           "namespace>>groupPattern>>servicePattern")
    return parts[0].strip() or DEFAULT_NAMESPACE, parts[1], parts[2]


def item_matches(pattern: str, value: str) -> bool:
    """FuzzyGroupKeyPattern.itemMatched: exact, ``*``, ``*x*`` (contains), ``*x`` (suffix), ``x*`` (prefix)."""
    if ALL not in pattern:
        return pattern == value
    if pattern == ALL:
        return True
    pure = pattern.replace(ALL, "")
    if pattern.startswith(ALL) and pattern.endswith(ALL):
        return pure in value
    if pattern.startswith(ALL):
        return value.endswith(pure)
    if pattern.endswith(ALL):
        return value.startswith(pure)
    return False


def pattern_matches(parts: tuple[str, str, str], service: ServiceKey) -> bool:
    """FuzzyGroupKeyPattern.matchPattern on a parsed pattern: exact namespace, wildcard group and name."""
    namespace, group, name = parts
    return namespace == (service.namespace or DEFAULT_NAMESPACE) and item_matches(group, service.group) \
        and item_matches(name, service.name)


class _Pattern:
    __slots__ = ("matched", "parts", "watchers")

    def __init__(self, parts: tuple[str, str, str]) -> None:
        self.parts = parts
        self.watchers: set[str] = set()
        self.matched: set[str] = set()


class FuzzyWatchContext:
    """Patterns, their watchers and matched service keys (Nacos NamingFuzzyWatchContextService).

    ``watch`` registers a pattern for a client and queues its initial (or diff) sync in batches;
    ``cancel`` drops it. Model events keep each pattern's matched set current and queue a
    ``NamingFuzzyWatchChangeNotifyRequest`` for its watchers when a service is added or removed.
    A released client's watches go with it.
    """

    def __init__(self, config: Config, bus: EventBus, services: ServiceManager, index: ServiceIndex,
                 notify: FuzzyNotify | None = None) -> None:
        self.config = config
        self.services = services
        self.index = index
        self.notify: FuzzyNotify = notify or (lambda client_id, type_name, fields: None)
        self.patterns: dict[str, _Pattern] = {}
        bus.subscribe(ServiceChanged, self._on_service_changed)
        bus.subscribe(ClientReleased, self._on_released)

    # --- requests -----------------------------------------------------------------------
    def watch(self, client_id: str, pattern: str, received: Iterable[str], initializing: bool) -> None:
        """Register ``pattern`` for ``client_id`` and queue the sync of what it lacks.

        Raises FuzzyWatchPatternOverLimit (nothing registered) when the pattern is new and the
        node already keeps the most patterns, and FuzzyWatchMatchOverLimit (the watch is kept
        and synced) when the pattern matches the most services a pattern may track.
        """
        entry = self.patterns.get(pattern)
        if entry is None:
            parts = parse_pattern(pattern)
            if len(self.patterns) >= self.config.fuzzy_watch_max_pattern_count:
                raise FuzzyWatchPatternOverLimit()
            entry = _Pattern(parts)
            entry.matched = self._initial_matches(parts)
            self.patterns[pattern] = entry
        entry.watchers.add(client_id)
        self._sync(client_id, pattern, entry, set(received), initializing)
        if len(entry.matched) >= self.config.fuzzy_watch_max_match_count:
            raise FuzzyWatchMatchOverLimit()

    def cancel(self, client_id: str, pattern: str) -> None:
        """Drop ``client_id``'s watch of ``pattern`` (a pattern nobody watches is forgotten)."""
        entry = self.patterns.get(pattern)
        if entry is None:
            return
        entry.watchers.discard(client_id)
        if not entry.watchers:
            del self.patterns[pattern]

    def watched_by(self, client_id: str) -> list[str]:
        """The patterns ``client_id`` watches (for introspection and tests)."""
        return sorted(p for p, e in self.patterns.items() if client_id in e.watchers)

    # --- internals ----------------------------------------------------------------------
    def _present(self, service: ServiceKey) -> bool:
        return bool(self.index.publishers_of(service))

    def _initial_matches(self, parts: tuple[str, str, str]) -> set[str]:
        matched: set[str] = set()
        limit = self.config.fuzzy_watch_max_match_count
        for key in self.index.publishers:
            if pattern_matches(parts, key) and self._present(key):
                if len(matched) >= limit:
                    log.warning("fuzzy-watch pattern %s matches more than %d services; the rest are not reported",
                                PATTERN_SPLITTER.join(parts), limit)
                    break
                matched.add(service_key_text(key))
        return matched

    def _sync(self, client_id: str, pattern: str, entry: _Pattern, received: set[str], initializing: bool) -> None:
        adds = sorted(entry.matched - received)
        removes = sorted(received - entry.matched)
        contexts = [{"serviceKey": k, "changedType": ADD_SERVICE} for k in adds]
        contexts += [{"serviceKey": k, "changedType": DELETE_SERVICE} for k in removes]
        size = self.config.fuzzy_watch_batch_size
        batches = [contexts[i:i + size] for i in range(0, len(contexts), size)]
        sync_type = SYNC_INIT if initializing else SYNC_DIFF
        for number, batch in enumerate(batches, start=1):
            self.notify(client_id, SYNC_REQUEST, {
                "module": "naming", "groupKeyPattern": pattern, "syncType": sync_type, "contexts": batch,
                "totalBatch": len(batches), "currentBatch": number})
        if initializing:
            self.notify(client_id, SYNC_REQUEST, {
                "module": "naming", "groupKeyPattern": pattern, "syncType": SYNC_FINISH_INIT, "contexts": [],
                "totalBatch": 0, "currentBatch": 0})

    def _on_service_changed(self, event: ServiceChanged) -> None:
        if not self.patterns:
            return
        service = event.service
        present: bool | None = None
        key = ""
        for entry in self.patterns.values():
            if not pattern_matches(entry.parts, service):
                continue
            if present is None:
                present = self._present(service)
                key = service_key_text(service)
            known = key in entry.matched
            if present and not known:
                if len(entry.matched) >= self.config.fuzzy_watch_max_match_count:
                    continue  # over the limit: not tracked, not reported (as Nacos)
                entry.matched.add(key)
                changed = ADD_SERVICE
            elif not present and known:
                entry.matched.discard(key)
                changed = DELETE_SERVICE
            else:
                continue
            for client_id in entry.watchers:
                self.notify(client_id, CHANGE_REQUEST, {
                    "module": "naming", "serviceKey": key, "changedType": changed,
                    "syncType": SYNC_RESOURCE_CHANGED})

    def _on_released(self, event: ClientReleased) -> None:
        client_id = event.client.client_id
        for pattern in [p for p, e in self.patterns.items() if client_id in e.watchers]:
            self.cancel(client_id, pattern)
