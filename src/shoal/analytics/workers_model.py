"""Model multi-worker nodes (``shoal server --workers N``): throughput, replication share, memory.

Why: a node run with N workers is N Distro members (:mod:`shoal.workers.placement`), each holding
a full replica of the registry. Queries stay on the worker that gets them, so they scale with the
workers; every write is synced to every other member, the node's own workers included, so its
cost grows with the members. Whether a node with more cores serves more registrations, and what
the replicas cost in memory, follows from a handful of measured per-operation costs; this module
turns them into a table for any cores × nodes × write mix, without starting a cluster.

The model (every cost is server CPU in microseconds on one core; :class:`Inputs`, measured on a
real node, ``docs/workers-model.md`` names the runs):

* **Members**: ``K`` nodes of ``W`` workers each are ``M = K·W`` Distro members. A worker runs on
  one core (one asyncio loop): a node with ``C`` cores keeps ``min(W, C)`` cores busy.
* **Query**: ``q`` µs on the worker that gets it (local, nothing replicated).
* **Write** (a registration or deregistration): ``r`` µs on the worker that gets it (the
  standalone handling, its local apply included), then one sync record to each of the ``M − 1``
  other members: ``s`` µs to send (encode + transport) on the writer and ``a`` µs to receive and
  apply on each receiver. ``write_cpu = r + (M − 1)(s + a)``. A record per write per peer: the
  merge of several changes of one client within ``sync.delayMs`` into one record is not counted,
  so this is the cost of distinct clients changing.
* **Load**: every node gets the same load, a fraction ``f`` of it writes. The cluster's work is
  spread evenly over its busy cores (each worker sends and applies its share), so a node serves
  ``X = min(W, C) · e · 10⁶ / ((1 − f)·q + f·write_cpu)`` operations per second, ``e`` the
  parallel efficiency of the node's cores (1 = each added core is a whole core).
* **Replication share**: ``f·(M − 1)(s + a) / ((1 − f)·q + f·write_cpu)`` of the cluster's CPU.
* **Write ceiling**: as ``W`` grows, a node's writes per second tend to ``10⁶ / (K·(s + a))``
  whatever its cores: every worker applies every write of the cluster.
* **Knee**: for one (K, C, f), the first worker count at which one more worker adds less than
  half of what the first one serves (``X(W+1) − X(W) < X(1)/2``); none when every worker up to
  the cores pays. ``best`` is the worker count with the highest ``X``.
* **Replica schemes**: ``worker`` (the design: each worker a member with its own replica);
  ``node`` (the alternative: one replica per node, ``M = K`` for the sync cost, its writes spread
  over the node's cores, e.g. the registry sharded by service among the workers; the forwarding of
  requests to the worker holding their shard, or the shared store's own cost, is not in the
  model, so this is the upper bound of any one-replica-per-node design); ``node-single-writer``
  (as ``node``, but one process applies every write to the node's replica, which the other
  workers read: a node then applies at most ``10⁶ / a`` writes per second, the cluster's
  ``K·X·f``, so ``X ≤ 10⁶ / (f·K·a)``).
* **Memory**: a worker's RSS is ``idle + I·b`` for ``I`` instances in the cluster (every replica
  holds all of them), ``b`` bytes per instance measured on one node; a node holds ``W`` of them
  (scheme ``node``: ``W·idle + I·b``). Past the measured instance count it is an extrapolation.

The sweep (every scheme × nodes ∈ {1, K} × cores × workers 1..cores × write fraction, the
fractions of :data:`FRACTIONS`) runs as a Spark job (``spark.range`` + ``mapInArrow``, local by
default, ``--master URL`` for a cluster);
the formulas are the plain functions below. Outputs, in the job's directory (the CLI's default:
``report/simulate-workers/``): ``sweep.parquet`` (every configuration), ``table.parquet`` (the
requested workers per core count: query, register, mixed, replication share, memory),
``knees.parquet``, ``inputs.json`` (the inputs used, with their sources), ``run.parquet``,
``simulate-workers.png`` and ``summary.txt``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from shoal.analytics import report
from shoal.analytics.progress import spark_progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_INPUTS", "Inputs", "WorkersParams", "knee", "members", "node_ops_per_s", "node_rss_bytes",
    "op_cpu_us", "replication_share", "run", "worker_rss_bytes", "write_ceiling_per_node", "write_cpu_us",
]

JOB: Final[str] = "simulate-workers"
STEPS: Final[tuple[str, ...]] = ("sweeping configurations", "writing report")
#: The measured inputs shipped with Shoal (docs/workers-model.md says how they were measured).
DEFAULT_INPUTS: Final[Path] = Path(__file__).with_name("workers_inputs.json")
SCHEMES: Final[tuple[str, ...]] = ("worker", "node", "node-single-writer")
#: Write fractions every sweep covers (0 = query-only, 1 = register-only), besides --write-fraction:
#: 0.01 and 0.02 (a registry's usual mix is mostly reads), then steps of 0.05.
FRACTIONS: Final[tuple[float, ...]] = tuple(sorted({0.01, 0.02, *(i / 20 for i in range(21))}))
_COST_FIELDS: Final[tuple[str, ...]] = (
    "query_us", "register_us", "sync_send_us", "sync_apply_us", "idle_rss_bytes", "bytes_per_instance",
)
_SWEEP_SCHEMA: Final[pa.Schema] = pa.schema([
    pa.field("scheme", pa.string(), False),
    pa.field("nodes", pa.int32(), False),
    pa.field("cores", pa.int32(), False),
    pa.field("workers", pa.int32(), False),
    pa.field("write_fraction", pa.float64(), False),
    pa.field("members", pa.int32(), False),
    pa.field("op_cpu_us", pa.float64(), False),
    pa.field("node_ops_per_s", pa.float64(), False),
    pa.field("node_queries_per_s", pa.float64(), False),
    pa.field("node_writes_per_s", pa.float64(), False),
    pa.field("replication_share", pa.float64(), False),
])
_SWEEP_DDL: Final[str] = (
    "scheme STRING, nodes INT, cores INT, workers INT, write_fraction DOUBLE, members INT, op_cpu_us DOUBLE, "
    "node_ops_per_s DOUBLE, node_queries_per_s DOUBLE, node_writes_per_s DOUBLE, replication_share DOUBLE"
)


@dataclass(frozen=True, slots=True)
class Inputs:
    """Per-operation costs (µs of server CPU on one core) and memory figures of one node."""

    query_us: float
    register_us: float
    sync_send_us: float
    sync_apply_us: float
    idle_rss_bytes: float
    bytes_per_instance: float
    #: How many instances the memory figure was measured with (beyond it: an extrapolation).
    measured_instances: int = 0
    #: Per field: where its value comes from (bench, command, date, load average).
    sources: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        for name in _COST_FIELDS:
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"workers model input {name} must be a finite number >= 0, got {value!r}")
        if self.query_us <= 0 or self.register_us <= 0:
            raise ValueError("workers model inputs query_us and register_us must be > 0")

    @classmethod
    def load(cls, path: str | os.PathLike[str] = DEFAULT_INPUTS) -> Inputs:
        """Read an inputs file (:meth:`load_doc`)."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"workers model inputs {path}: {exc}") from None
        return cls.load_doc(doc, str(path))

    @classmethod
    def load_doc(cls, doc: Any, where: str = "document") -> Inputs:
        """``{"inputs": {name: {"value": v, "source": "..."}}, "measured_instances": n}``."""
        try:
            entries = doc["inputs"]
            values = {name: float(entries[name]["value"]) for name in _COST_FIELDS}
            sources = {name: str(entries[name].get("source", "")) for name in _COST_FIELDS}
            measured = int(doc.get("measured_instances", 0))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"workers model inputs {where}: {type(exc).__name__}: {exc} (expected "
                             f"{{'inputs': {{name: {{'value': ..., 'source': ...}}}}}} with "
                             f"{', '.join(_COST_FIELDS)})") from None
        inputs = cls(**values, measured_instances=measured, sources=sources)
        inputs.validate()
        return inputs

    def to_json(self) -> dict[str, Any]:
        return {"inputs": {n: {"value": getattr(self, n), "source": self.sources.get(n, "")} for n in _COST_FIELDS},
                "measured_instances": self.measured_instances}


