"""Simulate a Distro cluster at scale: ownership, verify traffic, sync fan-out, membership moves.

Why: the questions that decide Shoal's cluster design (how much does Nacos's per-client verify cost
at 1,000 nodes and 10 M clients, what does a digest verify save, how much moves when a member joins)
cannot be answered on a laptop by running 1,000 nodes. They can be answered by modelling the
cluster as data: the clients are rows, generated inside Spark partitions (``spark.range`` +
``mapInArrow``; no driver-side list of clients), ownership comes from the real ownership kernel
(:mod:`shoal.kernels.ownership`, Nacos ``DistroMapper``) and everything else is counted per node.

The model (every number is per verify round; Nacos verifies every 5 s by default):

* **Members**: ``N`` addresses ``192.168.<i // 250>.<i % 250 + 1>:8848``, sorted as Nacos sorts
  them. The joiner is the next address in that series; the leaver is a member picked with the seed.
* **Clients**: ``M`` ip:port clients; client ``i`` has ``v = (i * 2654435761 + seed * 40503) mod
  2**32`` and key ``10.<v>>16 & 255>.<v>>8 & 255>.<v & 255>:<8000 + (v >> 24)>`` (client id: key +
  ``"#true"``), distinct for distinct ``i``. Owner: ``sorted_members[distroHash(key) % N]``.
* **Churn**: in round ``r`` client ``i`` changes iff ``draw(i, r, 0) < churn``; a change is *lost*
  (its sync misses a peer, which then diverges until verify repairs it) iff also
  ``draw(i, r, 1) < loss``. ``draw(i, r, s) = splitmix64((i + splitmix64(seed << 32 | r << 8 | s))
  mod 2**64) >> 11`` compared with ``floor(p * 2**53)``: counter-based, so results do not depend on
  the partitioning.
* **Nacos verify**: each node sends, to each of the ``N - 1`` peers, one ``DistroDataRequest`` per
  client it owns: ``VERIFY_FIXED + len(client_id) + b64(VERIFY_BODY + len(client_id))`` bytes.
* **Digest verify** (Shoal, the protocol the nodes speak: docs/protocol.md §6.5, sizes from
  :mod:`shoal.kernels.verify_layout`, the module the nodes encode with): each node sends each peer
  one digest request, 8 bytes per bucket, ``buckets = bucket_count(owned)`` (a power of two near
  ``owned / 256``, at most 4096), and gets a bitmap back. A lost change makes one bucket differ at
  one peer; the owner then sends the salted 32-bit values of that bucket's clients (about
  ``owned / buckets``) and the peer answers the one position it lacks. When those values would
  pass 64 KiB the owner first sends ``k = sub_buckets_for(1, buckets, owned)`` sub-digests and
  the values of one sub-bucket only. Every message, request or answer, also carries
  ``ENVELOPE`` bytes (gRPC frame and Payload metadata). Copies removed because their owner no
  longer has them are not modelled (the churn below changes clients, it never removes one).
* **Sync fan-out**: every change is sent by its owner to the ``N - 1`` peers,
  ``SYNC_FIXED + len(client_id) + b64(SYNC_BODY + len(client_id) + len(ip))`` bytes each; a lost
  change is re-sent once to the diverged peer (both protocols).
* **Movement**: the fraction of clients whose owner changes on N -> N+1 (join) and N -> N-1 (leave),
  for Nacos modulo hashing and for a consistent-hash ring (:mod:`shoal.analytics.ring`), next to
  the clients that must move under that scheme (those the joiner gets / the leaver had).

Outputs, in the job's own directory (the CLI's default: ``report/simulate/``): ``ownership.parquet``
(per node), ``rounds.parquet`` (per round totals), ``node_rounds.parquet`` (per round and node),
``movement.parquet``, ``run.parquet`` (parameters, ``started_at``, elapsed time, rows/s),
``simulate.png`` and ``summary.txt``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shoal.analytics import report
from shoal.analytics.progress import spark_progress
from shoal.analytics.ring import DEFAULT_VNODES, Ring, distro_hashes, join_position_map, leave_position_map
from shoal.kernels.verify_layout import (
    bucket_count,
    detail_answer_size,
    detail_request_size,
    digest_answer_size,
    digest_request_size,
    sub_buckets_for,
    sub_request_size,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The job's steps, as its progress line counts them.
STEPS: Final[tuple[str, ...]] = ("simulating clients", "writing report")

__all__ = ["SimParams", "SimResult", "client_keys", "draws", "member_addresses", "run"]

log = logging.getLogger(__name__)

# -- model constants (bytes) ---------------------------------------------------------------------
#: gRPC frame + Payload metadata + DistroDataRequest envelope (type, resource type, operation, ids).
VERIFY_FIXED: Final[int] = 200
#: ``{"clientId":"","revision":NN}`` around the client id, before base64.
VERIFY_BODY: Final[int] = 28
#: As VERIFY_FIXED, for a CHANGE request.
SYNC_FIXED: Final[int] = 200
#: Serialized ClientSyncData without client id and ip: namespace, group, service, cluster, port,
#: weight, flags, empty metadata, revision.
SYNC_BODY: Final[int] = 160
#: gRPC frame and Payload metadata (type, shoal-member header) around each Shoal cluster message.
ENVELOPE: Final[int] = 64
#: A representative per-round salt in the sub-digest and detail headers (they carry a 64-bit one).
_SALT: Final[int] = 2**63
#: Nacos ``nacos.core.protocol.distro.data.verify_interval_ms`` default.
VERIFY_INTERVAL_S: Final[float] = 5.0

_MASK64: Final[int] = (1 << 64) - 1
_BATCH_ROWS: Final[int] = 131_072

_STATIC_METRICS: Final[tuple[str, ...]] = (
    "owned", "owned_ring", "verify_bytes",
    "moved_join_modulo", "moved_leave_modulo", "moved_join_ring", "moved_leave_ring",
    "to_joiner_modulo", "to_joiner_ring",
)
_ROUND_METRICS: Final[tuple[str, ...]] = ("churned", "diverged", "sync_bytes", "resync_bytes")
_METRICS: Final[tuple[str, ...]] = _STATIC_METRICS + _ROUND_METRICS
_PART_SCHEMA: Final[pa.Schema] = pa.schema(
    [pa.field("round", pa.int32(), False), pa.field("node", pa.int32(), False)]
    + [pa.field(m, pa.int64(), False) for m in _METRICS]
)

_PART_DDL: Final[str] = ", ".join(["`round` INT", "node INT", *(f"{m} BIGINT" for m in _METRICS)])


@dataclass(frozen=True, slots=True)
class SimParams:
    nodes: int
    clients: int
    churn: float = 0.01
    rounds: int = 5
    loss: float = 0.001
    seed: int = 42
    vnodes: int = DEFAULT_VNODES
    partitions: int | None = None

    def validate(self) -> None:
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2, got {self.nodes}")
        if self.nodes > 64_000:
            raise ValueError(f"--nodes must be <= 64000, got {self.nodes}")
        if not 1 <= self.clients < 2**32:
            raise ValueError(f"--clients must be in [1, 2**32), got {self.clients}")
        for name in ("churn", "loss"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"--{name} must be in [0, 1], got {p}")
        if self.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {self.rounds}")
        if self.vnodes < 1:
            raise ValueError(f"--vnodes must be >= 1, got {self.vnodes}")
        if self.partitions is not None and self.partitions < 1:
            raise ValueError(f"--partitions must be >= 1, got {self.partitions}")
        if not 0 <= self.seed < 2**31:
            raise ValueError(f"--seed must be in [0, 2**31), got {self.seed}")


@dataclass(slots=True)
class SimResult:
    params: SimParams
    members: list[str]
    joiner: str
    leaver: str
    job_s: float
    elapsed_s: float
    partitions: int
    ownership: pa.Table
    rounds: pa.Table
    node_rounds: pa.Table
    movement: pa.Table
    outputs: dict[str, Path] = field(default_factory=dict)
    #: When the run started (epoch milliseconds).
    started_at_ms: int = 0

    @property
    def rows_per_s(self) -> float:
        return self.params.clients / self.job_s if self.job_s > 0 else float("inf")


# -- the model's pieces (pure functions; the tests recompute them independently) -------------------


def member_addresses(n: int) -> list[str]:
    """The ``n`` member addresses, sorted as Nacos sorts its member list."""
    return sorted(_member(i) for i in range(n))


def _member(i: int) -> str:
    return f"192.168.{i // 250}.{i % 250 + 1}:8848"


def joiner_and_leaver(n: int, seed: int) -> tuple[str, str]:
    members = member_addresses(n)
    return _member(n), members[random.Random(seed).randrange(n)]


def client_keys(ids: npt.NDArray[np.int64], seed: int) -> pa.Array:
    """The ``ip:port`` keys of clients ``ids`` (a pyarrow string array)."""
    v = (ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(seed * 40503)) & np.uint64(0xFFFFFFFF)

    def s(x: npt.NDArray[np.uint64]) -> pa.Array:
        return pc.cast(pa.array(x), pa.string())

    ip = pc.binary_join_element_wise(
        "10", s((v >> np.uint64(16)) & np.uint64(255)), s((v >> np.uint64(8)) & np.uint64(255)),
        s(v & np.uint64(255)), ".",
    )
    return pc.binary_join_element_wise(ip, s(np.uint64(8000) + (v >> np.uint64(24))), ":")


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _splitmix64_int(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def threshold(p: float) -> int:
    """``draw < threshold(p)`` happens with probability ``p``."""
    return math.floor(p * 2**53)


def draws(ids: npt.NDArray[np.int64], seed: int, rnd: int, stream: int) -> npt.NDArray[np.uint64]:
    """53-bit counter-based uniform draws for clients ``ids`` in round ``rnd``."""
    base = np.uint64(_splitmix64_int(((seed << 32) | (rnd << 8) | stream) & _MASK64))
    return _splitmix64(ids.astype(np.uint64) + base) >> np.uint64(11)


def _b64(n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return 4 * ((n + 2) // 3)


def verify_bytes(cid_len: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return VERIFY_FIXED + cid_len + _b64(VERIFY_BODY + cid_len)


def sync_bytes(cid_len: npt.NDArray[np.int64], ip_len: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return SYNC_FIXED + cid_len + _b64(SYNC_BODY + cid_len + ip_len)


def buckets(owned: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The bucket count each node's verify uses for its ``owned`` clients."""
    return np.array([bucket_count(int(o)) for o in owned], dtype=np.int64)


