"""Balance: how evenly clients and instances are spread over owner nodes, and what a membership
change would move.

In Distro every client has one responsible node that heartbeats, verifies and syncs it. gRPC
clients are owned by the node they connected to (so balance depends on the load balancer), ip:port
clients by ``sorted_members[distroHash("ip:port") % n]`` (so balance depends on the hash). A skewed
cluster has a hot node; and because ownership is a modulo, adding or removing one member reassigns
almost every ip:port client, each of which is then re-verified and re-synced. This job measures both
on real snapshots, and compares the movement with a consistent-hash ring
(:mod:`shoal.analytics.ring`: 160 virtual nodes per member by default, ``--vnodes``).

Counting: a client (by ``client_id``) belongs to the node where it is native, else to the most
common ``owner_node`` among the snapshots (ties: smallest address); an instance (by identity
``namespace, group, service, cluster, ip, port``) to the most common ``owner_node`` of its copies.
Members are the snapshotted nodes plus any owner seen in the data, sorted as Nacos sorts them.
Movement is computed for the ip:port clients (key: the client id before ``#``): one member joining
(``--join-member``, default: the next IPv4 address after the highest member) and each member leaving.

Outputs, in the job's own directory (the CLI's default: ``report/balance/``): ``nodes.parquet`` (per
owner node), ``skew.parquet``, ``movement.parquet``, ``balance.png`` and ``summary.txt``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa

from shoal.analytics import report
from shoal.analytics.load import stage_snapshots
from shoal.analytics.progress import spark_progress
from shoal.analytics.ring import DEFAULT_VNODES, Ring, distro_hashes, join_position_map, leave_position_map

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BalanceResult", "default_joiner", "run"]

log = logging.getLogger(__name__)

IDENTITY: Final[tuple[str, ...]] = ("namespace", "group", "service", "cluster", "ip", "port")
#: The job's steps, as its progress line counts them.
STEPS: Final[tuple[str, ...]] = ("finding owners", "collecting ip:port clients", "computing movement",
                                 "writing report")
_MOVE_DDL: Final[str] = "scenario STRING, member STRING, scheme STRING, moved BIGINT, must_move BIGINT"


@dataclass(slots=True)
class BalanceResult:
    members: list[str]
    joiner: str
    ip_port_clients: int
    nodes: pa.Table
    skew: pa.Table
    movement: pa.Table
    out_dir: Path
    elapsed_s: float
    outputs: dict[str, Path] = field(default_factory=dict)


def default_joiner(members: Sequence[str]) -> str:
    """The next IPv4 address after the highest member (same port), else ``joining-member:8848``."""
    taken = set(members)
    parsed = []
    for m in members:
        host, _, port = m.rpartition(":")
        try:
            parsed.append((ipaddress.IPv4Address(host), port))
        except ValueError:
            continue
    if parsed:
        addr, port = max(parsed)
        for step in range(1, 1024):
            try:
                candidate = f"{addr + step}:{port}"
            except ipaddress.AddressValueError:
                break
            if candidate not in taken:
                return candidate
    return "joining-member:8848"


def run(
    spark: SparkSession,
    inputs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    join_member: str | None = None,
    vnodes: int = DEFAULT_VNODES,
    keep_staging: bool = False,
    show_progress: bool = True,
) -> BalanceResult:
    """Balance of the newest snapshot of each node under ``inputs``; results to ``out``."""
    from pyspark.sql import functions as F

    if vnodes < 1:
        raise ValueError(f"--vnodes must be >= 1, got {vnodes}")
    started = time.monotonic()
    out_dir = report.job_dir(out, "balance")
    staged = stage_snapshots(inputs, out_dir, ["clients", "instances"], one_per_node=True,
                             show_progress=show_progress)
    try:
        with spark_progress(spark, "balance", STEPS, enabled=show_progress) as progress:
            with progress.step(STEPS[0]):
                clients, instances = _owners(staged.read(spark, "clients"), staged.read(spark, "instances"))
                clients = clients.cache()
                client_counts = clients.groupBy("owner").agg(
                    F.count(F.lit(1)).alias("clients"),
                    *[F.sum((F.col("kind") == k).cast("long")).alias(k) for k in ("connection", "ip_port")],
                ).collect()
                instance_counts = instances.groupBy("owner").count().collect()
            members = sorted(
                set(staged.nodes)
                | {r["owner"] for r in client_counts if r["owner"] is not None}
                | {r["owner"] for r in instance_counts if r["owner"] is not None}
            )
            joiner = join_member or default_joiner(members)
            if joiner in members:
                raise ValueError(f"--join-member {joiner} is already a member")
            with progress.step(STEPS[1]):
                keys = (
                    clients.where(F.col("kind") == "ip_port")
                    .select(F.split(F.col("client_id"), "#", 2).getItem(0).alias("key"))
                    .distinct()
                    .cache()
                )
                n_keys = keys.count()
            if n_keys:
                with progress.step(STEPS[2]):
                    movement = _movement(keys, members, joiner, vnodes, n_keys)
            else:
                progress.skip(STEPS[2])
                movement = _empty_movement()
            keys.unpersist()
            clients.unpersist()
            with progress.step(STEPS[3], spark_jobs=False):
                result = _result(members, joiner, n_keys, client_counts, instance_counts, movement, out_dir,
                                 started, vnodes, staged.manifests)
    finally:
        if not keep_staging:
            staged.cleanup()
    return result


def _result(
    members: list[str],
    joiner: str,
    n_keys: int,
    client_counts: list[Any],
    instance_counts: list[Any],
    movement: pa.Table,
    out_dir: Path,
    started: float,
    vnodes: int,
    manifests: Sequence[Any],
) -> BalanceResult:
    """The per-node tables from the Spark counts, and every output file."""
    per_client = {r["owner"]: r for r in client_counts}
    per_inst = {r["owner"]: r["count"] for r in instance_counts}
    nodes = pa.Table.from_pylist([
        {
            "node": m,
            "clients": int(per_client[m]["clients"]) if m in per_client else 0,
            "connection_clients": int(per_client[m]["connection"]) if m in per_client else 0,
            "ip_port_clients": int(per_client[m]["ip_port"]) if m in per_client else 0,
            "instances": int(per_inst.get(m, 0)),
        }
        for m in members
    ])
    unowned = {
        "clients": int(per_client[None]["clients"]) if None in per_client else 0,
        "instances": int(per_inst.get(None, 0)),
    }
    skew = pa.Table.from_pylist([_skew(name, nodes[name].to_numpy()) for name in
                                 ("clients", "connection_clients", "ip_port_clients", "instances")])
    result = BalanceResult(
        members=members, joiner=joiner, ip_port_clients=n_keys, nodes=nodes, skew=skew, movement=movement,
        out_dir=out_dir, elapsed_s=time.monotonic() - started,
    )
    result.outputs["nodes"] = report.write_table(nodes, out_dir / "nodes.parquet")
    result.outputs["skew"] = report.write_table(skew, out_dir / "skew.parquet")
    result.outputs["movement"] = report.write_table(movement, out_dir / "movement.parquet")
    result.outputs["chart"] = _chart(out_dir / "balance.png", result, manifests)
    result.elapsed_s = time.monotonic() - started
    result.outputs["summary"] = report.write_summary(out_dir, _summary(result, unowned, vnodes))
    return result


def _majority(df: DataFrame, keys: Sequence[str], col: str, alias: str) -> DataFrame:
    """Per ``keys``: the most common non-null ``col`` (ties: smallest); null when none."""
    from pyspark.sql import functions as F

    counted = df.where(F.col(col).isNotNull()).groupBy(*keys, col).count()
    best = counted.groupBy(*keys).agg(
        F.min(F.struct((-F.col("count")).alias("nc"), F.col(col).alias("v"))).alias("m")
    )
    return df.select(*keys).distinct().join(best, list(keys), "left").select(*keys, F.col("m.v").alias(alias))


def _owners(clients: DataFrame, instances: DataFrame) -> tuple[DataFrame, DataFrame]:
    from pyspark.sql import functions as F

    native = clients.groupBy("client_id").agg(
        F.min(F.when(F.col("native"), F.col("node"))).alias("native_node"),
        F.min("kind").alias("kind"),
    )
    majority = _majority(clients, ["client_id"], "owner_node", "majority_owner")
    per_client = native.join(majority, "client_id").select(
        "client_id", "kind", F.coalesce("native_node", "majority_owner").alias("owner")
    )
    per_instance = _majority(instances, list(IDENTITY), "owner_node", "owner")
    return per_client, per_instance


def _movement(keys: DataFrame, members: list[str], joiner: str, vnodes: int, total: int) -> pa.Table:
    from pyspark.sql import functions as F

    moved = keys.mapInArrow(_movement_fn(members, joiner, vnodes), _MOVE_DDL)
    summed = (
        moved.groupBy("scenario", "member", "scheme")
        .agg(F.sum("moved").alias("moved"), F.sum("must_move").alias("must_move"))
        .orderBy(F.col("scenario").desc(), "member", "scheme")
        .toArrow()
    )
    fraction = pa.array([m / total for m in summed["moved"].to_pylist()], pa.float64())
    return summed.append_column("keys", pa.array([total] * summed.num_rows, pa.int64())).append_column(
        "fraction", fraction
    )


def _empty_movement() -> pa.Table:
    return pa.table({
        "scenario": pa.array([], pa.string()), "member": pa.array([], pa.string()),
        "scheme": pa.array([], pa.string()), "moved": pa.array([], pa.int64()),
        "must_move": pa.array([], pa.int64()), "keys": pa.array([], pa.int64()),
        "fraction": pa.array([], pa.float64()),
    })


def _movement_fn(members: list[str], joiner: str, vnodes: int) -> Any:
    """The mapInArrow function: per batch of keys, moved counts per (scenario, member, scheme)."""

    def movement(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from shoal.analytics.ring import positions

        n = len(members)
        _, join_map = join_position_map(members, joiner)
        join_map = np.where(join_map < 0, n, join_map)
        ring = Ring(members, vnodes)
        ring_join = Ring([*members, joiner], vnodes)
        leaves = []
        for leaver in members:
            if n > 1:
                left, leave_map = leave_position_map(members, leaver)
                leaves.append((leaver, leave_map, Ring(left, vnodes)))
        rows: dict[tuple[str, str, str], list[int]] = {}

        def add(key: tuple[str, str, str], moved: int, must: int) -> None:
            acc = rows.setdefault(key, [0, 0])
            acc[0] += moved
            acc[1] += must

        for b in batches:
            if not b.num_rows:
                continue
            keys = b.column(0).to_pylist()
            h = distro_hashes(keys)
            pos = positions(keys)
            old = h % n
            r_old = ring.owners(pos)
            new = join_map[h % (n + 1)]
            r_new = ring_join.owners(pos)
            add(("join", joiner, "modulo"), int((old != new).sum()), int((new == n).sum()))
            add(("join", joiner, "ring"), int((r_old != r_new).sum()), int((r_new == n).sum()))
            for i, (leaver, leave_map, ring_leave) in enumerate(leaves):
                new = leave_map[h % (n - 1)]
                r_new = leave_map[ring_leave.owners(pos)]
                add(("leave", leaver, "modulo"), int((old != new).sum()), int((old == i).sum()))
                add(("leave", leaver, "ring"), int((r_old != r_new).sum()), int((r_old == i).sum()))
        yield pa.RecordBatch.from_pylist(
            [{"scenario": k[0], "member": k[1], "scheme": k[2], "moved": v[0], "must_move": v[1]}
             for k, v in rows.items()],
            schema=pa.schema([("scenario", pa.string()), ("member", pa.string()), ("scheme", pa.string()),
                              ("moved", pa.int64()), ("must_move", pa.int64())]),
        )

    return movement


def _skew(metric: str, values: Any) -> dict[str, Any]:
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean()) if x.size else 0.0
    return {
        "metric": metric,
        "nodes": int(x.size),
        "total": int(x.sum()),
        "min": int(x.min()) if x.size else 0,
        "max": int(x.max()) if x.size else 0,
        "mean": mean,
        "stddev": float(x.std()) if x.size else 0.0,
        "max_over_mean": float(x.max()) / mean if mean else 0.0,
    }


def _summary(res: BalanceResult, unowned: dict[str, int], vnodes: int) -> list[str]:
    lines = ["Shoal balance report", f"members ({len(res.members)}): {', '.join(res.members)}", ""]
    lines += report.table_lines(
        ["owner node", "clients", "connection", "ip_port", "instances"],
        [[r["node"], r["clients"], r["connection_clients"], r["ip_port_clients"], r["instances"]]
         for r in res.nodes.to_pylist()],
    )
    if unowned["clients"] or unowned["instances"]:
        lines.append(f"without a known owner: {unowned['clients']:,} clients, {unowned['instances']:,} instances")
    lines += ["", "skew (per owner node):"]
    for r in res.skew.to_pylist():
        lines.append(f"  {r['metric']}: total {r['total']:,}, min {r['min']:,}, mean {r['mean']:,.1f}, "
                     f"max {r['max']:,}, stddev {r['stddev']:,.1f}, max/mean {r['max_over_mean']:.3f}")
    lines += ["", f"membership change, {res.ip_port_clients:,} ip:port clients "
                  f"(Nacos modulo vs consistent-hash ring with {vnodes} vnodes per member):"]
    mv = res.movement.to_pylist()
    if not mv:
        lines.append("  no ip:port clients: nothing would move")
    by = {(r["scenario"], r["member"], r["scheme"]): r for r in mv}
    for scenario, member in sorted({(r["scenario"], r["member"]) for r in mv},
                                   key=lambda sm: (sm[0] != "join", sm[1])):
        mod, ring = by[(scenario, member, "modulo")], by[(scenario, member, "ring")]
        lines.append(f"  {scenario} {member}: modulo moves {mod['fraction']:.1%} ({mod['moved']:,}, "
                     f"{mod['must_move']:,} must), ring {ring['fraction']:.1%} ({ring['moved']:,}, "
                     f"{ring['must_move']:,} must)")
    leaves = [(by[k]["fraction"], by[(k[0], k[1], "ring")]["fraction"]) for k in by
              if k[0] == "leave" and k[2] == "modulo"]
    if leaves:
        lines.append(f"  mean over members leaving: modulo {np.mean([a for a, _ in leaves]):.1%}, "
                     f"ring {np.mean([b for _, b in leaves]):.1%}")
    lines += ["", f"elapsed: {res.elapsed_s:.1f} s"]
    return lines


def _chart(path: Path, res: BalanceResult, manifests: Sequence[Any]) -> Path:
    fig, (ax1, ax2) = report.new_figure(1, 2)
    rows = res.nodes.to_pylist()
    clients = [r["clients"] for r in rows]
    instances = [r["instances"] for r in rows]
    skew = {r["metric"]: r for r in res.skew.to_pylist()}
    report.snapshot_title(
        fig,
        f"Shoal balance: {len(rows)} owner nodes, {sum(clients):,} clients (max/mean "
        f"{skew['clients']['max_over_mean']:.2f}), {sum(instances):,} instances",
        [(m.node, m.taken_at_ms) for m in manifests],
    )
    if not any(clients) and not any(instances):
        report.empty_panel(ax1, "per owner node", "no clients and no instances in the snapshots")
    else:
        x = np.arange(len(rows))
        for offset, values, label in ((-0.2, clients, "clients"), (0.2, instances, "instances")):
            report.label_bars(ax1, ax1.bar(x + offset, values, 0.4, label=label))
        ax1.set_xticks(x, [r["node"] for r in rows], rotation=30, ha="right")
        report.integer_ticks(ax1)
        report.headroom(ax1, max(*clients, *instances), frac=0.2)
        ax1.set_ylabel("count")
        ax1.set_title("per owner node")
        ax1.legend(loc="upper right", ncols=2)
    mv = res.movement.to_pylist()
    join = [r for r in mv if r["scenario"] == "join"]
    leave = [r for r in mv if r["scenario"] == "leave"]
    labels, mod, ring = [], [], []
    for title, group in ((f"{res.joiner} joins", join), (f"one of {len(res.members)} leaves (mean)", leave)):
        if group:
            labels.append(title)
            mod.append(float(np.mean([r["fraction"] for r in group if r["scheme"] == "modulo"])))
            ring.append(float(np.mean([r["fraction"] for r in group if r["scheme"] == "ring"])))
    if not labels:
        report.empty_panel(ax2, "membership change", "no ip:port clients: nothing would move")
        return report.save_figure(fig, path)
    xm = np.arange(len(labels))
    for offset, fracs, label, color in ((-0.2, mod, "Nacos modulo", "tab:red"),
                                        (0.2, ring, "consistent-hash ring", "tab:green")):
        bars = ax2.bar(xm + offset, fracs, 0.4, label=label, color=color)
        report.label_bars(ax2, bars, [f"{f:.1%}" for f in fracs], skip_zero=False)
    ax2.set_xticks(xm, labels)
    ax2.set_ylim(0, 1.2)
    ax2.set_yticks(np.linspace(0, 1, 6), [f"{t:.0%}" for t in np.linspace(0, 1, 6)])
    ax2.set_ylabel(f"of {res.ip_port_clients:,} ip:port clients moving")
    ax2.set_title("membership change")
    ax2.legend(loc="upper right", ncols=2)
    return report.save_figure(fig, path)
