"""Connection keep-alive and limit enforcement (Nacos NacosRuntimeConnectionEjector,
docs/protocol.md §2.6, §2.7).

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
from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar

from shoal.clock import Clock
from shoal.config import Config
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

#: Probes in flight at once during a scan.
PROBE_WAVE = 256


class KeptConnection(Protocol):
    """What the scan reads of one connection (the gRPC transport's Connection fits)."""

    expelled_at_ms: int | None  # set by the scan when it sends ConnectResetRequest

    @property
    def connection_id(self) -> str: ...

    @property
    def registered(self) -> bool: ...

    @property
    def created_mono_ms(self) -> int: ...

    @property
    def closed(self) -> bool: ...


C = TypeVar("C", bound=KeptConnection)
C_contra = TypeVar("C_contra", bound=KeptConnection, contravariant=True)


class ConnectionTable(Protocol[C]):
    """What the scan needs of the connection table (the gRPC ConnectionManager fits)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def by_id(self) -> Mapping[str, C]: ...

    def unregister(self, connection_id: str, reason: str) -> bool: ...

    def over_limit(self) -> list[C]:
        """Connections to expel under the current limit rules."""

    def idle_connections(self, idle_ms: int) -> list[C]: ...

    def touch(self, conn: C) -> None: ...


class Prober(Protocol[C_contra]):
    """Sends the server → client requests of the scan (the SDK server fits)."""

    async def probe(self, conn: C_contra, timeout_ms: int) -> bool: ...

    async def reset(self, conn: C_contra, redirect: str) -> None: ...


class LimitRules(Protocol):
    """The connection limit rule source, re-read when its file changed (blocking: small file)."""

    def reload_if_changed(self) -> bool: ...


class ConnectionKeepAlive(Generic[C]):
    """One scan of the connection table; run it with a Periodic."""

    def __init__(self, config: Config, manager: ConnectionTable[C], prober: Prober[C],
                 limits: LimitRules | None) -> None:
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
