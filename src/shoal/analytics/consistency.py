"""Consistency: do the nodes of a Distro cluster hold the same instances?

Distro is AP: every node serves reads from its own copy, and copies converge through sync and the
periodic verify. When something goes wrong (a lost sync, a stuck verify, a split) the symptom is a
client seeing different instances depending on the node it asks. This job compares snapshots of all
nodes taken at about the same time and says, per service and per node, which instances are missing,
extra or different, and how much of the registry agrees everywhere.

Identity of an instance: ``(namespace, group, service, cluster, ip, port)``. Two copies are
*different* when weight, healthy, enabled or metadata differ. If one node holds several rows with
the same identity (two clients publishing the same ip:port) the one with the highest client revision
(then client id) is its copy.

Reference (what a node *should* hold), chosen per identity:

1. **The owner's copy.** In Distro the responsible node (``owner_node``: the majority value among
   the copies, ties to the smallest address) is the source of truth for its clients' instances. If
   the owner's snapshot is among the inputs, the identity should exist iff the owner holds it, with
   the owner's values.
2. **Majority** otherwise (owner unknown or not snapshotted): the identity should exist iff at least
   half of the nodes hold it, with the most common values (ties to the copy of the smallest node).

Relative to the reference, each (identity, node) is ``missing`` (should exist, absent), ``extra``
(exists, should not) or ``different`` (exists with other values). The cluster-wide *agreement ratio*
does not depend on the reference: identities held by every node with identical values / all
identities held by any node.

Outputs in ``--out``: ``per_service_node.parquet`` (counts per service and node),
``services.parquet`` (agreement per service), ``diffs.parquet/`` (one row per difference),
``consistency.png`` and ``summary.txt``.
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

from shoal.analytics import report
from shoal.analytics.load import stage_snapshots
from shoal.analytics.progress import spark_progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["IDENTITY", "VALUE_COLUMNS", "ConsistencyResult", "run"]

log = logging.getLogger(__name__)

IDENTITY: tuple[str, ...] = ("namespace", "group", "service", "cluster", "ip", "port")
VALUE_COLUMNS: tuple[str, ...] = ("weight", "healthy", "enabled", "metadata")
SERVICE: tuple[str, ...] = ("namespace", "group", "service")
STATUSES: tuple[str, ...] = ("missing", "extra", "different")


@dataclass(slots=True)
class ConsistencyResult:
    nodes: list[str]
    identities: int
    agreeing: int
    counts: dict[str, int]
    first_differences: list[dict[str, Any]]
    out_dir: Path
    elapsed_s: float
    outputs: dict[str, Path] = field(default_factory=dict)

    @property
    def agreement_ratio(self) -> float:
        return self.agreeing / self.identities if self.identities else 1.0


def run(
    spark: SparkSession,
    inputs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    first: int = 20,
    keep_staging: bool = False,
    show_progress: bool = True,
) -> ConsistencyResult:
    """Compare the newest snapshot of every node found under ``inputs``; write results to ``out``."""
    started = time.monotonic()
    out_dir = report.ensure_dir(out)
    staged = stage_snapshots(inputs, out_dir, ["instances"], one_per_node=True, show_progress=show_progress)
    try:
        nodes = staged.nodes
        if len(nodes) < 2:
            raise ValueError(f"consistency needs snapshots of at least 2 nodes, found {nodes}")
        taken = [m.taken_at_ms for m in staged.manifests]
        spread_s = (max(taken) - min(taken)) / 1000
        diffs, per_service_node, services, agree = _compute(spark, staged.read(spark, "instances"), nodes)

        with spark_progress(spark, "consistency") if show_progress else nullcontext():
            diffs_path = report.write_df(diffs.orderBy("namespace", "group", "service", "ip", "port",
                                                       "cluster", "node"), out_dir / "diffs.parquet")
            diffs_saved = spark.read.parquet(str(diffs_path))
            psn = per_service_node.orderBy(*SERVICE, "node").toArrow()
            svc = services.orderBy(*SERVICE).toArrow()
            totals = agree.collect()[0]
            by_node_status = diffs_saved.groupBy("node", "status").count().collect()
            firsts = [r.asDict(recursive=True) for r in diffs_saved.orderBy(
                "namespace", "group", "service", "ip", "port", "cluster", "node").limit(first).collect()]
    finally:
        if not keep_staging:
            staged.cleanup()

    counts = {s: 0 for s in STATUSES}
    per_node: dict[str, dict[str, int]] = {n: {s: 0 for s in STATUSES} for n in nodes}
    for row in by_node_status:
        counts[row["status"]] += row["count"]
        per_node[row["node"]][row["status"]] += row["count"]

    result = ConsistencyResult(
        nodes=nodes,
        identities=int(totals["identities"] or 0),
        agreeing=int(totals["agreeing"] or 0),
        counts=counts,
        first_differences=firsts,
        out_dir=out_dir,
        elapsed_s=time.monotonic() - started,
    )
    result.outputs["per_service_node"] = report.write_table(psn, out_dir / "per_service_node.parquet")
    result.outputs["services"] = report.write_table(svc, out_dir / "services.parquet")
    result.outputs["diffs"] = diffs_path
    result.outputs["chart"] = _chart(out_dir / "consistency.png", per_node, svc)
    result.outputs["summary"] = report.write_summary(
        out_dir, _summary(result, staged.manifests, spread_s, per_node, svc)
    )
    return result


def _compute(spark: SparkSession, raw: DataFrame, nodes: list[str]) -> tuple[DataFrame, ...]:
    """(diffs, per_service_node, services, agreement totals) as lazy DataFrames."""
    from pyspark.sql import functions as F

    ident = list(IDENTITY)
    n = len(nodes)
    # one copy per (identity, node); metadata as sorted entries so copies can be compared/grouped
    copies = (
        raw.select(
            *ident, "node", "owner_node",
            F.struct(
                F.col("client_revision").alias("rev"), F.col("client_id").alias("cid"),
                F.col("weight"), F.col("healthy"), F.col("enabled"),
                F.array_sort(F.map_entries("metadata")).alias("md"),
                F.col("owner_node"),
            ).alias("c"),
        )
        .groupBy(*ident, "node")
        .agg(F.max("c").alias("c"))
        .select(
            *ident, "node",
            F.col("c.owner_node").alias("owner_node"),
            F.struct(F.col("c.weight").alias("weight"), F.col("c.healthy").alias("healthy"),
                     F.col("c.enabled").alias("enabled"), F.col("c.md").alias("md")).alias("v"),
        )
        .cache()
    )
    # owner per identity: most common owner_node among the copies, ties to the smallest address
    owners = (
        copies.where(F.col("owner_node").isNotNull())
        .groupBy(*ident, "owner_node").count()
        .groupBy(*ident)
        .agg(F.min(F.struct((-F.col("count")).alias("nc"), F.col("owner_node").alias("o"))).alias("m"))
        .select(*ident, F.col("m.o").alias("owner"))
    )
    # per identity: holders, distinct values, the majority value (ties: value of the smallest node)
    values = (
        copies.groupBy(*ident, "v").agg(F.count(F.lit(1)).alias("c"), F.min("node").alias("first_node"))
        .groupBy(*ident)
        .agg(
            F.sum("c").alias("holders"),
            F.count(F.lit(1)).alias("n_values"),
            F.min(F.struct((-F.col("c")).alias("nc"), F.col("first_node"), F.col("v"))).alias("m"),
        )
        .select(*ident, "holders", "n_values", F.col("m.v").alias("majority_v"))
    )
    owner_copies = copies.select(*ident, F.col("node").alias("owner"), F.col("v").alias("owner_v"))
    node_list = F.array(*[F.lit(x) for x in nodes])
    ref = (
        values.join(owners, ident, "left")
        .join(owner_copies, [*ident, "owner"], "left")
        .withColumn("owner_in", F.coalesce(F.array_contains(node_list, F.col("owner")), F.lit(False)))
        .select(
            *ident, "holders", "n_values", "owner",
            F.when(F.col("owner_in"), F.col("owner_v").isNotNull())
            .otherwise(F.col("holders") * 2 >= n).alias("expected"),
            F.when(F.col("owner_in"), F.col("owner_v")).otherwise(F.col("majority_v")).alias("ref_v"),
            F.when(F.col("owner_in"), F.concat(F.lit("owner "), F.col("owner")))
            .otherwise(F.lit("majority")).alias("reference"),
        )
    )
    nodes_df = spark.createDataFrame([(x,) for x in nodes], "node string")
    grid = (
        ref.crossJoin(nodes_df)
        .join(copies.select(*ident, "node", "v"), [*ident, "node"], "left")
        .withColumn(
            "status",
            F.when(F.col("expected") & F.col("v").isNull(), F.lit("missing"))
            .when(~F.col("expected") & F.col("v").isNotNull(), F.lit("extra"))
            .when(F.col("expected") & (F.col("v") != F.col("ref_v")), F.lit("different")),
        )
    )
    differs = F.concat_ws(
        ",",
        *[F.when(~F.col(f"v.{c}").eqNullSafe(F.col(f"ref_v.{c}")), F.lit(c if c != "md" else "metadata"))
          for c in ("weight", "healthy", "enabled", "md")],
    )
    diffs = grid.where(F.col("status").isNotNull()).select(
        *ident, "node", "status",
        F.when(F.col("status") == "different", differs).otherwise(F.lit("")).alias("differs"),
        F.col("v.weight").alias("weight"), F.col("ref_v.weight").alias("ref_weight"),
        F.col("v.healthy").alias("healthy"), F.col("ref_v.healthy").alias("ref_healthy"),
        F.col("v.enabled").alias("enabled"), F.col("ref_v.enabled").alias("ref_enabled"),
        F.map_from_entries(F.col("v.md")).alias("metadata"),
        F.map_from_entries(F.col("ref_v.md")).alias("ref_metadata"),
        "reference", F.col("owner").alias("owner_node"),
    )
    per_service_node = grid.groupBy(*SERVICE, "node").agg(
        F.count(F.col("v")).alias("instances"),
        F.sum(F.col("expected").cast("long")).alias("expected"),
        *[F.sum((F.col("status") == s).cast("long")).alias(s) for s in STATUSES],
    ).fillna(0, subset=list(STATUSES))
    agreeing = (F.col("holders") == n) & (F.col("n_values") == 1)
    services = ref.groupBy(*SERVICE).agg(
        F.count(F.lit(1)).alias("identities"),
        F.sum(agreeing.cast("long")).alias("agreeing"),
    ).withColumn("agreement_ratio", F.col("agreeing") / F.col("identities"))
    agree = ref.agg(F.count(F.lit(1)).alias("identities"), F.sum(agreeing.cast("long")).alias("agreeing"))
    return diffs, per_service_node, services, agree


def describe(d: dict[str, Any]) -> str:
    """One line naming a difference: service, ip:port, node and what differs."""
    where = (f"{d['namespace']}/{d['group']}/{d['service']} cluster {d['cluster']} "
             f"{d['ip']}:{d['port']} on node {d['node']}")
    ref = d["reference"]
    if d["status"] == "missing":
        return f"{where}: missing (present in reference: {ref})"
    if d["status"] == "extra":
        return f"{where}: extra (absent in reference: {ref})"
    parts = []
    for name in str(d["differs"]).split(","):
        if not name:
            continue
        mine, theirs = d[name], d[f"ref_{name}"]
        if name == "metadata":
            mine, theirs = dict(mine or {}), dict(theirs or {})
        parts.append(f"{name} {mine!r} vs {theirs!r}")
    return f"{where}: different {'; '.join(parts)} (reference: {ref})"


def _summary(
    result: ConsistencyResult,
    manifests: Sequence[Any],
    spread_s: float,
    per_node: dict[str, dict[str, int]],
    services: Any,
) -> list[str]:
    lines = [
        "Shoal consistency report",
        f"nodes: {len(result.nodes)}; snapshots taken within {spread_s:.1f} s of each other",
    ]
    for m in manifests:
        lines.append(f"  {m.node}  taken {report.fmt_ms(m.taken_at_ms)}  instances {m.rows['instances']:,}")
    if spread_s > 10:
        lines.append("  note: snapshots are far apart; some differences may be changes in flight")
    total = sum(result.counts.values())
    lines += [
        f"identities: {result.identities:,}; identical on all nodes: {result.agreeing:,}; "
        f"agreement ratio {result.agreement_ratio:.6f}",
        f"differences: {total:,} (missing {result.counts['missing']:,}, extra {result.counts['extra']:,}, "
        f"different {result.counts['different']:,})",
        "reference: the owner node's copy when the owner was snapshotted, else the majority of nodes",
        "",
    ]
    if total:
        lines.append("per node:")
        lines += ["  " + x for x in report.table_lines(
            ["node", "missing", "extra", "different"],
            [[n, c["missing"], c["extra"], c["different"]] for n, c in per_node.items()],
        )]
        worst = sorted(
            (r for r in services.to_pylist() if r["agreeing"] < r["identities"]),
            key=lambda r: (r["agreement_ratio"], r["namespace"], r["group"], r["service"]),
        )[:10]
        if worst:
            lines.append("")
            lines.append("least consistent services:")
            lines += [f"  {r['namespace']}/{r['group']}/{r['service']}: {r['agreeing']}/{r['identities']} "
                      f"identical ({r['agreement_ratio']:.3f})" for r in worst]
        lines.append("")
        lines.append(f"first differences ({len(result.first_differences)} of {total:,}):")
        lines += ["  " + describe(d) for d in result.first_differences]
    else:
        lines.append("all nodes agree on every instance.")
    lines += ["", f"elapsed: {result.elapsed_s:.1f} s"]
    return lines


def _chart(path: Path, per_node: dict[str, dict[str, int]], services: Any) -> Path:
    fig, (ax1, ax2) = report.new_figure(1, 2)
    names = list(per_node)
    bottom = [0] * len(names)
    for status_name, color in zip(STATUSES, ("tab:red", "tab:orange", "tab:blue"), strict=True):
        vals = [per_node[n][status_name] for n in names]
        ax1.bar(names, vals, bottom=bottom, label=status_name, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax1.set_title("differences per node (vs reference)")
    ax1.set_ylabel("instances")
    ax1.legend()
    ax1.tick_params(axis="x", rotation=30)
    rows = sorted(services.to_pylist(), key=lambda r: (r["agreement_ratio"], r["service"]))[:15]
    ax2.barh([f"{r['group']}/{r['service']}" for r in rows], [r["agreement_ratio"] for r in rows])
    ax2.set_xlim(0, 1)
    ax2.set_title("least consistent services (agreement ratio)")
    ax2.invert_yaxis()
    return report.save_figure(fig, path)
