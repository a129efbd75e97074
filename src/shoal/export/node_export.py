"""Export this node's registry as an Arrow snapshot, without stalling the event loop.

Rows are built on the loop a chunk of clients at a time (cheap tuple building) and each chunk
is handed to the writer in the executor; the loop runs other work between chunks. The snapshot
is "taken at about the same time": the client list is fixed when the export starts, and each
client is read as it is when its chunk is built (Distro replicas are eventually consistent
anyway; the consistency job compares snapshots taken within a short window).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.clock import Clock
from shoal.export.eventlog import ChangeLog
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.tasks import run_blocking

if TYPE_CHECKING:  # pyarrow is imported only when an export runs: a node that never exports
    from shoal.export.writer import SnapshotInfo  # starts ~90 MB lighter and 0.4 s faster

log = logging.getLogger(__name__)

CLIENTS_PER_CHUNK = 4096
LastBeat = Callable[[str, ServiceKey], int | None]


class NodeExporter:
    """Builds this node's Arrow snapshot from the model, a chunk of clients at a time, handing
    each chunk to the writer off the loop; used by the export route and the periodic export."""

    def __init__(self, node: str, clock: Clock, clients: ClientManager, services: ServiceManager,
                 index: ServiceIndex, storage: ServiceStorage, changelog: ChangeLog,
                 owner_of: Callable[[Client], str | None], last_beat: LastBeat | None = None) -> None:
        self.node = node
        self.clock = clock
        self.clients = clients
        self.services = services
        self.index = index
        self.storage = storage
        self.changelog = changelog
        self.owner_of = owner_of
        self.last_beat = last_beat
        self.longest_chunk_ms = 0.0

    def _wall(self, mono_ms: int) -> int:
        return self.clock.now_ms() - (self.clock.monotonic_ms() - mono_ms)

    async def export(self, out_dir: Path) -> SnapshotInfo:
        """Write one snapshot directory under ``out_dir`` and return what was written."""
        from shoal.export.writer import SnapshotWriter

        taken = self.clock.now_ms()
        writer = SnapshotWriter(out_dir, self.node, taken)
        try:
            await run_blocking(writer.open)
            clients = list(self.clients)
            for start in range(0, len(clients), CLIENTS_PER_CHUNK):
                started = time.perf_counter()
                instances, client_rows = self._client_chunk(clients[start:start + CLIENTS_PER_CHUNK])
                self.longest_chunk_ms = max(self.longest_chunk_ms, (time.perf_counter() - started) * 1000)
                await run_blocking(writer.write_chunk, "instances", instances)
                await run_blocking(writer.write_chunk, "clients", client_rows)
            await run_blocking(writer.write_chunk, "services", self._service_rows())
            await run_blocking(writer.write_chunk, "events", self.changelog.snapshot())
            info = await run_blocking(writer.close)
        except BaseException:
            await run_blocking(writer.abort)
            raise
        log.info("exported %s to %s", info.rows, info.path)
        return info

    def _client_chunk(self, chunk: list[Client]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        instances: list[tuple[Any, ...]] = []
        rows: list[tuple[Any, ...]] = []
        for client in chunk:
            owner = self.owner_of(client)
            renew = None if client.native else self._wall(client.last_renew_ms)
            ip_port = client.kind is ClientKind.IP_PORT
            for service, publication in client.publications.items():
                beat = self.last_beat(client.client_id, service) if ip_port and self.last_beat else None
                beat_wall = self._wall(beat) if beat is not None else None
                for inst in publication.instances:
                    instances.append((
                        service.namespace, service.group, service.name, inst.cluster, inst.ip, inst.port,
                        float(inst.weight), inst.healthy, inst.enabled, client.replicated, dict(inst.metadata),
                        inst.instance_id or None, client.client_id, owner, client.revision, beat_wall, renew,
                    ))
            active = self._wall(client.last_updated_ms) if client.last_updated_ms else client.created_ms
            rows.append((
                client.client_id, client.kind.value, client.native, owner, client.revision, client.client_ip,
                client.created_ms, active, renew, len(client.publications), len(client.subscriptions),
            ))
        return instances, rows

    def _service_rows(self) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for record in list(self.services):
            view = self.storage.view(record.key)
            rows.append((
                record.key.namespace, record.key.group, record.key.name, record.ephemeral,
                float(record.protect_threshold), dict(record.metadata), len(view.instances),
                sum(1 for i in view.instances if i.healthy), len(self.index.subscribers_of(record.key)),
                len({i.cluster for i in view.instances}), record.last_change_ms,
            ))
        return rows


async def export_and_rotate(exporter: NodeExporter, export_dir: Path, keep: int) -> SnapshotInfo:
    from shoal.export.writer import rotate

    info = await exporter.export(export_dir)
    removed = await run_blocking(rotate, export_dir, keep)
    if removed:
        log.info("export rotation removed %d old snapshots", len(removed))
    return info
