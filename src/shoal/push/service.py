"""Subscriber fan-out with per-service coalescing, bounded retry and a bounded backlog.

Nacos's PushDelayTaskExecuteEngine keys push tasks by service and merges them (to-all wins,
targeted sets are unioned, the earliest start is kept), fires them after
``nacos.naming.push.pushTaskDelay``, and retries a failed subscriber after
``pushTaskRetryDelay``. Here, additionally, each connection has at most
``max-pending-requests`` pushes in flight and at most one per service: a change that arrives
while that service's push is unacknowledged marks it dirty and the newest data is sent when
the ack comes back, so a slow subscriber costs a bounded amount of memory and never receives
stale data after fresh data.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.errors import PushGone
from shoal.model.events import ClientReleased, ClientSubscribedService, EventBus, ServiceChanged
from shoal.model.keys import ServiceKey
from shoal.tasks import wait_until_due

log = logging.getLogger(__name__)

__all__ = ["PendingPush", "PushGone", "PushMetrics", "PushSender", "PushService"]


class PushSender(Protocol):
    """Delivers one NotifySubscriberRequest and returns the subscriber's ack body.

    Raises :class:`shoal.errors.PushGone` (re-exported here) when the connection is gone and
    TimeoutError when no ack came in time.
    """

    async def send_push(self, client_id: str, service_info_json: str, timeout_ms: int) -> bool: ...


#: How a ServiceInfo JSON without hosts ends (``service_info_json`` writes ``hosts`` last, compact).
_EMPTY_HOSTS_TAIL = '"hosts":[]}'


class PushMetrics(Protocol):
    """Where push outcomes are counted (``result`` label, latency when the push was sent)."""

    def push_done(self, result: str, latency_s: float | None, empty: bool = False) -> None: ...


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


class PushService:
    """Schedules and executes pushes. ``process_due`` can be stepped by hand in tests."""

    def __init__(self, live: LiveConfig, clock: Clock, bus: EventBus, sender: PushSender,
                 subscribers_of: Callable[[ServiceKey], set[str]],
                 payload_for: Callable[[str, ServiceKey], str | None],
                 metrics: PushMetrics | None = None) -> None:
        self.live = live  # pushEnabled is a switch: read each time (self.config)
        self.clock = clock
        self.sender = sender
        self.subscribers_of = subscribers_of
        self.payload_for = payload_for
        self.metrics = metrics
        self.pending: dict[ServiceKey, PendingPush] = {}
        self._state: dict[str, _Subscriber] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        bus.subscribe(ServiceChanged, self._on_service_changed)
        bus.subscribe(ClientSubscribedService, self._on_subscribed)
        bus.subscribe(ClientReleased, self._on_released)

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
        if event.first:  # Nacos pushes once more after a first subscription
            self.schedule(event.service, {event.client_id})

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
        try:
            payload = self.payload_for(client_id, service)
            if payload is None:  # unsubscribed meanwhile
                result = "skipped"
                return
            empty = payload.endswith(_EMPTY_HOSTS_TAIL)  # Nacos's emptyPush: a ServiceInfo without hosts
            ok = await self.sender.send_push(client_id, payload, self.config.push_task_timeout_ms)
            result = "success" if ok else "failed"
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
            self._finish(client_id, service, state, result, empty)

    def _finish(self, client_id: str, service: ServiceKey, state: _Subscriber, result: str,
                empty: bool = False) -> None:
        state.inflight.discard(service)
        latency: float | None = None
        if result in ("success", "gone", "skipped", "cancelled"):
            since = state.since.pop(service, None)
            state.attempts.pop(service, None)
            if result == "success" and since is not None:
                latency = (self.clock.monotonic_ms() - since) / 1000
        else:
            attempts = state.attempts.get(service, 0) + 1
            if attempts <= self.config.push_max_retries and self._state.get(client_id) is state:
                state.attempts[service] = attempts
                self.schedule(service, {client_id}, delay_ms=self.config.push_task_retry_delay_ms,
                              changed_ms=state.since.get(service))
            else:
                log.warning("push of %s to %s gave up after %d attempts (%s)", service, client_id, attempts, result)
                state.attempts.pop(service, None)
                state.since.pop(service, None)
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

    def backlog(self) -> dict[str, Any]:
        return {
            "pending_services": len(self.pending),
            "inflight": sum(len(s.inflight) for s in self._state.values()),
            "dirty": sum(len(s.dirty) for s in self._state.values()),
        }
