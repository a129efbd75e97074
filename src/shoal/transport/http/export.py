"""``GET /nacos/v1/shoal/export``: a fresh Arrow snapshot of this node, streamed as a tar.

Admin-only when auth is on. The snapshot is written by the node's exporter (chunked, off the
loop), packed into a tar file in the executor, and streamed in 1 MiB reads from the executor, so
the loop only ever copies buffers. ``shoal export --addr H:P --out DIR`` is the client.
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from shoal.tasks import run_blocking
from shoal.transport.http.api import Api
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

if TYPE_CHECKING:
    from shoal.export.writer import SnapshotInfo

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024


class Exporter(Protocol):
    """What the export route needs from the node: write one snapshot directory under a given
    directory (:class:`shoal.export.node_export.NodeExporter` in a node)."""

    async def export(self, out_dir: Path) -> SnapshotInfo: ...


class ExportRoutes:
    """The Shoal-only ``GET /nacos/v1/shoal/export`` handler: takes a snapshot into a scratch
    directory and streams it back as a tar (no Nacos counterpart)."""

    def __init__(self, exporter: Exporter, scratch_dir: Path) -> None:
        self.exporter = exporter
        self.scratch_dir = scratch_dir

    def routes(self, admin: str) -> list[Route]:
        return [Route("GET", "/nacos/v1/shoal/export", self.export, admin, api=Api.CORE)]

    async def export(self, request: web.Request, params: Params) -> web.StreamResponse:
        await run_blocking(self.scratch_dir.mkdir, parents=True, exist_ok=True)
        work = Path(await run_blocking(tempfile.mkdtemp, prefix="export-", dir=self.scratch_dir))
        try:
            info = await self.exporter.export(work)
            archive = work / f"{info.path.name}.tar"
            await run_blocking(_pack, info.path, archive)
            size = (await run_blocking(archive.stat)).st_size
            response = web.StreamResponse(headers={
                "Content-Type": "application/x-tar",
                "Content-Disposition": f'attachment; filename="{archive.name}"',
                "Content-Length": str(size),
                "X-Shoal-Snapshot": info.path.name,
            })
            await response.prepare(request)
            with await run_blocking(open, archive, "rb") as handle:
                while chunk := await run_blocking(handle.read, CHUNK):
                    await response.write(chunk)
            await response.write_eof()
            log.info("served export %s (%d bytes, rows %s)", info.path.name, size, info.rows)
            return response
        finally:
            await run_blocking(shutil.rmtree, work, ignore_errors=True)


def _pack(snapshot: Path, archive: Path) -> None:
    with tarfile.open(archive, "w") as tar:
        tar.add(snapshot, arcname=snapshot.name)
