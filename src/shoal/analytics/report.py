"""Write a job's results the same way everywhere: Parquet tables, one PNG, and ``summary.txt``.

Every job leaves a directory of its own (:func:`job_dir`; the CLI's default is ``report/<job>/``)
that a person can act on without Spark: small result tables as single Parquet files (pyarrow),
large ones as Spark Parquet directories (both readable with ``pyarrow.parquet.read_table``), a
chart, and a short text summary naming what to look at first. Points in time are Parquet
timestamps (UTC, millisecond precision; :func:`ms_to_timestamps`), not bare epoch integers.

Charts follow the same rules everywhere (helpers below): a title naming the snapshots and when they
were taken, whole-number ticks on count axes, headroom above the tallest bar, the values written on
the bars, and a sentence instead of an empty axis when there is nothing to draw. Matplotlib is
forced onto the Agg backend: jobs run headless (CI, servers) and must never try to open a window.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
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
    "JOBS",
    "JOB_MARKER",
    "SUMMARY_NAME",
    "TIMESTAMP",
    "empty_panel",
    "ensure_dir",
    "fmt_bytes",
    "fmt_int",
    "fmt_ms",
    "headroom",
    "integer_ticks",
    "job_dir",
    "label_bars",
    "ms_to_timestamps",
    "new_figure",
    "save_figure",
    "service_labels",
    "snapshot_title",
    "snapshots_line",
    "write_df",
    "write_summary",
    "write_table",
]

log = logging.getLogger(__name__)

SUMMARY_NAME = "summary.txt"
#: The jobs writing result directories (each directory holds one job's results).
JOBS: tuple[str, ...] = ("consistency", "churn", "balance", "simulate", "simulate-workers", "history")
#: File in a result directory naming the job whose results it holds.
JOB_MARKER = ".shoal-job"
#: Parquet/Arrow type of every point in time the jobs write (the snapshots' epoch milliseconds).
TIMESTAMP = pa.timestamp("ms", tz="UTC")


def ensure_dir(path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def job_dir(path: str | os.PathLike[str], job: str) -> Path:
    """Create ``path`` for ``job``'s results; ``FileExistsError`` if it holds another job's.

    Jobs share file names (``summary.txt``, ``nodes.parquet``, ...), so two jobs writing into one
    directory would silently replace each other's results. A rerun of the same job replaces its
    own results. The owner is recorded in :data:`JOB_MARKER`; directories written before the marker
    existed are recognised by their chart (``<job>.png``)."""
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; known: {', '.join(JOBS)}")
    # absolute: Spark resolves relative paths against the JVM's working directory, not Python's
    out = ensure_dir(Path(path).absolute())
    marker = out / JOB_MARKER
    owner = marker.read_text().strip() if marker.is_file() else None
    if owner is None:
        owner = next((j for j in JOBS if (out / f"{j}.png").exists()), None)
    if owner is not None and owner != job:
        raise FileExistsError(
            f"{out} holds the results of the {owner} job; give the {job} job a directory of its own "
            f"(by default report/{job})"
        )
    marker.write_text(job + "\n")
    return out


def write_table(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """A small result table as one Parquet file (written to a temp name, then renamed)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.part")
    pq.write_table(table, tmp, compression="snappy")
    tmp.replace(target)
    return target


def ms_to_timestamps(table: pa.Table, columns: Mapping[str, str]) -> pa.Table:
    """``table`` with each int64 epoch-milliseconds column ``old`` replaced, at the same position,
    by a :data:`TIMESTAMP` column ``new`` (``{old: new}``); nulls stay null."""
    for old, new in columns.items():
        i = table.schema.get_field_index(old)
        if i < 0:
            raise KeyError(f"no column {old!r} in {table.schema.names}")
        nullable = table.schema.field(i).nullable
        table = table.set_column(i, pa.field(new, TIMESTAMP, nullable=nullable), table.column(i).cast(TIMESTAMP))
    return table


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
    """Save as PNG; the title and the messages of empty panels also go into the PNG's text chunks
    (``Title``, ``Description``), so a chart says what it shows to tools that cannot see it."""
    target = Path(path)
    title = fig.get_suptitle()
    empty = [t.get_text().replace("\n", " ") for ax in fig.axes for t in ax.texts if t.get_gid() == _EMPTY_GID]
    metadata = {"Software": "shoal analytics"}
    if title:
        metadata["Title"] = title.replace("\n", "; ")
    if empty:
        metadata["Description"] = " | ".join(empty)
    fig.savefig(target, dpi=110, metadata=metadata)
    return target