def digest_round_bytes(owned: int) -> int:
    """One owner's digest request to one peer and its answer, when they agree (both envelopes)."""
    n = bucket_count(owned)
    return 2 * ENVELOPE + digest_request_size(n, owned) + digest_answer_size(n)


def repair_cost(owned: int) -> tuple[int, int]:
    """(requests, bytes) beyond the digest exchange that one lost change of an owner with ``owned``
    clients costs at the peer that missed it: sub-digests when the bucket is large, then the
    values of its (sub-)bucket and the answer naming the one the peer lacks."""
    n = bucket_count(owned)
    k = sub_buckets_for(1, n, owned)
    in_sub = -(-owned // (n * k))
    cost = (2 * ENVELOPE + detail_request_size(n, k, 1, in_sub, _SALT) + detail_answer_size(1, []))
    if k == 1:
        return 1, cost
    return 2, cost + 2 * ENVELOPE + sub_request_size(n, k, [n - 1], _SALT) + (k + 7) // 8


# -- the Spark side ---------------------------------------------------------------------------------


class _Model:
    """Per-task state: member maps and rings (built once per task, reused for every batch)."""

    def __init__(self, p: SimParams) -> None:
        self.p = p
        self.members = member_addresses(p.nodes)
        self.joiner, self.leaver = joiner_and_leaver(p.nodes, p.seed)
        _, self.join_map = join_position_map(self.members, self.joiner)
        leave_members, self.leave_map = leave_position_map(self.members, self.leaver)
        self.join_map = np.where(self.join_map < 0, p.nodes, self.join_map)  # joiner: id N
        self.ring = Ring(self.members, p.vnodes)
        self.ring_join = Ring([*self.members, self.joiner], p.vnodes)  # ids 0..N-1, joiner N
        self.ring_leave = Ring(leave_members, p.vnodes)
        self.t_churn = np.uint64(threshold(p.churn))
        self.t_loss = np.uint64(threshold(p.loss))
        self.acc = np.zeros((p.rounds + 1, len(_METRICS), p.nodes), dtype=np.int64)

    def add(self, ids: npt.NDArray[np.int64]) -> None:
        from shoal.analytics.ring import positions

        p, n, acc = self.p, self.p.nodes, self.acc
        keys_arrow = client_keys(ids, p.seed)
        keys = keys_arrow.to_pylist()
        key_len = pc.utf8_length(keys_arrow).to_numpy().astype(np.int64)
        cid_len = key_len + 5  # "#true"
        ip_len = key_len - 5  # ":" + 4-digit port
        h = distro_hashes(keys)
        old = h % n
        kpos = positions(keys)
        r_old = self.ring.owners(kpos)
        r_join = self.ring_join.owners(kpos)
        r_leave = self.leave_map[self.ring_leave.owners(kpos)]
        new_join = self.join_map[h % (n + 1)]
        moved_join = old != new_join
        moved_leave = old != self.leave_map[h % (n - 1)]

        def count(idx: npt.NDArray[np.int64], weights: Any = None) -> npt.NDArray[np.int64]:
            out = np.bincount(idx, weights=weights, minlength=n)
            return out.astype(np.int64) if weights is None else np.rint(out).astype(np.int64)

        m = {name: i for i, name in enumerate(_METRICS)}
        static = acc[0]
        static[m["owned"]] += count(old)
        static[m["owned_ring"]] += count(r_old)
        static[m["verify_bytes"]] += count(old, verify_bytes(cid_len))
        static[m["moved_join_modulo"]] += count(old[moved_join])
        static[m["moved_leave_modulo"]] += count(old[moved_leave])
        static[m["moved_join_ring"]] += count(r_old[r_old != r_join])
        static[m["moved_leave_ring"]] += count(r_old[r_old != r_leave])
        static[m["to_joiner_modulo"]] += count(old[new_join == n])
        static[m["to_joiner_ring"]] += count(r_old[r_join == n])
        sb = sync_bytes(cid_len, ip_len)
        for r in range(p.rounds):
            row = acc[r + 1]
            churned = np.flatnonzero(draws(ids, p.seed, r, 0) < self.t_churn)
            lost = churned[draws(ids[churned], p.seed, r, 1) < self.t_loss]
            row[m["churned"]] += count(old[churned])
            row[m["diverged"]] += count(old[lost])
            row[m["sync_bytes"]] += count(old[churned], sb[churned])
            row[m["resync_bytes"]] += count(old[lost], sb[lost])

    def batch(self) -> pa.RecordBatch:
        k, n = self.p.rounds + 1, self.p.nodes
        rounds = np.repeat(np.arange(-1, k - 1, dtype=np.int32), n)
        nodes = np.tile(np.arange(n, dtype=np.int32), k)
        cols = [pa.array(rounds), pa.array(nodes)]
        cols += [pa.array(self.acc[:, i, :].reshape(-1)) for i in range(len(_METRICS))]
        return pa.RecordBatch.from_arrays(cols, schema=_PART_SCHEMA)


def _partition_fn(p: SimParams) -> Any:
    def simulate_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        model = _Model(p)
        for b in batches:
            if b.num_rows:
                model.add(b.column(0).to_numpy().astype(np.int64))
        yield model.batch()

    return simulate_partition


def aggregate(spark: SparkSession, p: SimParams, partitions: int) -> pa.Table:
    """Run the partitions and sum their per-(round, node) counters (a small table)."""
    from pyspark.sql import functions as F

    conf_key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = spark.conf.get(conf_key, None)
    spark.conf.set(conf_key, str(_BATCH_ROWS))
    try:
        ids = spark.range(0, p.clients, 1, numPartitions=partitions)
        parts = ids.mapInArrow(_partition_fn(p), _PART_DDL)
        summed = parts.groupBy("round", "node").agg(*[F.sum(m).alias(m) for m in _METRICS])
        return summed.orderBy("round", "node").toArrow()
    finally:
        if previous is None:
            spark.conf.unset(conf_key)
        else:
            spark.conf.set(conf_key, previous)


def run(
    spark: SparkSession,
    params: SimParams,
    out: str | os.PathLike[str],
    *,
    show_progress: bool = True,
) -> SimResult:
    params.validate()
    started = time.monotonic()
    started_at_ms = time.time_ns() // 1_000_000
    out_dir = report.job_dir(out, "simulate")
    partitions = params.partitions or spark.sparkContext.defaultParallelism
    members = member_addresses(params.nodes)
    joiner, leaver = joiner_and_leaver(params.nodes, params.seed)
    label = f"simulate {params.nodes} nodes x {params.clients:,} clients"
    with spark_progress(spark, label, STEPS, enabled=show_progress) as progress:
        with progress.step(STEPS[0]):
            job_start = time.monotonic()
            agg = aggregate(spark, params, partitions)
            job_s = time.monotonic() - job_start

        with progress.step(STEPS[1], spark_jobs=False):
            n, k = params.nodes, params.rounds
            data = {name: np.asarray(agg.column(name).to_numpy(), dtype=np.int64) for name in _METRICS}
            rnd = agg.column("round").to_numpy()
            node = agg.column("node").to_numpy()

            def grid(name: str) -> npt.NDArray[np.int64]:
                g = np.zeros((k + 1, n), dtype=np.int64)
                g[rnd + 1, node] = data[name]
                return g

            static = {name: grid(name)[0] for name in _STATIC_METRICS}
            per_round = {name: grid(name)[1:] for name in _ROUND_METRICS}
            tables = _tables(params, members, joiner, leaver, static, per_round)
            result = SimResult(
                params=params, members=members, joiner=joiner, leaver=leaver, job_s=job_s,
                elapsed_s=0.0, partitions=partitions, started_at_ms=started_at_ms, **tables,
            )
            master = str(spark.sparkContext.master)
            for name, table in tables.items():
                result.outputs[name] = report.write_table(table, out_dir / f"{name}.parquet")
            result.outputs["chart"] = _chart(out_dir / "simulate.png", result, master)
            result.elapsed_s = time.monotonic() - started
            run_row = {**asdict(params), "partitions": partitions, "master": master,
                       "started_at_ms": started_at_ms, "job_s": job_s, "elapsed_s": result.elapsed_s,
                       "rows_per_s": result.rows_per_s}
            run_table = report.ms_to_timestamps(pa.Table.from_pylist([run_row]), {"started_at_ms": "started_at"})
            result.outputs["run"] = report.write_table(run_table, out_dir / "run.parquet")
            result.outputs["summary"] = report.write_summary(out_dir, _summary(result, master))
    return result


def _tables(
    p: SimParams,
    members: list[str],
    joiner: str,
    leaver: str,
    static: dict[str, npt.NDArray[np.int64]],
    per_round: dict[str, npt.NDArray[np.int64]],
) -> dict[str, pa.Table]:
    n, m, peers = p.nodes, p.clients, p.nodes - 1
    owned = static["owned"]
    nb = buckets(owned)
    digest_per_peer = np.array([digest_round_bytes(int(o)) for o in owned], dtype=np.int64)
    repairs = [repair_cost(int(o)) for o in owned]
    repair_requests = np.array([r for r, _ in repairs], dtype=np.int64)
    repair_bytes = np.array([b for _, b in repairs], dtype=np.int64)
    ownership = pa.table({
        "node_index": np.arange(n, dtype=np.int32),
        "node": members,
        "owned": owned,
        "share": owned / m,
        "owned_ring": static["owned_ring"],
        "nacos_verify_bytes_per_peer": static["verify_bytes"],
        "digest_buckets": nb,
        "digest_verify_bytes_per_peer": digest_per_peer,
        "moved_out_join_modulo": static["moved_join_modulo"],
        "moved_out_leave_modulo": static["moved_leave_modulo"],
        "moved_out_join_ring": static["moved_join_ring"],
        "moved_out_leave_ring": static["moved_leave_ring"],
    })
    churned, diverged = per_round["churned"], per_round["diverged"]
    sync_out = per_round["sync_bytes"] * peers
    nacos_verify_bytes = int(static["verify_bytes"].sum()) * peers
    digest_base = int(digest_per_peer.sum()) * peers
    rows = []
    for r in range(p.rounds):
        c, d = int(churned[r].sum()), int(diverged[r].sum())
        resync = int(per_round["resync_bytes"][r].sum())
        sync_b = int(sync_out[r].sum())
        digest_b = digest_base + int((diverged[r] * repair_bytes).sum())
        rows.append({
            "round": r,
            "churned": c,
            "diverged": d,
            "nacos_verify_messages": m * peers,
            "nacos_verify_bytes": nacos_verify_bytes,
            "digest_verify_messages": n * peers + int((diverged[r] * repair_requests).sum()),
            "digest_verify_bytes": digest_b,
            "sync_messages": c * peers,
            "sync_bytes": sync_b,
            "resync_messages": d,
            "resync_bytes": resync,
            "max_node_sync_out_bytes": int(sync_out[r].max()),
            "nacos_total_bytes": nacos_verify_bytes + sync_b + resync,
            "shoal_total_bytes": digest_b + sync_b + resync,
        })
    node_rounds = pa.table({
        "round": np.repeat(np.arange(p.rounds, dtype=np.int32), n),
        "node_index": np.tile(np.arange(n, dtype=np.int32), p.rounds),
        "churned": churned.reshape(-1),
        "diverged": diverged.reshape(-1),
        "sync_out_bytes": sync_out.reshape(-1),
        "resync_bytes": per_round["resync_bytes"].reshape(-1),
    })
    leaver_pos = members.index(leaver)
    movement = pa.Table.from_pylist([
        {"scenario": "join", "member": joiner, "scheme": "modulo",
         "moved": int(static["moved_join_modulo"].sum()), "must_move": int(static["to_joiner_modulo"].sum())},
        {"scenario": "join", "member": joiner, "scheme": "ring",
         "moved": int(static["moved_join_ring"].sum()), "must_move": int(static["to_joiner_ring"].sum())},
        {"scenario": "leave", "member": leaver, "scheme": "modulo",
         "moved": int(static["moved_leave_modulo"].sum()), "must_move": int(owned[leaver_pos])},
        {"scenario": "leave", "member": leaver, "scheme": "ring",
         "moved": int(static["moved_leave_ring"].sum()), "must_move": int(static["owned_ring"][leaver_pos])},
    ])
    movement = movement.append_column("fraction", pc.divide(pc.cast(movement["moved"], pa.float64()), m))
    return {
        "ownership": ownership,
        "rounds": pa.Table.from_pylist(rows),
        "node_rounds": node_rounds,
        "movement": movement,
    }


def _spread(x: npt.NDArray[np.int64]) -> str:
    mean = float(x.mean())
    return (f"min {int(x.min()):,} / mean {mean:,.1f} / max {int(x.max()):,}, stddev {float(x.std()):,.1f}, "
            f"max/mean {float(x.max()) / mean if mean else 0:.3f}")


def _summary(res: SimResult, master: str) -> list[str]:
    p = res.params
    own = res.ownership
    rounds = res.rounds.to_pylist()
    mv = {(r["scenario"], r["scheme"]): r for r in res.movement.to_pylist()}
    nacos_v = rounds[0]["nacos_verify_bytes"]
    digest_v = sum(r["digest_verify_bytes"] for r in rounds) / len(rounds)
    mean = {key: sum(r[key] for r in rounds) / len(rounds) for key in rounds[0] if key != "round"}
    lines = [
        "Shoal Distro simulation",
        f"nodes {p.nodes:,}; clients {p.clients:,}; churn {p.churn:.2%}/round; loss {p.loss:.2%} of changes; "
        f"rounds {p.rounds}; seed {p.seed}; ring vnodes {p.vnodes}",
        f"spark: master {master}, {res.partitions} partition(s); job {res.job_s:.1f} s, "
        f"total {res.elapsed_s:.1f} s; {res.rows_per_s:,.0f} clients/s",
        "",
        "ownership, clients per node:",
        f"  Nacos modulo:  {_spread(own['owned'].to_numpy())}",
        f"  ring ({p.vnodes} vnodes): {_spread(own['owned_ring'].to_numpy())}",
        "",
        f"verify traffic per round (Nacos verifies every {VERIFY_INTERVAL_S:.0f} s):",
        f"  Nacos per-client verify: {rounds[0]['nacos_verify_messages']:,} messages, "
        f"{report.fmt_bytes(nacos_v)} ({report.fmt_bytes(nacos_v / VERIFY_INTERVAL_S)}/s)",
        f"  digest verify:           {mean['digest_verify_messages']:,.0f} messages, "
        f"{report.fmt_bytes(digest_v)} ({report.fmt_bytes(digest_v / VERIFY_INTERVAL_S)}/s)"
        f"  -> {nacos_v / digest_v if digest_v else float('inf'):,.0f}x fewer bytes",
        "",
        f"sync fan-out per round at churn {p.churn:.2%} (mean over {p.rounds} rounds):",
        f"  changed clients {mean['churned']:,.0f}; sync messages {mean['sync_messages']:,.0f}, "
        f"{report.fmt_bytes(mean['sync_bytes'])}; busiest node sends "
        f"{report.fmt_bytes(mean['max_node_sync_out_bytes'])}",
        f"  lost changes re-synced: {mean['resync_messages']:,.0f} messages, "
        f"{report.fmt_bytes(mean['resync_bytes'])}",
        f"  total per round: Nacos {report.fmt_bytes(mean['nacos_total_bytes'])}, "
        f"Shoal {report.fmt_bytes(mean['shoal_total_bytes'])}",
        "",
        "clients that change owner on a membership change:",
    ]
    for scenario, member in (("join", res.joiner), ("leave", res.leaver)):
        mod, ring = mv[(scenario, "modulo")], mv[(scenario, "ring")]
        lines.append(
            f"  {scenario} {member}: Nacos modulo {mod['fraction']:.2%} ({mod['moved']:,}); "
            f"ring {ring['fraction']:.2%} ({ring['moved']:,}); must move (to the joiner / off the "
            f"leaver) {mod['must_move'] / p.clients:.2%} modulo, {ring['must_move'] / p.clients:.2%} ring"
        )
    return lines


def _chart(path: Path, res: SimResult, master: str) -> Path:
    fig, axes = report.new_figure(1, 3, width=15.0)
    ax1, ax2, ax3 = axes
    p = res.params
    fig.suptitle(
        f"Shoal Distro simulation: {p.nodes:,} nodes, {p.clients:,} clients, churn {p.churn:.2%}/round, "
        f"loss {p.loss:.2%}, {p.rounds} rounds, seed {p.seed}\n"
        f"run {report.fmt_ms(res.started_at_ms)} on {master}, {res.partitions} partitions",
        fontsize="large",
    )
    rounds = res.rounds.to_pylist()
    mean = {key: sum(r[key] for r in rounds) / len(rounds) for key in rounds[0]}
    parts = ("verify", "sync", "re-sync")
    nacos = [mean["nacos_verify_bytes"], mean["sync_bytes"], mean["resync_bytes"]]
    shoal = [mean["digest_verify_bytes"], mean["sync_bytes"], mean["resync_bytes"]]
    x = np.arange(len(parts))
    for offset, values, label in ((-0.2, nacos, "Nacos (per-client verify)"), (0.2, shoal, "Shoal (digest verify)")):
        bars = ax1.bar(x + offset, values, 0.4, label=label)
        report.label_bars(ax1, bars, [report.fmt_bytes(v) for v in values])
    ax1.set_xticks(x, parts)
    ax1.set_yscale("log")
    positive = [v for v in (*nacos, *shoal) if v > 0]
    if positive:  # log axis: headroom is a factor, and zero bars (no re-sync) are simply absent
        ax1.set_ylim(min(positive) / 3, max(positive) * 30)
    ax1.set_ylabel("bytes per round (log scale)")
    ax1.set_title(f"cluster traffic per round, mean of {p.rounds}")
    ax1.legend(loc="upper right", fontsize="small")
    own = res.ownership
    counts, _, _ = ax2.hist([own["owned"].to_numpy(), own["owned_ring"].to_numpy()], bins=40,
                            label=["Nacos modulo", f"ring ({p.vnodes} vnodes)"])
    report.integer_ticks(ax2)
    report.headroom(ax2, float(np.max(counts)), frac=0.2)
    ax2.set_xlabel("clients owned by a node")
    ax2.set_ylabel("nodes")
    ax2.set_title("ownership balance")
    ax2.legend(loc="upper right", fontsize="small")
    mv = res.movement.to_pylist()
    labels = [f"{r['scenario']}\n{r['scheme']}" for r in mv]
    xm = np.arange(len(mv))
    bars = ax3.bar(xm, [r["fraction"] for r in mv], color=["tab:red", "tab:green"] * 2)
    report.label_bars(ax3, bars, [f"{r['fraction']:.2%}" for r in mv], skip_zero=False)
    ax3.scatter(xm, [r["must_move"] / p.clients for r in mv], color="black", marker="_", s=400, label="must move")
    ax3.set_xticks(xm, labels)
    ax3.set_ylim(0, 1.2)
    ax3.set_yticks(np.linspace(0, 1, 6), [f"{t:.0%}" for t in np.linspace(0, 1, 6)])
    ax3.set_ylabel("clients changing owner")
    ax3.set_title("membership change")
    ax3.legend(loc="upper right", fontsize="small")
    return report.save_figure(fig, path)
