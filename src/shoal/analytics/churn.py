"""Churn: how much registration traffic each service generates, and which instances flap.

A registry's load and its clients' push storms come from change, not size: a handful of instances
whose health checks flap, or a deployment re-registering a whole service every minute, dominate the
push and sync traffic. This job reads the change-event logs of the snapshots (any number of nodes,
any number of snapshots per node: overlapping logs of successive snapshots of one node are
de-duplicated) and reports, per service and time bucket, registrations, deregistrations and health
flips, and ranks instances by how often they flap.

An event is counted where it originated (``register``/``deregister`` on the node the client is
connected to or owned by, ``health_flip`` on the node running the check); peers log the replicated
change as ``sync_applied``, which is reported per node but not counted as churn again.

*Flaps* of an instance (``namespace, group, service, ip, port``): its health flips plus the number
of complete deregister/register cycles, ``min(registrations, deregistrations)``.

Outputs, in the job's own directory (the CLI's default: ``report/churn/``):
``service_buckets.parquet`` (service x bucket counts; ``bucket_start`` a UTC timestamp),
``flapping.parquet`` (instances with at least one flap, most first; ``first_at``/``last_at``),
``nodes.parquet`` (events per node and kind), ``churn.png`` and ``summary.txt``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shoal.analytics import report
from shoal.analytics.load import stage_snapshots
from shoal.analytics.progress import spark_progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["CHURN_KINDS", "ChurnResult", "run"]

log = logging.getLogger(__name__)

CHURN_KINDS: tuple[str, ...] = ("register", "deregister", "health_flip")
_COUNT_COLUMNS = {"register": "registrations", "deregister": "deregistrations", "health_flip": "health_flips"}
SERVICE: tuple[str, ...] = ("namespace", "group", "service")
INSTANCE: tuple[str, ...] = (*SERVICE, "ip", "port")
#: The job's steps, as its progress line counts them.
STEPS: tuple[str, ...] = ("counting changes per bucket", "ranking flapping instances", "counting per node",
                          "writing report")


@dataclass(slots=True)
class ChurnResult:
    bucket_s: int
    events: int
    first_ms: int | None
    last_ms: int | None
    totals: dict[str, int]
    service_buckets: pa.Table
    flapping: pa.Table
    nodes: pa.Table
    out_dir: Path
    elapsed_s: float
    outputs: dict[str, Path] = field(default_factory=dict)


def run(
    spark: SparkSession,
    inputs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    bucket_s: int = 60,
    top: int = 20,
    keep_staging: bool = False,
    show_progress: bool = True,
) -> ChurnResult:
    """Churn over the event logs of every snapshot under ``inputs``; results to ``out``."""
    if bucket_s < 1:
        raise ValueError(f"--bucket-seconds must be >= 1, got {bucket_s}")
    started = time.monotonic()
    out_dir = report.job_dir(out, "churn")
    staged = stage_snapshots(inputs, out_dir, ["events"], one_per_node=False, show_progress=show_progress)
    try:
        with spark_progress(spark, "churn", STEPS, enabled=show_progress) as progress:
            with progress.step(STEPS[0]):
                events = staged.read(spark, "events").dropDuplicates().cache()
                service_buckets, flapping, nodes, span = _compute(events, bucket_s * 1000)
                sb = report.ms_to_timestamps(service_buckets.orderBy("bucket_start_ms", *SERVICE).toArrow(),
                                             {"bucket_start_ms": "bucket_start"})
            with progress.step(STEPS[1]):
                fl = report.ms_to_timestamps(flapping.toArrow(), {"first_ms": "first_at", "last_ms": "last_at"})
            with progress.step(STEPS[2]):
                nd = nodes.orderBy("node", "kind").toArrow()
                sp = span.collect()[0].asDict()
                events.unpersist()
            with progress.step(STEPS[3], spark_jobs=False):
                totals = {col: int(pc.sum(sb[col]).as_py() or 0) for col in _COUNT_COLUMNS.values()}
                result = ChurnResult(
                    bucket_s=bucket_s, events=int(sp["events"]), first_ms=sp["first_ms"], last_ms=sp["last_ms"],
                    totals=totals, service_buckets=sb, flapping=fl, nodes=nd, out_dir=out_dir,
                    elapsed_s=time.monotonic() - started,
                )
                result.outputs["service_buckets"] = report.write_table(sb, out_dir / "service_buckets.parquet")
                result.outputs["flapping"] = report.write_table(fl, out_dir / "flapping.parquet")
                result.outputs["nodes"] = report.write_table(nd, out_dir / "nodes.parquet")
                result.outputs["chart"] = _chart(out_dir / "churn.png", result, staged.manifests)
                result.elapsed_s = time.monotonic() - started
                result.outputs["summary"] = report.write_summary(out_dir, _summary(result, top))
    finally:
        if not keep_staging:
            staged.cleanup()
    return result


def _compute(events: DataFrame, bucket_ms: int) -> tuple[DataFrame, ...]:
    from pyspark.sql import functions as F

    churn = events.where(F.col("kind").isin(*CHURN_KINDS) & F.col("service").isNotNull())
    counts = [F.sum((F.col("kind") == k).cast("long")).alias(c) for k, c in _COUNT_COLUMNS.items()]
    service_buckets = (
        churn.withColumn("bucket_start_ms", F.floor(F.col("ts_ms") / bucket_ms).cast("long") * bucket_ms)
        .groupBy(*SERVICE, "bucket_start_ms")
        .agg(*counts)
    )
    flaps = F.col("health_flips") + F.least(F.col("registrations"), F.col("deregistrations"))
    flapping = (
        churn.where(F.col("ip").isNotNull() & F.col("port").isNotNull())
        .groupBy(*INSTANCE)
        .agg(*counts, F.min("ts_ms").alias("first_ms"), F.max("ts_ms").alias("last_ms"),
             F.array_sort(F.collect_set("node")).alias("nodes"))
        .withColumn("flaps", flaps)
        .where(F.col("flaps") > 0)
        .orderBy(F.col("flaps").desc(), F.col("health_flips").desc(), *INSTANCE)
    )
    nodes = events.groupBy("node", "kind").count()
    span = events.agg(F.count(F.lit(1)).alias("events"), F.min("ts_ms").alias("first_ms"),
                      F.max("ts_ms").alias("last_ms"))
    return service_buckets, flapping, nodes, span


def _summary(res: ChurnResult, top: int) -> list[str]:
    t = res.totals
    lines = [
        "Shoal churn report",
        f"events: {res.events:,} from {report.fmt_ms(res.first_ms)} to {report.fmt_ms(res.last_ms)}; "
        f"buckets of {res.bucket_s} s",
        f"registrations {t['registrations']:,}, deregistrations {t['deregistrations']:,}, "
        f"health flips {t['health_flips']:,}",
        "",
    ]
    per_service: dict[tuple[str, str, str], list[int]] = {}
    peak: dict[tuple[str, str, str], int] = {}
    for r in res.service_buckets.to_pylist():
        key = (r["namespace"], r["group"], r["service"])
        acc = per_service.setdefault(key, [0, 0, 0])
        n = r["registrations"] + r["deregistrations"] + r["health_flips"]
        acc[0] += r["registrations"]
        acc[1] += r["deregistrations"]
        acc[2] += r["health_flips"]
        peak[key] = max(peak.get(key, 0), n)
    busiest = sorted(per_service.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:top]
    if busiest:
        lines.append("busiest services (changes in total; peak per bucket):")
        lines += ["  " + x for x in report.table_lines(
            ["service", "registrations", "deregistrations", "health_flips", "peak/bucket"],
            [[f"{k[0]}/{k[1]}/{k[2]}", v[0], v[1], v[2], peak[k]] for k, v in busiest],
        )]
        lines.append("")
    flapping = res.flapping.slice(0, top).to_pylist()
    if flapping:
        lines.append(f"flapping instances (top {len(flapping)} of {res.flapping.num_rows:,}):")
        for r in flapping:
            lines.append(
                f"  {r['namespace']}/{r['group']}/{r['service']} {r['ip']}:{r['port']}: {r['flaps']} flaps "
                f"({r['health_flips']} health flips, {r['registrations']} registrations, "
                f"{r['deregistrations']} deregistrations) seen on {', '.join(r['nodes'])}"
            )
    else:
        lines.append("no flapping instances.")
    lines += ["", f"elapsed: {res.elapsed_s:.1f} s"]
    return lines


def _chart(path: Path, res: ChurnResult, manifests: Sequence[Any]) -> Path:
    import matplotlib.dates as mdates

    fig, (ax1, ax2) = report.new_figure(1, 2)
    t = res.totals
    report.snapshot_title(
        fig,
        f"Shoal churn: {t['registrations']:,} registrations, {t['deregistrations']:,} deregistrations, "
        f"{t['health_flips']:,} health flips; {res.flapping.num_rows:,} flapping instances",
        [(m.node, m.taken_at_ms) for m in manifests],
    )
    by_bucket: dict[datetime, list[int]] = {}
    for r in res.service_buckets.to_pylist():
        acc = by_bucket.setdefault(r["bucket_start"], [0, 0, 0])
        acc[0] += r["registrations"]
        acc[1] += r["deregistrations"]
        acc[2] += r["health_flips"]
    title = f"changes per {res.bucket_s} s bucket"
    if not by_bucket:
        report.empty_panel(ax1, title, "no registrations, deregistrations or health flips\n"
                                       "in the snapshots' event logs")
    else:
        xs = sorted(by_bucket)
        annotate_all = len(xs) <= 24
        peak = 0
        for i, label in enumerate(("registrations", "deregistrations", "health flips")):
            ys = [by_bucket[x][i] for x in xs]
            peak = max(peak, *ys)
            (line,) = ax1.plot(xs, ys, marker="o", markersize=3, label=label)
            points = range(len(xs)) if annotate_all else [max(range(len(xs)), key=lambda j: ys[j])]
            for j in points:
                if ys[j]:
                    ax1.annotate(report.fmt_int(ys[j]), (xs[j], ys[j]), textcoords="offset points", xytext=(0, 4),
                                 ha="center", fontsize="x-small", color=line.get_color())
        locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]  # untyped in matplotlib
        ax1.xaxis.set_major_locator(locator)
        ax1.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))  # type: ignore[no-untyped-call]
        report.integer_ticks(ax1)
        report.headroom(ax1, peak, frac=0.25)
        ax1.set_xlabel("bucket start (UTC)")
        ax1.set_ylabel("changes")
        ax1.set_title(title)
        ax1.legend(loc="upper right", ncols=3, fontsize="small")
    top: list[dict[str, Any]] = res.flapping.slice(0, 15).to_pylist()
    if not top:
        report.empty_panel(ax2, "most flapping instances",
                           "no flapping instances:\nno health flips and no deregister/register cycles")
    else:
        y = np.arange(len(top))
        bars = ax2.barh(y, [r["flaps"] for r in top], color="tab:purple")
        report.label_bars(ax2, bars)
        ax2.set_yticks(y, report.service_labels(top, " {ip}:{port}"))
        ax2.invert_yaxis()
        report.integer_ticks(ax2, "x")
        report.headroom(ax2, max(r["flaps"] for r in top), "x")
        ax2.set_xlabel("flaps (health flips + deregister/register cycles)")
        ax2.set_title(f"most flapping instances ({len(top)} of {res.flapping.num_rows:,})")
    return report.save_figure(fig, path)