def snapshots_line(snapshots: Sequence[tuple[str, int]], *, limit: int = 4) -> str:
    """``(node, taken_at_ms)`` pairs as one line: the date once (UTC), each node with its time.

    More than ``limit`` snapshots: the first ``limit`` and how many more, with the time range."""
    if not snapshots:
        return "no snapshots"
    ordered = sorted(snapshots, key=lambda s: (s[1], s[0]))
    times = [datetime.fromtimestamp(ms / 1000, tz=UTC) for _, ms in ordered]
    with_ms = any(ms % 1000 for _, ms in ordered)

    def clock(t: datetime) -> str:
        return t.strftime("%H:%M:%S.%f")[:-3] if with_ms else t.strftime("%H:%M:%S")

    one_day = times[0].date() == times[-1].date()
    stamp = clock if one_day else (lambda t: t.strftime("%Y-%m-%d ") + clock(t))
    head = f"{len(ordered)} snapshot{'s' if len(ordered) > 1 else ''}"
    head += f" of {times[0]:%Y-%m-%d} (UTC)" if one_day else " (UTC)"
    shown = [f"{node} at {stamp(t)}" for (node, _), t in zip(ordered[:limit], times[:limit], strict=False)]
    line = f"{head}: {', '.join(shown)}"
    if len(ordered) > limit:
        line += f", and {len(ordered) - limit} more (taken {stamp(times[0])} to {stamp(times[-1])})"
    return line


def snapshot_title(fig: Figure, heading: str, snapshots: Sequence[tuple[str, int]]) -> None:
    """The figure's title: ``heading`` and, below it, which snapshots and when (:func:`snapshots_line`)."""
    fig.suptitle(f"{heading}\n{snapshots_line(snapshots)}", fontsize="large")


def service_labels(rows: Sequence[Mapping[str, Any]], suffix: str = "") -> list[str]:
    """Chart labels for rows with namespace, group and service (and ``suffix`` formatted with the
    row): the namespace and group are named only where they tell rows apart, i.e. when the rows
    span more than one of them."""
    namespaces = len({r["namespace"] for r in rows}) > 1
    groups = len({r["group"] for r in rows}) > 1 or namespaces
    labels = []
    for r in rows:
        name = r["service"]
        if groups:
            name = f"{r['group']}/{name}"
        if namespaces:
            name = f"{r['namespace'] or '(public)'}/{name}"
        labels.append(name + suffix.format(**r))
    return labels


def integer_ticks(ax: Any, axis: str = "y") -> None:
    """Whole-number ticks on a count axis (never 0.5 instances)."""
    from matplotlib.ticker import MaxNLocator

    getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def headroom(ax: Any, top: float, axis: str = "y", *, frac: float = 0.15) -> None:
    """Axis from 0 to ``frac`` above ``top`` (room for value labels and the legend); 0..1 when empty."""
    upper = top * (1 + frac) if top > 0 else 1.0
    (ax.set_ylim if axis == "y" else ax.set_xlim)(0, upper)


def label_bars(ax: Any, bars: Any, labels: Sequence[str] | None = None, *, skip_zero: bool = True) -> None:
    """Write each bar's value on it (``labels``, else the value as a whole number; zeros left blank)."""
    values = [float(v) for v in bars.datavalues]
    if labels is None:
        labels = [fmt_int(v) for v in values]
    shown = ["" if skip_zero and v == 0 else text for v, text in zip(values, labels, strict=True)]
    ax.bar_label(bars, labels=shown, padding=2, fontsize="small")


def empty_panel(ax: Any, title: str, message: str) -> None:
    """A panel with nothing to plot: its title and ``message`` centred, no axes."""
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color("0.8")
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize="large",
            color="0.25", wrap=True, gid=_EMPTY_GID)


_EMPTY_GID = "shoal-empty-panel"


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
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def table_lines(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A plain fixed-width text table for summaries."""
    body = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in body)]
