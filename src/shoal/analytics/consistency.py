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

Outputs, in the job's own directory (the CLI's default: ``report/consistency/``):
``per_service_node.parquet`` (counts per service and node), ``services.parquet`` (agreement per
service), ``diffs.parquet/`` (one row per difference), ``consistency.png`` and ``summary.txt``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

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
#: The job's steps, as its progress line counts them.
STEPS: tuple[str, ...] = ("comparing copies", "collecting differences", "counting per service", "writing report")
#: Up to this many differences, their keys are broadcast to fetch the values back.
_BROADCAST_DIFFS = 200_000


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
    from pyspark.sql import functions as F

    started = time.monotonic()
    out_dir = report.job_dir(out, "consistency")
    staged = stage_snapshots(inputs, out_dir, ["instances"], one_per_node=True, show_progress=show_progress)
    try:
        nodes = staged.nodes
        if len(nodes) < 2:
            raise ValueError(f"consistency needs snapshots of at least 2 nodes, found {nodes}")
        taken = [m.taken_at_ms for m in staged.manifests]
        spread_s = (max(taken) - min(taken)) / 1000
        with spark_progress(spark, "consistency", STEPS, enabled=show_progress) as progress:
            with progress.step(STEPS[0]):
                raw = staged.read(spark, "instances")
                table = _identity_table(raw, nodes).cache()
                # one pass over the snapshots fills the cache; every output below reads the cached rows
                agreeing = (F.col("holders") == len(nodes)) & (F.col("n_values") == 1)
                n_diffs = F.aggregate("per_node", F.lit(0),
                                      lambda acc, e: acc + e["status"].isNotNull().cast("int"))
                totals = table.agg(
                    F.count(F.lit(1)).alias("identities"), F.sum(agreeing.cast("long")).alias("agreeing"),
                    F.sum(n_diffs).alias("diffs"),
                ).collect()[0]
            with progress.step(STEPS[1]):
                diffs, per_service_node, services = _outputs(
                    raw, table, len(nodes), broadcast_keys=(totals["diffs"] or 0) <= _BROADCAST_DIFFS)
                diffs_path = report.write_df(diffs.orderBy("namespace", "group", "service", "ip", "port",
                                                           "cluster", "node"), out_dir / "diffs.parquet")
                diffs_saved = spark.read.parquet(str(diffs_path))
                by_node_status = diffs_saved.groupBy("node", "status").count().collect()
                firsts = [r.asDict(recursive=True) for r in diffs_saved.orderBy(
                    "namespace", "group", "service", "ip", "port", "cluster", "node").limit(first).collect()]
            with progress.step(STEPS[2]):
                psn = per_service_node.orderBy(*SERVICE, "node").toArrow()
                svc = services.orderBy(*SERVICE).toArrow()
                table.unpersist()
            with progress.step(STEPS[3], spark_jobs=False):
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
                result.outputs["chart"] = _chart(out_dir / "consistency.png", result, staged.manifests,
                                                 per_node, svc)
                result.elapsed_s = time.monotonic() - started
                result.outputs["summary"] = report.write_summary(
                    out_dir, _summary(result, staged.manifests, spread_s, per_node, svc)
                )
    finally:
        if not keep_staging:
            staged.cleanup()
    return result


def _value(df: DataFrame) -> Any:
    """The compared part of a copy; metadata as sorted entries (maps cannot be compared)."""
    from pyspark.sql import functions as F

    return F.struct(
        df["weight"].alias("weight"), df["healthy"].alias("healthy"), df["enabled"].alias("enabled"),
        F.array_sort(F.map_entries(df["metadata"])).alias("md"),
    )


