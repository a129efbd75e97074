"""Subscriber fan-out with per-service coalescing, bounded retry and a bounded backlog.

Nacos's PushDelayTaskExecuteEngine keys push tasks by service and merges them (to-all wins,
targeted sets are unioned, the earliest start is kept), fires them after
``nacos.naming.push.pushTaskDelay``, and retries a failed subscriber after
``pushTaskRetryDelay``. Here, additionally, each connection has at most
``max-pending-requests`` pushes in flight and at most one per service: a change that arrives
while that service's push is unacknowledged marks it dirty and the newest data is sent when
the ack comes back, so a slow subscriber costs a bounded amount of memory and never receives
stale data after fresh data.

Three more rules, per subscriber and service (docs/protocol.md §3.8):

* **No push for nothing.** The engine keeps a digest of the last ServiceInfo each subscriber
  acknowledged (everything but ``lastRefTime``); a push whose content equals it is not sent,
  whatever write scheduled it (an identical re-register, metadata or weight edit, health
  report, persistent write or Distro apply).
* **Empty-push protection** (``shoal.naming.push.empty-protection``, or the service metadata key
  :data:`EMPTY_PROTECTION_KEY`): a push without hosts to a subscriber whose last list had hosts is
  withheld; the service counts as protected until a list with hosts goes out again.
* **Push lag.** Each ack's lag (from the change that caused the push) lands in a bounded
  per-connection window (:data:`LAG_WINDOW` acks, the last :data:`LAG_WINDOW_MS`); an unacked
  change keeps its start time, so a subscriber that stops acking shows a growing pending age.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.errors import PushGone
from shoal.model.events import (
    ClientReleased,
    ClientSubscribedService,
    ClientUnsubscribedService,
    EventBus,
    ServiceChanged,
)
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceManager
from shoal.service_layer.catalog import PushLag
from shoal.tasks import wait_until_due

log = logging.getLogger(__name__)

__all__ = ["EMPTY_PROTECTION_KEY", "PendingPush", "PushGone", "PushMetrics", "PushObserver", "PushSender",
           "PushService"]

#: Service metadata key that turns empty-push protection on ("true") or off ("false") for one
#: service, whatever ``shoal.naming.push.empty-protection`` says.
EMPTY_PROTECTION_KEY = "shoal.push.empty-protection"
#: Acks kept per connection for its lag figures, and how far back they count.
LAG_WINDOW = 64
LAG_WINDOW_MS = 5 * 60_000


class PushSender(Protocol):
    """Delivers one NotifySubscriberRequest and returns the subscriber's ack body.

    Raises :class:`shoal.errors.PushGone` (re-exported here) when the connection is gone and
    TimeoutError when no ack came in time.
    """

    async def send_push(self, client_id: str, service_info_json: str, timeout_ms: int) -> bool: ...


#: How a ServiceInfo JSON without hosts ends (``service_info_json`` writes ``hosts`` last, compact).
_EMPTY_HOSTS_TAIL = '"hosts":[]}'


class PushObserver(Protocol):
    """Told of every push that went out: the subscriber, the ServiceInfo JSON sent, when (wall
    ms) it was sent and acked (None: no ack) and the result (the history log keeps them)."""

    def pushed(self, client_id: str, service: ServiceKey, payload: str, sent_ms: int, acked_ms: int | None,
               result: str) -> None: ...


class PushMetrics(Protocol):
    """Where push outcomes are counted (``result`` label, latency when the push was sent)."""

    def push_done(self, result: str, latency_s: float | None, empty: bool = False) -> None: ...

    def push_acked(self, namespace: str, transport: str, seconds: float) -> None: ...


@dataclass(slots=True)
class PendingPush:
    """A merged push task for one service (PushDelayTask)."""

    due_ms: int
    changed_ms: int
    to_all: bool
    targets: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Subscriber:
    inflight: set[ServiceKey] = field(default_factory=set)
    dirty: dict[ServiceKey, None] = field(default_factory=dict)
    since: dict[ServiceKey, int] = field(default_factory=dict)
    attempts: dict[ServiceKey, int] = field(default_factory=dict)
    #: per service: digest of the last acked ServiceInfo (lastRefTime aside), and whether it had hosts
    acked: dict[ServiceKey, tuple[int, bool]] = field(default_factory=dict)
    #: (ack time, lag ms) of the last acks, monotonic; bounded
    lags: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=LAG_WINDOW))


def content_digest(payload: str) -> int:
    """Digest of a ServiceInfo JSON without its ``lastRefTime`` value (always fresh)."""
    start = payload.find('"lastRefTime":')
    if start < 0:
        return hash(payload)
    end = payload.find(",", start)
    return hash((payload[:start], payload[end:]))


def _p99(values: list[int]) -> int:
    values.sort()
    return values[max(math.ceil(len(values) * 0.99) - 1, 0)]


class PushService:
    """Schedules and executes pushes. ``process_due`` can be stepped by hand in tests."""

    def __init__(self, live: LiveConfig, clock: Clock, bus: EventBus, sender: PushSender,
                 subscribers_of: Callable[[ServiceKey], set[str]],
                 payload_for: Callable[[str, ServiceKey], str | None],
                 metrics: PushMetrics | None = None, services: ServiceManager | None = None,
                 transport: str = "grpc", observer: PushObserver | None = None) -> None:
        self.live = live  # pushEnabled is a switch: read each time (self.config)
        self.clock = clock
        self.sender = sender
        self.subscribers_of = subscribers_of
        self.payload_for = payload_for
        self.metrics = metrics
        self.services = services
        self.transport = transport
        self.observer = observer
        #: services whose empty push was withheld, with when (monotonic ms) it first was
        self.protected: dict[ServiceKey, int] = {}
        self.pending: dict[ServiceKey, PendingPush] = {}
        self._state: dict[str, _Subscriber] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        bus.subscribe(ServiceChanged, self._on_service_changed)
        bus.subscribe(ClientSubscribedService, self._on_subscribed)
        bus.subscribe(ClientReleased, self._on_released)
        bus.subscribe(ClientUnsubscribedService, self._on_unsubscribed)

    @property
    def config(self) -> Config:
        return self.live.current

    # --- scheduling ---------------------------------------------------------------------
    def schedule(self, service: ServiceKey, targets: set[str] | None = None, delay_ms: int | None = None,
                 changed_ms: int | None = None) -> None:
        """Add a push task; ``targets=None`` means every subscriber of the service."""
        if not self.config.push_enabled:
            return
        now = self.clock.monotonic_ms()
        due = now + (self.config.push_task_delay_ms if delay_ms is None else delay_ms)
        changed = now if changed_ms is None else changed_ms
        task = self.pending.get(service)
        if task is None:
            self.pending[service] = PendingPush(due, changed, targets is None, set(targets or ()))
        else:  # merge: to-all wins, targets unioned, the earliest start kept
            task.due_ms = min(task.due_ms, due)
            task.changed_ms = min(task.changed_ms, changed)
            if targets is None:
                task.to_all, task.targets = True, set()
            elif not task.to_all:
                task.targets |= targets
        self._wake.set()

    def _on_service_changed(self, event: ServiceChanged) -> None:
        # Nobody to tell: a later first subscription schedules its own push.
        if self.subscribers_of(event.service):
            self.schedule(event.service)

    def _on_subscribed(self, event: ClientSubscribedService) -> None:
        # The subscribe answer carried the current list: what was acked before says nothing now.
        self._forget(event.client_id, event.service)
        if event.first:  # Nacos pushes once more after a first subscription
            self.schedule(event.service, {event.client_id})

    def _on_unsubscribed(self, event: ClientUnsubscribedService) -> None:
        self._forget(event.client_id, event.service)

    def _forget(self, client_id: str, service: ServiceKey) -> None:
        """What the subscriber held of the service is unknown from now on (a new subscription)."""
        state = self._state.get(client_id)
        if state is not None:
            state.acked.pop(service, None)
            if service not in state.inflight:
                state.since.pop(service, None)
                state.attempts.pop(service, None)
                state.dirty.pop(service, None)

    def _on_released(self, event: ClientReleased) -> None:
        self._state.pop(event.client.client_id, None)

    # --- execution ----------------------------------------------------------------------
    def process_due(self) -> int:
        """Dispatch every task whose time has come; returns how many services fired."""
        now = self.clock.monotonic_ms()
        due = [key for key, task in self.pending.items() if task.due_ms <= now]
        for key in due:
            task = self.pending.pop(key)
            subscribers = self.subscribers_of(key)
            targets = subscribers if task.to_all else task.targets & subscribers
            for client_id in targets:
                self._dispatch(client_id, key, task.changed_ms)
        return len(due)

    def next_due_ms(self) -> int | None:
        return min((t.due_ms for t in self.pending.values()), default=None)

    def _dispatch(self, client_id: str, service: ServiceKey, changed_ms: int) -> None:
        state = self._state.get(client_id)
        if state is None:
            state = self._state[client_id] = _Subscriber()
        state.since[service] = min(state.since.get(service, changed_ms), changed_ms)
        if service in state.inflight or len(state.inflight) >= self.config.push_backlog_per_connection:
            state.dirty[service] = None
            return
        state.inflight.add(service)
        task = asyncio.get_running_loop().create_task(self._push(client_id, service, state))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _push(self, client_id: str, service: ServiceKey, state: _Subscriber) -> None:
        result = "failed"
        empty = False
        payload: str | None = None
        sent_ms: int | None = None
        try:
            payload = self.payload_for(client_id, service)
            if payload is None:  # unsubscribed meanwhile
                result = "skipped"
                return
            empty = payload.endswith(_EMPTY_HOSTS_TAIL)  # Nacos's emptyPush: a ServiceInfo without hosts
            digest = content_digest(payload)
            last = state.acked.get(service)
            if last is not None and last[0] == digest:  # the subscriber holds this list already
                result = "unchanged"
                return
            if empty and last is not None and last[1] and self.empty_protected(service):
                result = "protected"  # the subscriber keeps its last list with hosts
                self.protected.setdefault(service, self.clock.monotonic_ms())
                return
            if not empty:
                self.protected.pop(service, None)
            sent_ms = self.clock.now_ms()
            ok = await self.sender.send_push(client_id, payload, self.config.push_task_timeout_ms)
            result = "success" if ok else "failed"
            if ok and self._state.get(client_id) is state:
                state.acked[service] = (digest, not empty)
        except PushGone:
            result = "gone"
        except TimeoutError:
            result = "timeout"
        except asyncio.CancelledError:
            result = "cancelled"
            raise
        except Exception:
            log.exception("push of %s to %s failed unexpectedly", service, client_id)
        finally:
            if self.observer is not None and sent_ms is not None and payload is not None and result != "cancelled":
                self.observer.pushed(client_id, service, payload, sent_ms,
                                     self.clock.now_ms() if result == "success" else None, result)
            self._finish(client_id, service, state, result, empty)

    def _finish(self, client_id: str, service: ServiceKey, state: _Subscriber, result: str,
                empty: bool = False) -> None:
        state.inflight.discard(service)
        latency: float | None = None
        if result in ("success", "gone", "skipped", "cancelled", "unchanged", "protected"):
            since = state.since.pop(service, None)
            state.attempts.pop(service, None)
            if result == "success" and since is not None:
                now = self.clock.monotonic_ms()
                lag_ms = max(now - since, 0)
                latency = lag_ms / 1000
                state.lags.append((now, lag_ms))
                if self.metrics is not None:
                    self.metrics.push_acked(service.namespace, self.transport, latency)
        else:
            attempts = state.attempts.get(service, 0) + 1
            if attempts <= self.config.push_max_retries and self._state.get(client_id) is state:
                state.attempts[service] = attempts
                self.schedule(service, {client_id}, delay_ms=self.config.push_task_retry_delay_ms,
                              changed_ms=state.since.get(service))
            else:
                log.warning("push of %s to %s gave up after %d attempts (%s)", service, client_id, attempts, result)
                state.attempts.pop(service, None)
                # ``since`` stays: the subscriber still lacks this change, its pending age keeps
                # growing, and the next push's lag counts from it.
        if self.metrics is not None and result != "cancelled":
            self.metrics.push_done(result, latency, empty)
        if self._state.get(client_id) is not state:
            return
        # Newer data waited for this ack, or pushes waited for room in the backlog.
        while state.dirty and len(state.inflight) < self.config.push_backlog_per_connection:
            next_service = next(iter(state.dirty))
            if next_service in state.inflight:
                break
            del state.dirty[next_service]
            self._dispatch(client_id, next_service, state.since.get(next_service, self.clock.monotonic_ms()))

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="push-engine")

    async def stop(self) -> None:
        tasks = [t for t in (self._runner, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._runner = None

    async def _run(self) -> None:
        while True:
            try:
                self.process_due()
            except Exception:
                log.exception("push engine tick failed")
            next_due = self.next_due_ms()
            self._wake.clear()
            await wait_until_due(self._wake, next_due, self.clock.monotonic_ms())

    # --- empty-push protection ------------------------------------------------------------------
    def empty_protected(self, service: ServiceKey) -> bool:
        """Whether an empty list is withheld for the service: its metadata key, else the setting."""
        record = self.services.get(service) if self.services is not None else None
        flag = record.metadata.get(EMPTY_PROTECTION_KEY) if record is not None else None
        if flag is not None and flag.strip().lower() in ("true", "false"):
            return flag.strip().lower() == "true"
        return self.config.push_empty_protection

    def protected_services(self) -> list[ServiceKey]:
        """Services whose empty list is being withheld from some subscriber now (pruned of the
        ones nobody subscribes to any more or whose protection was turned off)."""
        for key in [k for k in self.protected if not self.subscribers_of(k) or not self.empty_protected(k)]:
            del self.protected[key]
        return sorted(self.protected)

    # --- push lag ---------------------------------------------------------------------------------
    def lag_of(self, client_id: str, service: ServiceKey) -> PushLag | None:
        """The connection's push lag figures, and how long this service's change waits for its
        ack; None when nothing was pushed to the connection yet."""
        state = self._state.get(client_id)
        if state is None:
            return None
        now = self.clock.monotonic_ms()
        window = [lag for at, lag in state.lags if now - at <= LAG_WINDOW_MS]
        since = state.since.get(service)
        return PushLag(last_ms=state.lags[-1][1] if state.lags else None,
                       p99_ms=_p99(window) if window else None, acks=len(window), pending=len(state.since),
                       pending_for_ms=max(now - since, 0) if since is not None else 0)

    def lag_summary(self, slowest: int = 5) -> dict[str, Any]:
        """The node's push lag: p99 over every connection's window and the slowest subscribers
        (by the larger of their p99 and the age of their oldest unacked change)."""
        now = self.clock.monotonic_ms()
        lags: list[int] = []
        rows: list[tuple[int, dict[str, Any]]] = []
        for client_id, state in self._state.items():
            window = [lag for at, lag in state.lags if now - at <= LAG_WINDOW_MS]
            lags.extend(window)
            oldest = max((now - since for since in state.since.values()), default=0)
            p99 = _p99(window) if window else None
            if p99 is None and not state.since:
                continue
            rows.append((max(p99 or 0, oldest), {
                "clientId": client_id, "p99Ms": p99, "lastMs": state.lags[-1][1] if state.lags else None,
                "pending": len(state.since), "oldestPendingMs": oldest}))
        rows.sort(key=lambda r: r[0], reverse=True)
        return {"p99Ms": _p99(lags) if lags else None, "acks": len(lags), "windowMs": LAG_WINDOW_MS,
                "slowest": [row for _, row in rows[:slowest]],
                "protectedServices": [k.grouped_name if k.namespace == "public" else f"{k.namespace}/{k.grouped_name}"
                                      for k in self.protected_services()]}

    def backlog(self) -> dict[str, Any]:
        return {
            "pending_services": len(self.pending),
            "inflight": sum(len(s.inflight) for s in self._state.values()),
            "dirty": sum(len(s.dirty) for s in self._state.values()),
        }