# -- the model (plain functions; the tests check them against hand-computed cases) --------------


def members(nodes: int, workers: int, scheme: str = "worker") -> int:
    """Distro members a write is synced among: every worker (``worker``) or every node (``node``)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown replica scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    return nodes * workers if scheme == "worker" else nodes


def write_cpu_us(inp: Inputs, n_members: int) -> float:
    """Cluster CPU one write costs: its handling, and a send and an apply per other member."""
    return inp.register_us + (n_members - 1) * (inp.sync_send_us + inp.sync_apply_us)


def op_cpu_us(inp: Inputs, n_members: int, write_fraction: float) -> float:
    """Mean cluster CPU per operation of a load with ``write_fraction`` writes."""
    return (1.0 - write_fraction) * inp.query_us + write_fraction * write_cpu_us(inp, n_members)


def node_ops_per_s(inp: Inputs, nodes: int, cores: int, workers: int, write_fraction: float, *,
                   scheme: str = "worker", efficiency: float = 1.0) -> float:
    """Operations per second one node serves when every node of the cluster is loaded alike."""
    busy = min(workers, cores) * efficiency
    rate = busy * 1e6 / op_cpu_us(inp, members(nodes, workers, scheme), write_fraction)
    if scheme == "node-single-writer" and write_fraction > 0 and inp.sync_apply_us > 0:
        rate = min(rate, 1e6 / (write_fraction * nodes * inp.sync_apply_us))
    return rate


def replication_share(inp: Inputs, n_members: int, write_fraction: float) -> float:
    """The fraction of the cluster's CPU spent sending and applying sync records."""
    sync = write_fraction * (n_members - 1) * (inp.sync_send_us + inp.sync_apply_us)
    return sync / op_cpu_us(inp, n_members, write_fraction)


