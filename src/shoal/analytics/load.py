"""Get snapshot tables into Spark: Arrow IPC files -> Parquet staging -> ``spark.read.parquet``.

Spark has no reader for Arrow IPC files, and building DataFrames from driver-side Arrow tables
(``createDataFrame``) pushes every row through the driver and the Py4J socket, which does not scale to
several million rows on a small box. Parquet is Spark's native columnar format, so each snapshot table
is rewritten once with pyarrow (streaming record batches from the memory-mapped IPC file, so memory
stays at one batch) into ``<out>/_staging/<table>/<snapshot>.parquet``; Spark then reads them in
parallel. The map column (``metadata``) survives as a Spark ``map<string,string>``. The staging
directory is removed when the job is done unless asked to keep it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from shoal.analytics.progress import Progress
from shoal.export.reader import Manifest, SnapshotError, find_snapshots, read_manifest, read_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Staged", "latest_per_node", "stage_snapshots"]

log = logging.getLogger(__name__)

STAGING_DIR = "_staging"


@dataclass(frozen=True, slots=True)
class Staged:
    """Snapshots staged as Parquet, one file per (table, snapshot)."""

    root: Path
    manifests: tuple[Manifest, ...]
    files: dict[str, tuple[str, ...]]

    @property
    def nodes(self) -> list[str]:
        return sorted({m.node for m in self.manifests})

    def read(self, spark: SparkSession, table: str) -> DataFrame:
        return spark.read.parquet(*self.files[table])

    def rows(self, table: str) -> int:
        return sum(m.rows[table] for m in self.manifests)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def latest_per_node(manifests: Iterable[Manifest]) -> list[Manifest]:
    """Keep the newest snapshot of each node (jobs comparing nodes want one snapshot per node)."""
    best: dict[str, Manifest] = {}
    for m in manifests:
        cur = best.get(m.node)
        if cur is None or (m.taken_at_ms, m.path.name) > (cur.taken_at_ms, cur.path.name):
            best[m.node] = m
    return sorted(best.values(), key=lambda m: m.node)


def stage_snapshots(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tables: Sequence[str],
    *,
    one_per_node: bool,
    show_progress: bool = True,
) -> Staged:
    """Find the snapshots under ``inputs``, validate them, and stage ``tables`` as Parquet."""
    manifests = [read_manifest(p) for p in find_snapshots(inputs)]
    if not manifests:
        raise SnapshotError(f"no snapshots found in {[str(p) for p in inputs]}")
    if one_per_node:
        chosen = latest_per_node(manifests)
        if len(chosen) < len(manifests):
            log.warning(
                "%d snapshot(s) ignored: only the newest snapshot of each node is used",
                len(manifests) - len(chosen),
            )
        manifests = chosen
    root = Path(out_dir) / STAGING_DIR
    shutil.rmtree(root, ignore_errors=True)
    files: dict[str, list[str]] = {t: [] for t in tables}
    total = sum(m.rows[t] for m in manifests for t in tables)
    progress = Progress("staging snapshots", total, unit="rows") if show_progress else None
    try:
        for i, m in enumerate(manifests):
            for table in tables:
                target = root / table / f"{i:04d}-{m.path.name}.parquet"
                target.parent.mkdir(parents=True, exist_ok=True)
                _to_parquet(read_table(m.path, table, manifest=m), target, progress)
                files[table].append(str(target))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        if progress is not None:
            progress.close("failed")
        raise
    if progress is not None:
        progress.close(f"{len(manifests)} snapshot(s), {total:,} rows")
    return Staged(root, tuple(manifests), {t: tuple(v) for t, v in files.items()})


def _to_parquet(table: pa.Table, target: Path, progress: Progress | None) -> None:
    # Spark reads nullability from the file; keep the schema but drop Arrow's key/value metadata
    # (node, taken_at_ms) which means nothing once tables of several nodes are read together.
    schema = table.schema.remove_metadata()
    with pq.ParquetWriter(str(target), schema, compression="snappy") as writer:
        for batch in table.to_batches(max_chunksize=262_144):
            writer.write_batch(batch.replace_schema_metadata(None))
            if progress is not None:
                progress.update(batch.num_rows)
        if table.num_rows == 0:
            writer.write_table(table.replace_schema_metadata(None))
