"""Server-side health checks of persistent instances (Nacos HealthCheckReactor with the v2
TcpHealthCheckProcessor / HttpHealthCheckProcessor / HealthCheckCommonV2).

Persistent instances cannot heartbeat, so the member responsible for their service probes them:

* **who:** the owner of the service's name under the Distro hash over the healthy members
  (``owner_of``, the same mapper as ip:port clients), so exactly one node checks a service
  while the members agree, and another takes over when the owner leaves the healthy list;
* **what:** the cluster's health checker from the service's CP document (``PUT /v1/ns/cluster``):
  ``TCP`` (a connect), ``HTTP`` (a GET of ``path`` with ``headers``, healthy when the status is
  ``expectedResponseCode``, default 200) or ``NONE``; the port is the instance's own when
  ``useInstancePort4Check`` is true, else the cluster's ``checkPort``. MySQL checks are not
  offered (no MySQL client in the server);
* **when:** every instance has its own next check time, ``interval + random(0, random(0,
  jitter))`` after its last (Nacos: ``checkRtNormalized = 2000 + random(0, random(0, 5000))``);
  a check whose probe does not answer within ``timeout`` fails (Nacos: 500 ms);
* **flips:** after ``check_times`` consecutive results that disagree with the stored health
  (Nacos ``switchDomain.checkTimes``, 3) the new health is written to the CP store with a
  compare-and-put; every node's view applies it and the ordinary push path tells subscribers.
  Both ``check_times`` and whether a flip happens at all (``autoChangeHealthCheckEnabled``) are
  naming switches, read from the node's :class:`~shoal.config.LiveConfig` at each result.

Probes run as tasks bounded by a semaphore (``concurrency``) and never block the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shoal.config import Config, LiveConfig
from shoal.errors import NacosError
from shoal.model.instance import InstanceInfo
from shoal.service_layer.persistent import ClusterSettings, PersistentNaming, service_name

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Track:
    """What the checker remembers of one instance between checks."""

    due_ms: int
    fails: int = 0
    oks: int = 0
    running: bool = False


@dataclass(frozen=True, slots=True)
class CheckSettings:
    """The checker's knobs (from ``shoal.health.*`` settings)."""

    interval_ms: int = 2000
    jitter_ms: int = 5000
    timeout_ms: int = 500
    concurrency: int = 64

    @classmethod
    def of(cls, config: Config) -> CheckSettings:
        return cls(config.health_check_interval_ms, config.health_check_jitter_ms, config.health_check_timeout_ms,
                   config.health_check_concurrency)


async def tcp_check(host: str, port: int, timeout_s: float) -> bool:
    """Healthy when a TCP connection opens within the timeout (TcpHealthCheckProcessor)."""
    try:
        async with asyncio.timeout(timeout_s):
            _reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def http_check(host: str, port: int, path: str, headers: Mapping[str, str], expected: int,
                     timeout_s: float) -> bool:
    """Healthy when ``GET path`` answers ``expected`` within the timeout (HttpHealthCheckProcessor)."""
    if not path.startswith("/"):
        path = "/" + path
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "User-Agent: Nacos-Server", "Connection: close"]
    lines.extend(f"{k}: {v}" for k, v in headers.items() if "\r" not in k + v and "\n" not in k + v)
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(request)
                await writer.drain()
                status_line = await reader.readline()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False
    parts = status_line.split()
    return len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) == expected


