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

Outputs in ``--out``: ``service_buckets.parquet`` (service x bucket counts), ``flapping.parquet``
(instances with at least one flap, most first), ``nodes.parquet`` (events per node and kind),
``churn.png`` and ``summary.txt``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    out_dir = report.ensure_dir(out)
    staged = stage_snapshots(inputs, out_dir, ["events"], one_per_node=False, show_progress=show_progress)
    try:
        with spark_progress(spark, "churn") if show_progress else nullcontext():
            events = staged.read(spark, "events").dropDuplicates().cache()
            service_buckets, flapping, nodes, span = _compute(events, bucket_s * 1000)
            sb = service_buckets.orderBy("bucket_start_ms", *SERVICE).toArrow()
            fl = flapping.toArrow()
            nd = nodes.orderBy("node", "kind").toArrow()
            sp = span.collect()[0].asDict()
            events.unpersist()
    finally:
        if not keep_staging:
            staged.cleanup()

    totals = {col: int(pc.sum(sb[col]).as_py() or 0) for col in _COUNT_COLUMNS.values()}
    result = ChurnResult(
        bucket_s=bucket_s, events=int(sp["events"]), first_ms=sp["first_ms"], last_ms=sp["last_ms"],
        totals=totals, service_buckets=sb, flapping=fl, nodes=nd, out_dir=out_dir,
        elapsed_s=time.monotonic() - started,
    )
    result.outputs["service_buckets"] = report.write_table(sb, out_dir / "service_buckets.parquet")
    result.outputs["flapping"] = report.write_table(fl, out_dir / "flapping.parquet")
    result.outputs["nodes"] = report.write_table(nd, out_dir / "nodes.parquet")
    result.outputs["chart"] = _chart(out_dir / "churn.png", result)
    result.outputs["summary"] = report.write_summary(out_dir, _summary(result, top))
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


def _chart(path: Path, res: ChurnResult) -> Path:
    fig, (ax1, ax2) = report.new_figure(1, 2)
    by_bucket: dict[int, list[int]] = {}
    for r in res.service_buckets.to_pylist():
        acc = by_bucket.setdefault(r["bucket_start_ms"], [0, 0, 0])
        acc[0] += r["registrations"]
        acc[1] += r["deregistrations"]
        acc[2] += r["health_flips"]
    xs = sorted(by_bucket)
    t0 = xs[0] if xs else 0
    minutes = [(x - t0) / 60_000 for x in xs]
    for i, label in enumerate(("registrations", "deregistrations", "health flips")):
        ax1.plot(minutes, [by_bucket[x][i] for x in xs], marker=".", label=label)
    ax1.set_xlabel(f"minutes since {report.fmt_ms(t0) if xs else '-'}")
    ax1.set_ylabel(f"events per {res.bucket_s} s")
    ax1.set_title("churn over time")
    ax1.legend()
    top: list[dict[str, Any]] = res.flapping.slice(0, 15).to_pylist()
    ax2.barh([f"{r['service']} {r['ip']}:{r['port']}" for r in top], [r["flaps"] for r in top])
    ax2.invert_yaxis()
    ax2.set_title("most flapping instances")
    ax2.set_xlabel("flaps")
    return report.save_figure(fig, path)
