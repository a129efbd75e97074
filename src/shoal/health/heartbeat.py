"""Heartbeat checker for ip:port clients (Nacos ClientBeatCheckTaskV2, docs/protocol.md §4.3).

Every ``beat-check-interval-ms`` (5 s) one call of the expiry kernel over the beat table finds
the instances past a deadline. For each, unless health checking is switched off, another node
is responsible for its ``ip:port`` (Distro), or ``enableClientBeat=true`` is set on the service
metadata (the instance's own value was applied when it was tracked):

* past ``preserved.ip.delete.timeout`` (30 s) with ``nacos.naming.expireInstance`` on → the
  instance is removed (ExpiredInstanceChecker);
* healthy and past ``preserved.heart.beat.timeout`` (15 s) → marked unhealthy
  (UnhealthyInstanceChecker); a later beat marks it healthy again.

Both publish the model events, so subscribers (gRPC ones included) are pushed and Distro syncs
the client. A round that comes far too late (the node was stopped, e.g. SIGSTOP, or its loop
stalled: more than ``STALL_GRACE_MS`` past the interval) judges nothing: beats sent meanwhile went
to the nodes that stood in for it, so every beat window restarts instead (docs/protocol.md §5.5).
The same round releases empty ip:port clients this node is responsible for once
they have been idle for ``nacos.naming.client.expired.time`` (IpPortBasedClient.isExpire).
"""

from __future__ import annotations

import logging

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.model.client import ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import no_beat_for
from shoal.model.ip_port import BeatTable, Responsibility, client_beat_disabled, responsible_tag
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceManager

log = logging.getLogger(__name__)

#: A beat-check round this much later than its interval means this node was not running.
STALL_GRACE_MS = 10_000


class HeartbeatChecker:
    """One round of the beat check; run it with a Periodic (app.py owns it)."""

    def __init__(self, live: LiveConfig, clock: Clock, clients: ClientManager, services: ServiceManager,
                 beats: BeatTable, responsibility: Responsibility) -> None:
        self.live = live  # healthCheckEnabled is a switch: read each time (self.config)
        self.clock = clock
        self.clients = clients
        self.services = services
        self.beats = beats
        self.responsibility = responsibility
        self._last_tick_ms: int | None = None

    @property
    def config(self) -> Config:
        return self.live.current

    async def tick(self) -> None:
        """One periodic round; after a stop or a stall longer than ``STALL_GRACE_MS`` past the
        interval, the beat windows restart instead of being judged."""
        now = self.clock.monotonic_ms()
        last, self._last_tick_ms = self._last_tick_ms, now
        if last is not None and now - last > self.config.beat_check_interval_ms + STALL_GRACE_MS:
            restarted = self.beats.renew_all(now)
            log.warning("the beat check did not run for %d ms (this node was stopped or stalled): the beat "
                        "windows of %d instances restart instead of being judged", now - last, restarted)
        self.scan()

    def scan(self) -> dict[str, int]:
        """Run one round; returns counts (for logs and tests)."""
        stats = {"unhealthy": 0, "removed": 0, "clients_released": 0, "skipped": 0}
        if self.config.health_check_enabled:
            self._check_beats(stats)
        self._release_idle_clients(stats)
        return stats

    def _check_beats(self, stats: dict[str, int]) -> None:
        to_unhealthy, to_remove = self.beats.due(self.clock.monotonic_ms())
        if not to_unhealthy and not to_remove:
            return
        if not self.config.expire_instance:  # no removal: overdue instances only turn unhealthy
            to_unhealthy, to_remove = to_unhealthy + to_remove, []
        owner_of = self.responsibility.owner_of
        for key, remove in [*((k, True) for k in to_remove), *((k, False) for k in to_unhealthy)]:
            client_id, service = key
            client = self.clients.get(client_id)
            if client is None:
                self.beats.untrack(client_id, service)
                continue
            record = self.services.get(service)
            if owner_of(responsible_tag(client_id)) is not None or (
                    record is not None and client_beat_disabled(record.metadata)):
                # Not ours to judge now: restart its window so the next rounds do not rescan it,
                # and a node that becomes responsible gives it a full timeout (as Distro verify does).
                self.beats.renew(client_id, service, self.clock.monotonic_ms())
                stats["skipped"] += 1
                continue
            idle_ms = self._idle_ms(client_id, service)  # read first: expiry drops the beat record
            if remove:
                if self.beats.expire(client, service, no_beat_for(idle_ms)):
                    stats["removed"] += 1
                    log.info("[AUTO-DELETE-IP] %s of %s: no beat for %d ms", client_id, service, idle_ms)
            elif self.beats.set_health(client, service, False, no_beat_for(idle_ms)):
                stats["unhealthy"] += 1
                log.info("[IP-DISABLED] %s of %s: no beat for %d ms", client_id, service, idle_ms)

    def _idle_ms(self, client_id: str, service: ServiceKey) -> int:
        last = self.beats.last_beat_ms(client_id, service)
        return -1 if last is None else self.clock.monotonic_ms() - last

    def _release_idle_clients(self, stats: dict[str, int]) -> None:
        deadline = self.clock.monotonic_ms() - self.config.client_expired_time_ms
        owner_of = self.responsibility.owner_of
        idle = [c.client_id for c in self.clients
                if c.kind is ClientKind.IP_PORT and not c.publications and c.last_updated_ms < deadline
                and owner_of(responsible_tag(c.client_id)) is None]
        for client_id in idle:
            self.clients.remove(client_id, "expired: no instances and idle")
        stats["clients_released"] = len(idle)