class PersistentHealthChecker:
    """Probes the persistent instances of the services this node is responsible for."""

    def __init__(self, persistent: PersistentNaming, responsible: Callable[[str], bool],
                 monotonic_ms: Callable[[], int], settings: CheckSettings, live: LiveConfig,
                 on_check: Callable[[str], None] | None = None, rng: random.Random | None = None) -> None:
        self.persistent = persistent
        self.live = live  # checkTimes and autoChangeHealthCheckEnabled: switches, read at each result
        self.responsible = responsible  # service name -> does this node check it
        self.monotonic_ms = monotonic_ms
        self.settings = settings
        self.on_check = on_check  # called with the check type after each probe (a metric)
        self._rng = rng or random.Random()
        self._tracks: dict[str, _Track] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(settings.concurrency)
        self.checks = 0

    def _next_due(self, now: int) -> int:
        jitter = self.settings.jitter_ms
        extra = self._rng.randint(0, self._rng.randint(0, jitter)) if jitter > 0 else 0
        return now + self.settings.interval_ms + extra

    async def tick(self) -> None:
        """Start the checks that are due (called often by a Periodic; returns at once)."""
        now = self.monotonic_ms()
        seen: set[str] = set()
        for service in self.persistent.persistent_services():
            if not self.responsible(service_name(service)):
                continue
            for name, inst in self.persistent.persistent_instances(service).items():
                seen.add(name)
                track = self._tracks.get(name)
                if track is None:
                    track = self._tracks[name] = _Track(self._next_due(now) - self.settings.interval_ms)
                if track.running or track.due_ms > now:
                    continue
                settings = self.persistent.cluster_settings(service, inst.cluster)
                kind = str(settings.health_checker.get("type", "TCP")).upper()
                if kind == "NONE":
                    track.due_ms = self._next_due(now)
                    continue
                track.running = True
                task = asyncio.get_running_loop().create_task(self._check(name, inst, settings, kind, track))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        for name in [n for n in self._tracks if n not in seen]:
            del self._tracks[name]  # gone, or another member's now

    async def _check(self, name: str, inst: InstanceInfo, settings: ClusterSettings, kind: str,
                     track: _Track) -> None:
        try:
            async with self._slots:
                ok = await self._probe(inst, settings, kind)
            self.checks += 1
            if self.on_check is not None:
                self.on_check(kind)
            await self._record(name, inst, ok, track)
        except NacosError as exc:  # CpUnavailable: the flip is retried after the next check
            log.warning("health flip of %s not written: %s", name, exc.message)
        except Exception:
            log.exception("health check of %s failed unexpectedly", name)
        finally:
            track.running = False
            track.due_ms = self._next_due(self.monotonic_ms())

    async def _probe(self, inst: InstanceInfo, settings: ClusterSettings, kind: str) -> bool:
        port = inst.port if settings.use_instance_port else settings.check_port
        timeout_s = self.settings.timeout_ms / 1000
        if kind == "HTTP":
            checker: Mapping[str, Any] = settings.health_checker
            headers = _headers(checker.get("headers"))
            try:
                expected = int(checker.get("expectedResponseCode", 200))
            except (TypeError, ValueError):
                expected = 200
            return await http_check(inst.ip, port, str(checker.get("path") or "/"), headers, expected, timeout_s)
        return await tcp_check(inst.ip, port, timeout_s)

    async def _record(self, name: str, inst: InstanceInfo, ok: bool, track: _Track) -> None:
        if ok:
            track.fails = 0
            track.oks += 1
        else:
            track.oks = 0
            track.fails += 1
        current = self.live.current
        flip = (ok != inst.healthy and (track.oks if ok else track.fails) >= current.health_check_times
                and current.health_check_auto_change)
        if flip and await self.persistent.set_health(name, ok):
                log.info("persistent instance %s is now %s", name, "healthy" if ok else "unhealthy")

    async def stop(self) -> None:
        """Cancel running probes (the Periodic that ticks this is stopped by its owner)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _headers(raw: Any) -> dict[str, str]:
    """Nacos keeps HTTP check headers as ``k1:v1|k2:v2``; a JSON object is accepted too."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    out: dict[str, str] = {}
    if isinstance(raw, str):
        for part in raw.split("|"):
            key, sep, value = part.partition(":")
            if sep and key.strip():
                out[key.strip()] = value.strip()
    return out
