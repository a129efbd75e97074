"""Connection keep-alive and limit enforcement (Nacos NacosRuntimeConnectionEjector, seeds §6.2).

Every ``check-interval-ms`` (3 s): reload the limit rule if its file changed; unregister
connections expelled on the previous round that are still here (a client that ignored
ConnectResetRequest — the Python SDK cannot parse it); send ConnectResetRequest to the
connections over the limits; forget transports that never finished their setup; probe every
connection idle for ``keep-alive-ms`` (20 s) with ClientDetectionRequest and unregister those
that do not answer within ``detection-timeout-ms`` (1 s). Unregistering releases the naming
client: its instances are removed and subscribers pushed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from shoal.config import Config
from shoal.tasks import run_blocking
from shoal.transport.grpc.connections import Connection, ConnectionManager
from shoal.transport.grpc.limits import LimitRuleFile

log = logging.getLogger(__name__)

#: Probes in flight at once during a scan.
PROBE_WAVE = 256


class Prober(Protocol):
    async def probe(self, conn: Connection, timeout_ms: int) -> bool: ...

    async def reset(self, conn: Connection, redirect: str) -> None: ...


class ConnectionKeepAlive:
    """One scan of the connection table; run it with a Periodic."""

    def __init__(self, config: Config, manager: ConnectionManager, prober: Prober,
                 limits: LimitRuleFile | None) -> None:
        self.config = config
        self.manager = manager
        self.prober = prober
        self.limits = limits

    async def scan(self) -> dict[str, int]:
        """Run one round; returns counts of what it did (for logs and tests)."""
        manager, clock = self.manager, self.manager.clock
        if self.limits is not None:
            await run_blocking(self.limits.reload_if_changed)
        now = clock.monotonic_ms()
        stats = {"expelled": 0, "reset": 0, "unset_dropped": 0, "probed": 0, "probe_failed": 0}

        for conn in [c for c in manager.by_id.values() if c.expelled_at_ms is not None]:
            manager.unregister(conn.connection_id, "over connection limit")
            stats["expelled"] += 1
        over = manager.over_limit()
        for conn in over:
            conn.expelled_at_ms = now
        if over:
            log.warning("%d connections over the limit rules: sending ConnectResetRequest", len(over))
            await asyncio.gather(*(self.prober.reset(c, self.config.connection_redirect_address) for c in over))
            stats["reset"] = len(over)

        setup_deadline = now - self.config.connection_setup_timeout_ms
        for conn in [c for c in manager.by_id.values() if not c.registered and c.created_mono_ms <= setup_deadline]:
            manager.unregister(conn.connection_id, "no ConnectionSetupRequest in time")
            stats["unset_dropped"] += 1

        idle = [c for c in manager.idle_connections(self.config.connection_keep_alive_ms)
                if c.registered and c.expelled_at_ms is None]
        # Probes go out in bounded waves: 10,000 probes created at once stall the loop for
        # seconds, and a probe's 1 s timeout must measure the client, not our own backlog.
        for start in range(0, len(idle), PROBE_WAVE):
            wave = [c for c in idle[start:start + PROBE_WAVE] if not c.closed]
            results = await asyncio.gather(
                *(self.prober.probe(c, self.config.client_detection_timeout_ms) for c in wave))
            stats["probed"] += len(wave)
            for conn, alive in zip(wave, results, strict=True):
                if alive:
                    manager.touch(conn)
                elif not conn.closed:
                    manager.unregister(conn.connection_id, "keep-alive probe failed")
                    stats["probe_failed"] += 1
        if idle:
            log.info("keep-alive: probed %d idle connections, %d did not answer", len(idle), stats["probe_failed"])
        return stats