def write_ceiling_per_node(inp: Inputs, nodes: int) -> float:
    """Writes per second per node as workers grow without bound (every worker applies every write)."""
    per_record = inp.sync_send_us + inp.sync_apply_us
    return math.inf if per_record <= 0 else 1e6 / (nodes * per_record)


def knee(rates: Sequence[float], fraction: float = 0.5) -> int | None:
    """``rates[i]`` is the throughput with ``i + 1`` workers: the first worker count after which one
    more adds less than ``fraction`` of what one worker serves; None when none does."""
    if not rates:
        return None
    first = rates[0]
    for i in range(len(rates) - 1):
        if rates[i + 1] - rates[i] < fraction * first:
            return i + 1
    return None


def worker_rss_bytes(inp: Inputs, instances: int) -> float:
    """One worker's resident memory with a replica of ``instances`` instances."""
    return inp.idle_rss_bytes + instances * inp.bytes_per_instance


def node_rss_bytes(inp: Inputs, workers: int, instances: int, scheme: str = "worker") -> float:
    """A node's resident memory: ``workers`` replicas, or one replica shared (the ``node`` schemes)."""
    if scheme == "worker":
        return workers * worker_rss_bytes(inp, instances)
    members(1, workers, scheme)  # validates the scheme
    return workers * inp.idle_rss_bytes + instances * inp.bytes_per_instance