def _identity_table(raw: DataFrame, nodes: list[str]) -> DataFrame:
    """One row per identity: owner, reference, and per node the copy held (if any) and its status.

    One shuffle of small rows: all copies of an identity are collected into one row (a few per
    node) carrying a 64-bit hash of the compared values instead of the values, and everything else
    is array arithmetic on that row (Spark higher-order functions). Values are fetched back only for
    the differences (:func:`_outputs`). Two different values with equal xxhash64 would be taken as
    equal: with 2**-64 odds per compared pair, accepted."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    ident = list(IDENTITY)
    n = len(nodes)
    node_list = F.array(*[F.lit(x) for x in nodes])
    rows = raw.select(*ident, F.struct(
        F.col("client_revision").alias("rev"), F.col("client_id").alias("cid"),
        F.xxhash64(_value(raw)).alias("vh"), F.col("owner_node").alias("owner"), F.col("node").alias("node"),
    ).alias("r"))
    per_id = rows.groupBy(*ident).agg(F.collect_list("r").alias("rows"))

    def on(arr: str | Column, pred: Any) -> Column:
        return F.filter(arr, pred)

    # Each step is its own projection so every array expression is evaluated once per identity
    # (Spark does not collapse projections that would duplicate non-trivial expressions).
    # 1. one copy per node: the row with the highest (client revision, client id)
    step = per_id.select(*ident, F.transform(
        F.array_distinct(F.transform("rows", lambda r: r["node"])),
        lambda nd: F.array_max(on("rows", lambda r: r["node"] == nd)),
    ).alias("copies"))
    # 2. the copies aligned with the node list (null where a node holds none), owner, majority
    owners = F.array_distinct(on(F.transform("copies", lambda c: c["owner"]), lambda o: o.isNotNull()))
    owner = F.array_min(F.transform(owners, lambda o: F.struct(
        (-F.size(on("copies", lambda c: c["owner"] == o))).alias("nc"), o.alias("o"),
    )))["o"]
    values = F.array_distinct(F.transform("copies", lambda c: c["vh"]))
    # majority value, ties to the value held by the smallest node; that node's copy is the reference
    majority = F.array_min(F.transform(values, lambda x: F.struct(
        (-F.size(on("copies", lambda c: c["vh"] == x))).alias("nc"),
        F.array_min(F.transform(on("copies", lambda c: c["vh"] == x), lambda c: c["node"])).alias("node"),
    )))["node"]
    step = step.select(
        *ident,
        F.transform(node_list, lambda nd: F.try_element_at(on("copies", lambda c: c["node"] == nd), F.lit(1)))
        .alias("aligned"),
        owner.alias("owner"), F.size("copies").alias("holders"), F.size(values).alias("n_values"),
        majority.alias("majority_node"),
    )
    # 3. the reference copy
    owner_pos = F.coalesce(F.array_position(node_list, F.col("owner")), F.lit(0)).cast("int")
    majority_pos = F.array_position(node_list, F.col("majority_node")).cast("int")
    owner_in = owner_pos > 0
    owner_copy = F.when(owner_in, F.element_at("aligned", owner_pos))
    step = step.select(
        *ident, "aligned", "owner", "holders", "n_values", owner_in.alias("owner_in"),
        owner_copy.alias("owner_copy"), F.element_at("aligned", majority_pos).alias("majority_copy"),
    )
    step = step.select(
        *ident, "aligned", "owner", "holders", "n_values",
        F.when(F.col("owner_in"), F.col("owner_copy").isNotNull())
        .otherwise(F.col("holders") * 2 >= n).alias("expected"),
        F.when(F.col("owner_in"), F.col("owner_copy")).otherwise(F.col("majority_copy")).alias("ref"),
        F.when(F.col("owner_in"), F.concat(F.lit("owner "), F.col("owner"))).otherwise(F.lit("majority"))
        .alias("reference"),
    )

    # 4. per node: the copy held and its status against the reference
    def node_entry(nd: Column, c: Column) -> Column:
        expected = F.col("expected")
        status = (
            F.when(expected & c.isNull(), F.lit("missing"))
            .when(~expected & c.isNotNull(), F.lit("extra"))
            .when(expected & (c["vh"] != F.col("ref.vh")), F.lit("different"))
        )
        return F.struct(nd.alias("node"), c["rev"].alias("rev"), c["cid"].alias("cid"), status.alias("status"))

    return step.select(
        *ident, "owner", "holders", "n_values", "expected", "reference",
        F.col("ref.node").alias("ref_node"), F.col("ref.rev").alias("ref_rev"), F.col("ref.cid").alias("ref_cid"),
        F.zip_with(node_list, "aligned", node_entry).alias("per_node"),
    )


def _outputs(raw: DataFrame, table: DataFrame, n: int, *, broadcast_keys: bool) -> tuple[DataFrame, ...]:
    """(diffs, per_service_node, services) from the identity table; the values
    of the differing copies and of their references are joined back from the snapshots."""
    from pyspark.sql import functions as F

    ident = list(IDENTITY)
    keys = table.select(
        *ident, "owner", "reference", "ref_node", "ref_rev", "ref_cid",
        F.explode(F.filter("per_node", lambda e: e["status"].isNotNull())).alias("e"),
    ).select(
        *ident, "owner", "reference", "ref_node", "ref_rev", "ref_cid",
        F.col("e.node").alias("node"), F.col("e.rev").alias("rev"), F.col("e.cid").alias("cid"),
        F.col("e.status").alias("status"),
    )
    # only the rows of differing identities are needed: a semi join against the (usually few) keys,
    # broadcast when small so the snapshots are scanned but never shuffled
    wanted = keys.select(*ident).distinct()
    if broadcast_keys:
        wanted = F.broadcast(wanted)
    subset = raw.join(wanted, ident, "left_semi")
    copies = subset.select(*ident, "node", F.col("client_revision").alias("rev"), F.col("client_id").alias("cid"),
                           _value(subset).alias("v"))
    # several rows may share (identity, node, revision, client id) only if a node exported duplicates
    copies = copies.dropDuplicates([*ident, "node", "rev", "cid"])
    mine = copies.select(*ident, "node", "rev", "cid", "v")
    theirs = copies.select(*ident, F.col("node").alias("ref_node"), F.col("rev").alias("ref_rev"),
                           F.col("cid").alias("ref_cid"), F.col("v").alias("ref_v"))
    joined = (
        keys.join(mine, [*ident, "node", "rev", "cid"], "left")
        .join(theirs, [*ident, "ref_node", "ref_rev", "ref_cid"], "left")
    )
    differs = F.concat_ws(",", *[
        F.when(~F.col(f"v.{c}").eqNullSafe(F.col(f"ref_v.{c}")), F.lit("metadata" if c == "md" else c))
        for c in ("weight", "healthy", "enabled", "md")
    ])
    diffs = joined.select(
        *ident, "node", "status",
        F.when(F.col("status") == "different", differs).otherwise(F.lit("")).alias("differs"),
        F.col("v.weight").alias("weight"), F.col("ref_v.weight").alias("ref_weight"),
        F.col("v.healthy").alias("healthy"), F.col("ref_v.healthy").alias("ref_healthy"),
        F.col("v.enabled").alias("enabled"), F.col("ref_v.enabled").alias("ref_enabled"),
        F.map_from_entries(F.col("v.md")).alias("metadata"),
        F.map_from_entries(F.col("ref_v.md")).alias("ref_metadata"),
        "reference", F.col("owner").alias("owner_node"),
    )
    per_service_node = (
        table.select(*SERVICE, "expected", F.explode("per_node").alias("e"))
        .groupBy(*SERVICE, F.col("e.node").alias("node"))
        .agg(
            F.count(F.col("e.rev")).alias("instances"),
            F.sum(F.col("expected").cast("long")).alias("expected"),
            *[F.sum((F.col("e.status") == s).cast("long")).alias(s) for s in STATUSES],
        )
        .fillna(0, subset=list(STATUSES))
    )
    agreeing = (F.col("holders") == n) & (F.col("n_values") == 1)
    services = table.groupBy(*SERVICE).agg(
        F.count(F.lit(1)).alias("identities"),
        F.sum(agreeing.cast("long")).alias("agreeing"),
    ).withColumn("agreement_ratio", F.col("agreeing") / F.col("identities"))
    return diffs, per_service_node, services


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


def _chart(path: Path, result: ConsistencyResult, manifests: Sequence[Any],
           per_node: dict[str, dict[str, int]], services: Any) -> Path:
    fig, (ax1, ax2) = report.new_figure(1, 2)
    total = sum(result.counts.values())
    report.snapshot_title(
        fig,
        f"Shoal consistency: {len(result.nodes)} nodes, {total:,} differences, "
        f"{result.agreeing:,} of {result.identities:,} instances identical everywhere",
        [(m.node, m.taken_at_ms) for m in manifests],
    )
    names = list(per_node)
    if not total:
        report.empty_panel(ax1, "differences per node (vs reference)",
                           f"no differences:\nall {len(names)} nodes hold the same {result.identities:,} instances")
        report.empty_panel(ax2, "least consistent services (instances identical on all nodes)",
                           f"no differences:\nall {len(services):,} services are identical on every node")
        return report.save_figure(fig, path)

    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for status_name, color in zip(STATUSES, ("tab:red", "tab:orange", "tab:blue"), strict=True):
        vals = np.array([per_node[n][status_name] for n in names], dtype=float)
        bars = ax1.bar(x, vals, bottom=bottom, label=status_name, color=color)
        ax1.bar_label(bars, labels=[report.fmt_int(v) if v else "" for v in vals], label_type="center",
                      fontsize="small", color="white")
        bottom += vals
    totals = ax1.bar(x, bottom, fill=False, linewidth=0)  # invisible: carries the per-node totals
    report.label_bars(ax1, totals)
    report.integer_ticks(ax1)
    report.headroom(ax1, float(bottom.max()), frac=0.3)
    ax1.set_xticks(x, names, rotation=30, ha="right")
    ax1.set_title("differences per node (vs reference)")
    ax1.set_ylabel("instances")
    ax1.legend(loc="upper right", ncols=3)

    rows = sorted((r for r in services.to_pylist() if r["agreeing"] < r["identities"]),
                  key=lambda r: (r["agreement_ratio"], r["namespace"], r["group"], r["service"]))[:15]
    y = np.arange(len(rows))
    bars = ax2.barh(y, [r["agreement_ratio"] for r in rows], color="tab:blue")
    report.label_bars(ax2, bars, [f"{r['agreeing']:,}/{r['identities']:,} ({r['agreement_ratio']:.0%})"
                                  for r in rows], skip_zero=False)
    ax2.set_yticks(y, report.service_labels(rows))
    ax2.invert_yaxis()
    ax2.set_xlim(0, 1.25)
    ax2.set_xticks(np.linspace(0, 1, 5), [f"{t:.0%}" for t in np.linspace(0, 1, 5)])
    ax2.set_xlabel("instances identical on all nodes")
    ax2.set_title(f"least consistent services ({len(rows)} of "
                  f"{sum(r['agreeing'] < r['identities'] for r in services.to_pylist()):,} with differences)")
    return report.save_figure(fig, path)
