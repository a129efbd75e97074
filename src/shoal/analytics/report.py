"""Write a job's results the same way everywhere: Parquet tables, one PNG, and ``summary.txt``.

Every job leaves a directory a person can act on without Spark: small result tables as single
Parquet files (pyarrow), large ones as Spark Parquet directories (both readable with
``pyarrow.parquet.read_table``), a chart, and a short text summary naming what to look at first.
Matplotlib is forced onto the Agg backend: jobs run headless (CI, servers) and must never try to
open a window.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from pyspark.sql import DataFrame

__all__ = [
    "SUMMARY_NAME",
    "ensure_dir",
    "fmt_bytes",
    "fmt_int",
    "fmt_ms",
    "new_figure",
    "save_figure",
    "write_df",
    "write_summary",
    "write_table",
]

log = logging.getLogger(__name__)

SUMMARY_NAME = "summary.txt"


def ensure_dir(path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_table(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """A small result table as one Parquet file (written to a temp name, then renamed)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.part")
    pq.write_table(table, tmp, compression="snappy")
    tmp.replace(target)
    return target


def write_df(df: DataFrame, path: str | os.PathLike[str], *, files: int = 1) -> Path:
    """A Spark result as a Parquet directory of at most ``files`` part files (overwrites)."""
    target = Path(path)
    df.coalesce(files).write.mode("overwrite").parquet(str(target))
    return target


def write_summary(out_dir: str | os.PathLike[str], lines: Iterable[str]) -> Path:
    target = Path(out_dir) / SUMMARY_NAME
    target.write_text("\n".join(lines).rstrip("\n") + "\n")
    return target


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 11.0, height: float = 4.2) -> tuple[Figure, Any]:
    """A figure with a grid of axes (``axes`` is a flat list when there is more than one)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    flat = [ax for row in axes for ax in row]
    return fig, (flat[0] if len(flat) == 1 else flat)


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    fig.savefig(target, dpi=110)
    return target


def fmt_int(n: float) -> str:
    return f"{round(n):,}"


def fmt_bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_ms(ms: int | None) -> str:
    """Epoch milliseconds as an ISO-8601 UTC timestamp (``-`` when absent)."""
    if ms is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def table_lines(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A plain fixed-width text table for summaries."""
    body = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in body)]
