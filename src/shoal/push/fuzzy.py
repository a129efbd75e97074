"""Delivery of fuzzy-watch notifications (Nacos FuzzyWatchPushDelayTaskEngine, simplified).

:class:`shoal.service_layer.fuzzy.FuzzyWatchContext` decides *what* a watcher must be told; this
queue sends it. Each connection's notifications go out in order, one in flight at a time (so a
client sees the init batches, then FINISH, then changes), awaiting the client's ack with the push
timeout and retrying a failed one a bounded number of times. Connections are served
concurrently, so a slow one never holds up the others. The backlog of the whole node is bounded:
beyond ``shoal.naming.fuzzy-watch.max-pending`` the oldest notification of the busiest connection
is dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

from shoal.config import Config
from shoal.errors import PushGone

log = logging.getLogger(__name__)


class FuzzySender(Protocol):
    """Sends one server request on a connection's stream; True when the client acked success.

    Raises :class:`shoal.errors.PushGone` when the connection is gone, TimeoutError without an ack.
    """

    async def send_server_request(self, client_id: str, type_name: str, fields: dict[str, Any],
                                  timeout_ms: int) -> bool: ...


class FuzzyNotifier:
    """Per-connection ordered, node-wide bounded delivery of fuzzy-watch notifications."""

    def __init__(self, config: Config, sender: FuzzySender) -> None:
        self.config = config
        self.sender = sender
        self.queues: dict[str, deque[tuple[str, dict[str, Any]]]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.pending = 0
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self._running = False

    def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        self.queues.clear()
        self.pending = 0

    def enqueue(self, client_id: str, type_name: str, fields: dict[str, Any]) -> None:
        """Queue one notification (called synchronously from model events; never blocks)."""
        if not self._running:
            return
        if self.pending >= self.config.fuzzy_watch_max_pending:
            busiest = max(self.queues, key=lambda c: len(self.queues[c]))
            self.queues[busiest].popleft()
            self.pending -= 1
            self.dropped += 1
        self.queues.setdefault(client_id, deque()).append((type_name, fields))
        self.pending += 1
        if client_id not in self.tasks:
            self.tasks[client_id] = asyncio.get_running_loop().create_task(
                self._drain(client_id), name=f"fuzzy-watch-{client_id}")

    async def _drain(self, client_id: str) -> None:
        try:
            while True:
                queue = self.queues.get(client_id)
                if not queue:
                    return
                type_name, fields = queue.popleft()
                self.pending -= 1
                if not await self._deliver(client_id, type_name, fields):
                    self._forget(client_id)
                    return
        finally:
            self.tasks.pop(client_id, None)
            if not self.queues.get(client_id):
                self.queues.pop(client_id, None)

    async def _deliver(self, client_id: str, type_name: str, fields: dict[str, Any]) -> bool:
        """Send with bounded retries; False when the connection is gone."""
        for attempt in range(self.config.push_max_retries + 1):
            try:
                if await self.sender.send_server_request(client_id, type_name, fields,
                                                         self.config.push_task_timeout_ms):
                    self.sent += 1
                    return True
            except PushGone:
                return False
            except TimeoutError:
                pass
            if attempt < self.config.push_max_retries:
                await asyncio.sleep(self.config.push_task_retry_delay_ms / 1000)
        self.failed += 1
        log.warning("fuzzy-watch %s to %s failed after %d attempts", type_name, client_id,
                    self.config.push_max_retries + 1)
        return True

    def _forget(self, client_id: str) -> None:
        queue = self.queues.pop(client_id, None)
        if queue:
            self.pending -= len(queue)
