"""History: an instance's lifecycle across every node of a cluster, from the nodes' history logs.

Each node keeps its own log (``<data_dir>/history/history-*.jsonl``, :mod:`shoal.export.history`):
what it decided (its clients' registrations, beat expiry, closed connections) and what it saw of its
peers' clients through Distro. Over a long span, or to see a client's owner and the nodes that held
copies side by side, this job reads the logs of every node (directories given; each is searched
for segment files), keeps the instance rows of one service (and IP, and start time), orders them by
time and node, and writes ``lifecycle.parquet`` (one row per event) and ``summary.txt`` (the same
text ``shoal history`` prints, one paragraph per instance).

Rows are read with an explicit schema, so push rows (with their nested lists) and segments from
other versions read the same way; a torn last line of a killed node is dropped by Spark's
permissive JSON reader.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.analytics import report
from shoal.export.history_rows import INSTANCE_KINDS, parse_service, render

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["HistoryResult", "find_segments", "run"]

COLUMNS: tuple[tuple[str, str], ...] = (
    ("ts", "long"), ("node", "string"), ("kind", "string"), ("ns", "string"), ("group", "string"),
    ("service", "string"), ("ip", "string"), ("port", "long"), ("cluster", "string"), ("client", "string"),
    ("owner", "string"), ("source", "string"), ("reason", "string"), ("weight", "double"),
    ("healthy", "boolean"), ("enabled", "boolean"),
)


@dataclass
class HistoryResult:
    rows: list[dict[str, Any]]
    nodes: list[str]
    segments: int
    out_dir: Path
    elapsed_s: float
    outputs: dict[str, Path] = field(default_factory=dict)


def find_segments(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Every history segment under the inputs (files, history dirs or data dirs), sorted."""
    found: set[Path] = set()
    for item in inputs:
        path = Path(item)
        if path.is_file():
            found.add(path.absolute())
        elif path.is_dir():
            found.update(p.absolute() for p in path.rglob("history-*.jsonl"))
        else:
            raise ValueError(f"no such file or directory: {path}")
    if not found:
        raise ValueError(f"no history segments (history-*.jsonl) under {', '.join(map(str, inputs))}")
    return sorted(found)


def run(spark: SparkSession, inputs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
        service: str, ip: str = "", since_ms: int = 0) -> HistoryResult:
    """The lifecycle of the service's instances (``ip``: one address) across every node's log."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    started = time.monotonic()
    ns, group, name = parse_service(service)
    segments = find_segments(inputs)
    out_dir = report.job_dir(out, "history")
    schema = ", ".join(f"`{col}` {kind}" for col, kind in COLUMNS)
    rows = spark.read.schema(schema).json([str(p) for p in segments])
    wanted = (F.col("kind").isin(*sorted(INSTANCE_KINDS)) & (F.col("ns") == ns) & (F.col("group") == group)
              & (F.col("service") == name) & (F.col("ts") >= since_ms))
    if ip:
        wanted &= F.col("ip") == ip
    selected = rows.where(wanted).dropDuplicates().orderBy("ts", "node", "kind")
    table = selected.toArrow()
    found = table.to_pylist()
    result = HistoryResult(rows=found, nodes=sorted({str(r["node"]) for r in found}), segments=len(segments),
                           out_dir=out_dir, elapsed_s=0.0)
    stamped = report.ms_to_timestamps(table.cast(table.schema), {"ts": "at"}) if table.num_rows else pa.table({})
    result.outputs["lifecycle"] = report.write_table(stamped, out_dir / "lifecycle.parquet")
    result.elapsed_s = time.monotonic() - started
    lines = [render(found), "",
             f"{len(found)} events of {service}{' ' + ip if ip else ''} from {len(result.nodes)} node(s) "
             f"({', '.join(result.nodes) or '-'}), {len(segments)} segment file(s), {result.elapsed_s:.1f} s"]
    result.outputs["summary"] = report.write_summary(out_dir, lines)
    return result
