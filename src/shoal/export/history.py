"""The node's instance history (issue 23 item 5): what happened to each instance, and what
each subscriber was pushed, kept on disk under ``<data_dir>/history/``.

It listens to the model's events (register, edit, deregister with its reason, beat expiry,
health flip, client released — connection closed, Distro removal, moved —, ownership moved or
taken over) and to the push engine (each push's list, sent and acked times), and turns each
into a row (:mod:`shoal.export.history_rows`). On the loop that is one small dict per instance
appended to a bounded queue; a ``Periodic`` that ``app.py`` owns hands the queue to
:class:`~shoal.export.history_files.HistoryFiles` through ``run_blocking``, where rows are
encoded, pushed lists are decoded and digested, and segments are rotated and bounded. A full
queue drops rows and counts them (``dropped``), it never blocks a writer.

Reads (the HTTP route) flush the queue first, then scan the segments off the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.clock import Clock
from shoal.export import history_rows as hr
from shoal.export.history_files import HistoryFiles
from shoal.logutil import RateLimitedLog
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.clients import ClientManager
from shoal.model.events import (
    REASON_DELETED_BY_OWNER,
    REASON_EXPIRED,
    REASON_REPLACED,
    ClientDeregisteredService,
    ClientOwnershipChanged,
    ClientRegisteredService,
    ClientReleased,
    EventBus,
    InstanceEdited,
    InstanceHealthChanged,
)
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)
#: a data dir that cannot be written fails every flush: one line per minute says so
_write_failures = RateLimitedLog(log, 60.0)

#: What a Distro release means, in the history's words.
_RELEASE_REASONS = {
    REASON_DELETED_BY_OWNER: "Distro: its owner node dropped it",
    REASON_EXPIRED: "Distro: an unverified copy expired (its owner stopped renewing it)",
    REASON_REPLACED: "replaced by a client with the same id",
}


class HistoryLog:
    """Rows queued on the loop, written off it by :meth:`flush`."""

    def __init__(self, bus: EventBus, clock: Clock, clients: ClientManager, node: str, directory: Path,
                 max_bytes: int, segment_bytes: int, queue_capacity: int) -> None:
        self.clock = clock
        self.clients = clients
        self.node = node
        self.files = HistoryFiles(directory, max_bytes, segment_bytes)
        self.capacity = queue_capacity
        #: rows as tuples (built into dicts off the loop, :func:`to_row`)
        self.queue: list[tuple[Any, ...]] = []
        self.dropped = 0
        self.written = 0
        self._lock = asyncio.Lock()  # one file operation at a time
        bus.subscribe(ClientRegisteredService, self._on_register)
        bus.subscribe(ClientDeregisteredService, self._on_deregister)
        bus.subscribe(InstanceHealthChanged, self._on_health)
        bus.subscribe(ClientReleased, self._on_released)
        bus.subscribe(ClientOwnershipChanged, self._on_ownership)
        bus.subscribe(InstanceEdited, self._on_edited)

    # --- rows -------------------------------------------------------------------------
    def _add(self, row: tuple[Any, ...]) -> None:
        if len(self.queue) >= self.capacity:
            self.dropped += 1
            return
        self.queue.append(row)

    def _source(self, client: Client | None, publication: Publication | None) -> str:
        if client is None:
            return "?"
        if not client.native and client.kind is not ClientKind.PERSISTENT:
            return "distro"
        if client.kind is ClientKind.IP_PORT:
            return "http"
        if client.kind is ClientKind.PERSISTENT:
            return "persistent"
        return "grpc-batch" if publication is not None and publication.batch else "grpc"

    def _owner(self, client: Client | None) -> str:
        if client is None or client.native or client.kind is ClientKind.PERSISTENT:
            return self.node
        return client.owner

    def _instance_rows(self, kind: str, service: ServiceKey, client_id: str, client: Client | None,
                       instances: tuple[InstanceInfo, ...], reason: str, source: str, values: bool) -> None:
        now = self.clock.now_ms()
        owner = self._owner(client)
        for inst in instances:  # a tuple here; the dict is built off the loop
            self._add((kind, now, service, client_id, owner, source, reason, inst, values))

    def _on_register(self, event: ClientRegisteredService) -> None:
        client = self.clients.get(event.client_id)
        publication = client.publications.get(event.service) if client is not None else None
        if publication is None:
            return
        source = self._source(client, publication)
        kind = hr.UPDATE if event.reason else hr.REGISTER
        reason = event.reason or ("synced from its owner" if source == "distro" else "")
        self._instance_rows(kind, event.service, event.client_id, client, publication.instances, reason, source,
                            values=True)

    def _on_deregister(self, event: ClientDeregisteredService) -> None:
        client = self.clients.get(event.client_id)
        source = self._source(client, None)
        reason = event.reason
        if not reason:
            reason = ("removed on its owner node (Distro sync)" if source == "distro"
                      else "persistent instance removed" if source == "persistent" else "removed")
        kind = hr.EXPIRE if reason.startswith("no beat") else hr.DEREGISTER
        self._instance_rows(kind, event.service, event.client_id, client, event.instances, reason, source,
                            values=False)

    def _on_health(self, event: InstanceHealthChanged) -> None:
        client = self.clients.get(event.client_id)
        publication = client.publications.get(event.service) if client is not None else None
        if publication is None:
            return
        self._instance_rows(hr.HEALTH, event.service, event.client_id, client, publication.instances,
                            event.reason, self._source(client, publication), values=True)

    def _on_edited(self, event: InstanceEdited) -> None:
        inst = InstanceInfo(event.ip, event.port, cluster=event.cluster)
        self._add((hr.EDIT, self.clock.now_ms(), event.service, "", self.node, "operator", event.edit, inst, False))

    def _on_released(self, event: ClientReleased) -> None:
        client = event.client
        reason = _RELEASE_REASONS.get(event.reason)
        if reason is None:
            reason = (f"connection closed: {event.reason}" if client.kind is ClientKind.CONNECTION
                      and not event.reason.startswith("moved") else event.reason)
        kind = hr.EXPIRE if event.expired else hr.DEREGISTER
        for service, publication in client.publications.items():
            self._instance_rows(kind, service, client.client_id, client, publication.instances, reason,
                                self._source(client, publication), values=False)

    def _on_ownership(self, event: ClientOwnershipChanged) -> None:
        client = event.client
        reason = "taken over by this node" if client.native else f"moved to node {client.owner or '?'}"
        for service, publication in client.publications.items():
            self._instance_rows(hr.OWNERSHIP, service, client.client_id, client, publication.instances, reason,
                                self._source(client, publication), values=False)

    def pushed(self, client_id: str, service: ServiceKey, payload: str, sent_ms: int, acked_ms: int | None,
               result: str) -> None:
        """A push went out (the push engine's observer): its list is digested off the loop."""
        self._add((hr.PUSH, sent_ms, service, client_id, acked_ms, result, payload))

    # --- the file side ----------------------------------------------------------------
    async def flush(self) -> int:
        """Write the queued rows (off the loop); returns how many were written."""
        async with self._lock:
            batch, self.queue = self.queue, []
            if not batch:
                return 0
            try:
                written = await run_blocking(self._write, batch)
            except OSError as exc:
                self.dropped += len(batch)
                _write_failures.warning("write", "history: %d rows not written: %s", len(batch), exc)
                return 0
            self.written += written
            return written

    def _write(self, batch: list[tuple[Any, ...]]) -> int:
        node = self.node
        return self.files.append([to_row(item, node) for item in batch])

    async def close(self) -> None:
        await self.flush()
        async with self._lock:
            await run_blocking(self.files.close)

    async def instance_rows(self, service: tuple[str, str, str] | None, ip: str, since_ms: int,
                            limit: int) -> list[dict[str, Any]]:
        """The instance rows of a service (and ip), oldest first, the newest ``limit``."""
        await self.flush()
        needle = f'"service":"{service[2]}"' if service is not None else ""
        async with self._lock:
            return await run_blocking(_select, self.files, needle,
                                      lambda row: hr.matches(row, service, ip, since_ms), limit)

    async def held(self, subscriber: str, at_ms: int, service: tuple[str, str, str] | None) -> list[dict[str, Any]]:
        """What the subscriber held at ``at_ms``: per service, its last push acked at or before it."""
        await self.flush()
        async with self._lock:
            return await run_blocking(_held, self.files, subscriber, at_ms, service)

    def figures(self) -> dict[str, Any]:
        return {"queued": len(self.queue), "dropped": self.dropped, "written": self.written,
                "bytes": self.files.total_bytes, "segments": len(self.files.sizes),
                "deletedSegments": self.files.deleted_segments}


def to_row(item: tuple[Any, ...], node: str) -> dict[str, Any]:
    """A queued tuple as the row written (off the loop)."""
    kind, ts, service = item[0], item[1], item[2]
    if kind == hr.PUSH:
        _, _, _, client_id, acked_ms, result, payload = item
        return {"ts": ts, "node": node, "kind": kind, "ns": service.namespace, "group": service.group,
                "service": service.name, "client": client_id, "sent": ts, "acked": acked_ms, "result": result,
                "payload": payload}
    _, _, _, client_id, owner, source, reason, inst, values = item
    row = {"ts": ts, "node": node, "kind": kind, "ns": service.namespace, "group": service.group,
           "service": service.name, "ip": inst.ip, "port": inst.port, "cluster": inst.cluster, "client": client_id,
           "owner": owner, "source": source, "reason": reason}
    if values:
        row.update(weight=inst.weight, healthy=inst.healthy, enabled=inst.enabled, metadata=dict(inst.metadata))
    return row


def _select(files: HistoryFiles, needle: str, keep: Callable[[dict[str, Any]], bool],
            limit: int) -> list[dict[str, Any]]:
    out = [row for row, _ in files.rows(needle) if keep(row)]
    return out[-limit:]


def _held(files: HistoryFiles, subscriber: str, at_ms: int,
          service: tuple[str, str, str] | None) -> list[dict[str, Any]]:
    last: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row, lists in files.rows(f'"client":"{subscriber}"'):
        if row.get("kind") != hr.PUSH or row.get("client") != subscriber or row.get("acked") is None:
            continue
        key = (str(row.get("ns")), str(row.get("group")), str(row.get("service")))
        if (service is not None and key != service) or int(row["acked"]) > at_ms:
            continue
        hosts = row.get("hosts", lists.get(str(row.get("digest"))))
        last[key] = {"service": hr.service_label(row), "digest": row.get("digest"), "sent": row.get("sent"),
                     "acked": row.get("acked"), "node": row.get("node"), "hosts": hosts}
    return [last[k] for k in sorted(last)]