def workers_that_fit(inp: Inputs, instances: int, budget_bytes: float) -> int:
    """How many full-replica workers fit in ``budget_bytes`` of a node's memory."""
    return max(0, int(budget_bytes // worker_rss_bytes(inp, instances)))


# -- parameters and the sweep ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkersParams:
    nodes: int = 3
    cores: tuple[int, ...] = (8, 16, 32)
    #: Workers per node for the table; None: one per core ("auto" without the runtime's cap).
    workers: int | None = None
    #: The mixed load's write fraction (default: 40,000 registrations per 120,000 queries).
    write_fraction: float = 0.25
    efficiency: float = 1.0
    instances: tuple[int, ...] = (100_000, 1_000_000)
    #: A node's memory for the workers-that-fit column (GiB).
    node_memory_gib: float = 16.0
    target_queries: float = 120_000.0
    target_registers: float = 40_000.0
    partitions: int | None = None

    def validate(self) -> None:
        if not 1 <= self.nodes <= 1000:
            raise ValueError(f"--nodes must be in 1..1000, got {self.nodes}")
        if not self.cores or any(not 1 <= c <= 1024 for c in self.cores):
            raise ValueError(f"--cores must be core counts in 1..1024, got {list(self.cores)}")
        if self.workers is not None and not 1 <= self.workers <= 1024:
            raise ValueError(f"--workers-per-node must be auto or 1..1024, got {self.workers}")
        if not 0.0 <= self.write_fraction <= 1.0:
            raise ValueError(f"--write-fraction must be in [0, 1], got {self.write_fraction}")
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"--efficiency must be in (0, 1], got {self.efficiency}")
        if not self.instances or any(not 0 <= i <= 10**10 for i in self.instances):
            raise ValueError(f"--instances must be counts in 0..10**10, got {list(self.instances)}")
        if not self.node_memory_gib > 0:
            raise ValueError(f"--node-memory-gib must be > 0, got {self.node_memory_gib}")
        if self.partitions is not None and self.partitions < 1:
            raise ValueError(f"--partitions must be >= 1, got {self.partitions}")

    def workers_for(self, cores: int) -> int:
        return cores if self.workers is None else self.workers

    def fractions(self) -> tuple[float, ...]:
        return tuple(sorted({*FRACTIONS, self.write_fraction}))

    def node_counts(self) -> tuple[int, ...]:
        return tuple(sorted({1, self.nodes}))


def grid(p: WorkersParams) -> list[tuple[str, int, int, int, float]]:
    """Every configuration the sweep evaluates: (scheme, nodes, cores, workers, write fraction),
    workers 1..max(cores, the table's workers)."""
    out: list[tuple[str, int, int, int, float]] = []
    for scheme in SCHEMES:
        for k in p.node_counts():
            for c in sorted(set(p.cores)):
                for w in range(1, max(c, p.workers_for(c)) + 1):
                    out.extend((scheme, k, c, w, f) for f in p.fractions())
    return out


def evaluate(inp: Inputs, configs: Sequence[tuple[str, int, int, int, float]], efficiency: float) -> pa.RecordBatch:
    """The model's figures for ``configs`` (one row each, :data:`_SWEEP_SCHEMA`)."""
    cols: dict[str, list[Any]] = {name: [] for name in _SWEEP_SCHEMA.names}
    for scheme, k, c, w, f in configs:
        m = members(k, w, scheme)
        x = node_ops_per_s(inp, k, c, w, f, scheme=scheme, efficiency=efficiency)
        for name, value in (("scheme", scheme), ("nodes", k), ("cores", c), ("workers", w), ("write_fraction", f),
                            ("members", m), ("op_cpu_us", op_cpu_us(inp, m, f)), ("node_ops_per_s", x),
                            ("node_queries_per_s", (1 - f) * x), ("node_writes_per_s", f * x),
                            ("replication_share", replication_share(inp, m, f))):
            cols[name].append(value)
    return pa.RecordBatch.from_pydict(cols, schema=_SWEEP_SCHEMA)


def _partition_fn(inp: Inputs, configs: list[tuple[str, int, int, int, float]], efficiency: float) -> Any:
    def evaluate_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if b.num_rows:
                yield evaluate(inp, [configs[i] for i in b.column(0).to_pylist()], efficiency)

    return evaluate_partition


def sweep(spark: SparkSession, inp: Inputs, p: WorkersParams, partitions: int) -> pa.Table:
    """Evaluate :func:`grid` in Spark partitions; the rows in grid order."""
    configs = grid(p)
    ids = spark.range(0, len(configs), 1, numPartitions=partitions)
    rows = ids.mapInArrow(_partition_fn(inp, configs, p.efficiency), _SWEEP_DDL)
    table = rows.toArrow().cast(_SWEEP_SCHEMA)
    order = {cfg: i for i, cfg in enumerate(configs)}
    keys = list(zip(*(table.column(n).to_pylist() for n in ("scheme", "nodes", "cores", "workers", "write_fraction")),
                    strict=True))
    return table.take(pa.array(sorted(range(table.num_rows), key=lambda i: order[keys[i]])))


# -- the job --------------------------------------------------------------------------------------


@dataclass(slots=True)
class WorkersResult:
    params: WorkersParams
    inputs: Inputs
    sweep: pa.Table
    table: pa.Table
    knees: pa.Table
    goal: dict[str, Any]
    partitions: int
    job_s: float = 0.0
    elapsed_s: float = 0.0
    started_at_ms: int = 0
    outputs: dict[str, Path] = field(default_factory=dict)


def _rates(sw: list[dict[str, Any]], scheme: str, k: int, c: int, f: float) -> list[float]:
    rows = [r for r in sw if r["scheme"] == scheme and r["nodes"] == k and r["cores"] == c and r["write_fraction"] == f]
    rows.sort(key=lambda r: r["workers"])
    return [r["node_ops_per_s"] for r in rows if r["workers"] <= c]


def _lookup(sw: list[dict[str, Any]], scheme: str, k: int, c: int, w: int, f: float) -> dict[str, Any]:
    for r in sw:
        if (r["scheme"], r["nodes"], r["cores"], r["workers"], r["write_fraction"]) == (scheme, k, c, w, f):
            return r
    raise KeyError((scheme, k, c, w, f))


def _derive(inp: Inputs, p: WorkersParams, sw: list[dict[str, Any]]) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    loads = (("query", 0.0), ("register", 1.0), ("mixed", p.write_fraction))
    budget = p.node_memory_gib * 2**30
    rows = []
    for scheme in SCHEMES:
        for k in p.node_counts():
            for c in sorted(set(p.cores)):
                w = p.workers_for(c)
                row: dict[str, Any] = {"scheme": scheme, "nodes": k, "cores": c, "workers": w,
                                       "members": members(k, w, scheme)}
                for name, f in loads:
                    row[f"{name}_per_s"] = _lookup(sw, scheme, k, c, w, f)["node_ops_per_s"]
                row["mixed_queries_per_s"] = (1 - p.write_fraction) * row["mixed_per_s"]
                row["mixed_writes_per_s"] = p.write_fraction * row["mixed_per_s"]
                row["replication_share_register"] = _lookup(sw, scheme, k, c, w, 1.0)["replication_share"]
                row["replication_share_mixed"] = _lookup(sw, scheme, k, c, w, p.write_fraction)["replication_share"]
                for n in p.instances:
                    row[f"worker_rss_bytes_{n}"] = worker_rss_bytes(inp, n) if scheme == "worker" else None
                    row[f"node_rss_bytes_{n}"] = node_rss_bytes(inp, w, n, scheme)
                rows.append(row)
    knees = []
    for scheme in SCHEMES:
        for k in p.node_counts():
            for c in sorted(set(p.cores)):
                for name, f in loads:
                    rates = _rates(sw, scheme, k, c, f)
                    best = max(range(len(rates)), key=rates.__getitem__) + 1
                    knees.append({"scheme": scheme, "nodes": k, "cores": c, "load": name, "write_fraction": f,
                                  "knee_workers": knee(rates), "best_workers": best, "best_per_s": rates[best - 1],
                                  "one_worker_per_s": rates[0]})
    goal = _goal(inp, p, sw)
    goal["workers_that_fit"] = {n: workers_that_fit(inp, n, budget) for n in p.instances}
    return pa.Table.from_pylist(rows), pa.Table.from_pylist(knees), goal


def _goal(inp: Inputs, p: WorkersParams, sw: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether one 8-core node of the cluster (and alone) reaches the targets, and what it would take."""
    c = 8
    cfgs = [(p.nodes, "worker"), (1, "worker"), (p.nodes, "node"), (p.nodes, "node-single-writer")]
    out: dict[str, Any] = {"cores": c, "rows": []}
    for k, scheme in cfgs:
        w = p.workers_for(c)
        q = _lookup(sw, scheme, k, c, w, 0.0)["node_ops_per_s"] if c in p.cores else \
            node_ops_per_s(inp, k, c, w, 0.0, scheme=scheme, efficiency=p.efficiency)
        r = _lookup(sw, scheme, k, c, w, 1.0)["node_ops_per_s"] if c in p.cores else \
            node_ops_per_s(inp, k, c, w, 1.0, scheme=scheme, efficiency=p.efficiency)
        m = members(k, w, scheme)
        out["rows"].append({"nodes": k, "scheme": scheme, "workers": w, "query_per_s": q, "register_per_s": r,
                            "queries_met": q >= p.target_queries, "registers_met": r >= p.target_registers,
                            "needs": "" if r >= p.target_registers else _needs(inp, p, k, min(w, c), m, scheme)})
    return out


def _needs(inp: Inputs, p: WorkersParams, k: int, busy: int, m: int, scheme: str) -> str:
    """What the per-record costs would have to be for ``busy`` cores to reach the registration target."""
    target = p.target_registers
    if scheme == "node-single-writer" and busy * p.efficiency * 1e6 / op_cpu_us(inp, m, 1.0) >= target:
        return (f"the writer's apply would need <= {1e6 / (k * target):.1f} µs per record "
                f"(measured {inp.sync_apply_us:.1f})")
    budget = busy * p.efficiency * 1e6 / target - inp.register_us  # µs per write left for replication
    if budget <= 0 or m <= 1:
        return "handling alone is too slow on these cores, even with free replication"
    return (f"send + apply would need <= {budget / (m - 1):.1f} µs per record "
            f"(measured {inp.sync_send_us + inp.sync_apply_us:.1f})")


def run(spark: SparkSession, params: WorkersParams, inputs: Inputs, out: str | os.PathLike[str], *,
        show_progress: bool = True) -> WorkersResult:
    params.validate()
    inputs.validate()
    started = time.monotonic()
    started_at_ms = time.time_ns() // 1_000_000
    out_dir = report.job_dir(out, JOB)
    partitions = params.partitions or spark.sparkContext.defaultParallelism
    label = f"simulate workers: {params.nodes} nodes x {','.join(map(str, params.cores))} cores"
    with spark_progress(spark, label, STEPS, enabled=show_progress) as progress:
        with progress.step(STEPS[0]):
            job_start = time.monotonic()
            sw = sweep(spark, inputs, params, partitions)
            job_s = time.monotonic() - job_start
        with progress.step(STEPS[1], spark_jobs=False):
            table, knees, goal = _derive(inputs, params, sw.to_pylist())
            res = WorkersResult(params=params, inputs=inputs, sweep=sw, table=table, knees=knees, goal=goal,
                                partitions=partitions, job_s=job_s, started_at_ms=started_at_ms)
            master = str(spark.sparkContext.master)
            for name, t in (("sweep", sw), ("table", table), ("knees", knees)):
                res.outputs[name] = report.write_table(t, out_dir / f"{name}.parquet")
            inputs_path = out_dir / "inputs.json"
            inputs_path.write_text(json.dumps(inputs.to_json(), indent=2) + "\n")
            res.outputs["inputs"] = inputs_path
            res.outputs["chart"] = _chart(out_dir / f"{JOB}.png", res, master)
            res.elapsed_s = time.monotonic() - started
            run_row = {**{k: (",".join(map(str, v)) if isinstance(v, tuple) else v)
                          for k, v in asdict(params).items()},
                       "partitions": partitions, "master": master, "configurations": sw.num_rows,
                       "started_at_ms": started_at_ms, "job_s": job_s, "elapsed_s": res.elapsed_s}
            run_table = report.ms_to_timestamps(pa.Table.from_pylist([run_row]), {"started_at_ms": "started_at"})
            res.outputs["run"] = report.write_table(run_table, out_dir / "run.parquet")
            res.outputs["summary"] = report.write_summary(out_dir, _summary(res, master))
    return res


# -- summary and chart ----------------------------------------------------------------------------


def _k(n: float) -> str:
    return f"{n / 1000:,.1f}k"


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else (
        f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n))


def _summary(res: WorkersResult, master: str) -> list[str]:
    p, inp = res.params, res.inputs
    workers = "one per core" if p.workers is None else str(p.workers)
    lines = [
        "Shoal workers model (shoal server --workers N): every worker a Distro member with a full replica",
        f"nodes {p.nodes}; cores {', '.join(map(str, p.cores))}; workers per node {workers}; mixed load "
        f"{p.write_fraction:.0%} writes; parallel efficiency {p.efficiency:.2f}",
        f"spark: master {master}, {res.partitions} partition(s), {res.sweep.num_rows:,} configurations; "
        f"job {res.job_s:.1f} s, total {res.elapsed_s:.1f} s",
        "",
        "inputs (µs of server CPU on one core):",
    ]
    for name in _COST_FIELDS:
        value = getattr(inp, name)
        shown = report.fmt_bytes(value) if name.endswith("_bytes") else (
            f"{value:,.0f} B" if name == "bytes_per_instance" else f"{value:,.1f} µs")
        lines.append(f"  {name:<19} {shown:>10}  {inp.sources.get(name, '')}")
    headers = ["cores", "workers", "members", "query/s", "register/s", "mixed/s", "repl reg", "repl mixed"]
    headers += [f"worker RSS {_count(n)}" for n in p.instances] + [f"node RSS {_count(n)}" for n in p.instances]
    sections = [("worker", p.nodes, f"per node, {p.nodes} node(s), a replica per worker (ops/s; repl: replication "
                 "share of the CPU; RSS: resident memory):")]
    if p.nodes > 1:
        sections.append(("worker", 1, "one node alone (its workers replicate only among themselves):"))
    sections.append(("node", p.nodes, f"alternative: one replica per node, its writes spread over the node's cores "
                     f"(e.g. sharded by service among the workers), {p.nodes} node(s); the forwarding to a shard "
                     "costs nothing here: an upper bound:"))
    sections.append(("node-single-writer", p.nodes, f"alternative: one replica per node written by one process, read "
                     f"by the workers, {p.nodes} node(s) (the writer applies every write of the cluster):"))
    for scheme, k, title in sections:
        body = []
        for r in res.table.to_pylist():
            if r["scheme"] != scheme or r["nodes"] != k:
                continue
            cells = [r["cores"], r["workers"], r["members"], _k(r["query_per_s"]), _k(r["register_per_s"]),
                     _k(r["mixed_per_s"]), f"{r['replication_share_register']:.0%}",
                     f"{r['replication_share_mixed']:.0%}"]
            cells += [report.fmt_bytes(r[f"worker_rss_bytes_{n}"]) if r[f"worker_rss_bytes_{n}"] is not None else "-"
                      for n in p.instances]
            cells += [report.fmt_bytes(r[f"node_rss_bytes_{n}"]) for n in p.instances]
            body.append(cells)
        lines += ["", title, *("  " + line for line in report.table_lines(headers, body))]
    lines += ["", "knee: the workers after which one more adds less than half of one worker's rate "
              "(best: the workers with the highest rate, up to the cores):"]
    kn = [r for r in res.knees.to_pylist() if r["scheme"] == "worker"]
    kn.sort(key=lambda r: (-r["nodes"], r["cores"]))
    body = [[r["nodes"], r["cores"], r["load"], "none" if r["knee_workers"] is None else r["knee_workers"],
             r["best_workers"], _k(r["best_per_s"]), _k(r["one_worker_per_s"])] for r in kn]
    lines += ["  " + line for line in report.table_lines(
        ["nodes", "cores", "load", "knee", "best", "best/s", "1 worker/s"], body)]
    ceiling = write_ceiling_per_node(inp, p.nodes)
    lines += ["", f"write ceiling per node with {p.nodes} nodes, any number of workers: 10^6 / ({p.nodes} x "
              f"(send {inp.sync_send_us:.1f} + apply {inp.sync_apply_us:.1f} µs)) = {_k(ceiling)}/s"]
    g = res.goal
    lines += ["", f"goal for one {g['cores']}-core node: >= {_k(p.target_queries)} queries/s and "
              f">= {_k(p.target_registers)} registrations/s:"]
    for r in g["rows"]:
        where = f"{r['nodes']} node(s), replica per {r['scheme']}, {r['workers']} workers"
        need = f"; {r['needs']}" if r["needs"] else ""
        lines.append(f"  {where}: queries {_k(r['query_per_s'])}/s "
                     f"({'met' if r['queries_met'] else 'NOT met'}), registrations {_k(r['register_per_s'])}/s "
                     f"({'met' if r['registers_met'] else 'NOT met'}){need}")
    lines += ["", f"memory: a worker holds idle {report.fmt_bytes(inp.idle_rss_bytes)} + "
              f"{inp.bytes_per_instance:,.0f} B per instance of the whole cluster (measured up to "
              f"{inp.measured_instances:,} instances; beyond: extrapolated); full-replica workers that fit in "
              f"{p.node_memory_gib:g} GiB: "
              + ", ".join(f"{g['workers_that_fit'][n]} at {_count(n)} instances" for n in p.instances)]
    return lines


def _chart(path: Path, res: WorkersResult, master: str) -> Path:
    fig, axes = report.new_figure(1, 3, width=16.0)
    ax1, ax2, ax3 = axes
    p, inp = res.params, res.inputs
    fig.suptitle(f"Shoal workers model: {p.nodes} nodes, replica per worker, mixed = {p.write_fraction:.0%} "
                 f"writes, efficiency {p.efficiency:.2f}\nrun {report.fmt_ms(res.started_at_ms)} on {master}",
                 fontsize="large")
    sw = res.sweep.to_pylist()
    c_max = max(p.cores)  # a node of fewer cores follows the same curves up to its core count
    for k, name, f, style in ((p.nodes, "query", 0.0, "-"), (p.nodes, "register", 1.0, ":"),
                              (p.nodes, "mixed", p.write_fraction, "--"), (1, "register, node alone", 1.0, "-.")):
        rates = _rates(sw, "worker", k, c_max, f)
        ax1.plot(range(1, len(rates) + 1), rates, style, label=name)
    ax1.axhline(p.target_queries, color="grey", lw=0.8)
    ax1.axhline(p.target_registers, color="grey", lw=0.8, ls=":")
    ax1.set_yscale("log")
    ax1.set_xlabel(f"workers per node (one per core, up to {c_max})")
    ax1.set_ylabel("ops per second per node (log)")
    ax1.set_title("throughput per node (grey: the 8-core goals)")
    ax1.legend(fontsize="small")
    for name, f in (("register", 1.0), ("mixed", p.write_fraction)):
        rows = sorted((r for r in sw if r["scheme"] == "worker" and r["nodes"] == p.nodes and r["cores"] == c_max
                       and r["write_fraction"] == f), key=lambda r: r["workers"])
        ax2.plot([r["workers"] for r in rows], [r["replication_share"] for r in rows], label=name)
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("workers per node")
    ax2.set_ylabel("share of CPU")
    ax2.set_title("replication share of the cluster's CPU")
    ax2.legend(fontsize="small")
    gib = [worker_rss_bytes(inp, n) / 2**30 for n in p.instances]
    bars = ax3.bar([_count(n) for n in p.instances], gib)
    report.label_bars(ax3, bars, [f"{v:.2f} GiB" for v in gib])
    report.headroom(ax3, max(gib))
    ax3.set_xlabel("instances in the cluster")
    ax3.set_ylabel("GiB")
    ax3.set_title(f"RSS per worker (measured to {inp.measured_instances:,})")
    return report.save_figure(fig, path)
