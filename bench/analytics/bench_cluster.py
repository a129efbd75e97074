"""Rows per second of each analytics job on ``local[*]`` and on a real standalone cluster, side by side.

    flock /tmp/shoal-heavy.lock .venv/bin/python -m bench.analytics.bench_cluster \\
        [--rows 200000] [--events 200000] [--clients 100000] [--sim-clients 1000000] [--repeat 3] \\
        [--jobs consistency churn balance simulate] [--worker-memory 512m] [--json out.json]

One run: generates three nodes' snapshots (instances, clients, change events), starts a standalone
master and two 1-core workers from PySpark's distribution on loopback (:mod:`shoal.testing.spark`),
then, for each master in turn, one driver process runs every job ``--warmup`` times untimed and
``--repeat`` times timed in one SparkSession (the job functions the CLI calls, on the same input and
parameters). A job's rows: its input rows (consistency: instances; churn: events; balance: clients
+ instances; simulate: clients). Reported per job and master: the median wall time, rows/s at the
median, every sample, and cluster/local. Printed as JSON, appended to bench/results/analytics.jsonl
(git-ignored), and written to ``--json`` when given. Both masters share the box's cores: the
figures compare the two modes of running, not two machines (judge them by ``loadavg_1m``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bench.analytics.bench_analytics import T0, _columns, _record

from shoal.export.writer import SnapshotWriter

JOBS = ("consistency", "churn", "balance", "simulate")
LOCAL = "local[*]"
NODES = [f"10.0.0.{k + 1}:8848" for k in range(3)]


# -- input --------------------------------------------------------------------------------------------


def _s(x: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(x), pa.string())


def _clients(n: int, node: str, k: int) -> dict[str, Any]:
    """``n`` ip:port clients, every node holding all of them, each native on one node."""
    i = np.arange(n, dtype=np.int64)
    ip = pc.binary_join_element_wise("10", _s(i >> 16 & 255), _s(i >> 8 & 255), _s(i & 255), ".")
    owner = np.array(NODES, dtype=object)[i % len(NODES)]
    return {
        "client_id": pc.binary_join_element_wise(ip, ":8080#true", ""),
        "kind": pa.array(np.full(n, "ip_port")),
        "native": pa.array(i % len(NODES) == k),
        "owner_node": pa.array(owner, pa.string()),
        "revision": pa.array(i),
        "client_ip": ip,
        "connected_at_ms": pa.array(np.full(n, T0, dtype=np.int64)),
        "last_active_ms": pa.array(np.full(n, T0, dtype=np.int64)),
        "published_services": pa.array(np.ones(n, dtype=np.int32)),
        "subscribed_services": pa.array(np.zeros(n, dtype=np.int32)),
    }


def _events(n: int, k: int) -> dict[str, Any]:
    """``n`` registrations, deregistrations and health flips over an hour, on 1,000 services."""
    rng = np.random.default_rng(k)
    kinds = np.array(["register", "deregister", "health_flip"], dtype=object)[rng.integers(0, 3, n)]
    inst = rng.integers(0, 50_000, n)
    ip = pc.binary_join_element_wise("10.7", _s(inst >> 8 & 255), _s(inst & 255), ".")
    port = pa.array((8000 + inst % 4).astype(np.int32))
    return {
        "ts_ms": pa.array(np.sort(T0 + rng.integers(0, 3_600_000, n))),
        "kind": pa.array(kinds, pa.string()),
        "namespace": pa.array(np.full(n, "public")),
        "group": pa.array(np.full(n, "DEFAULT_GROUP")),
        "service": pc.binary_join_element_wise("svc-", _s(inst % 1000), ""),
        "client_id": pc.binary_join_element_wise(ip, ":", pc.cast(port, pa.string()), "#true", ""),
        "ip": ip,
        "port": port,
        "healthy": pa.array(np.where(kinds == "health_flip", rng.integers(0, 2, n) == 1, None), pa.bool_()),
    }


def generate(root: Path, args: argparse.Namespace) -> dict[str, int]:
    """Three nodes' snapshots under ``root``; returns each job's input rows."""
    for k, node in enumerate(NODES):
        with SnapshotWriter(root, node, T0 + 3_600_000 + k) as w:
            w.write_columns("instances", _columns(args.rows, node, NODES))
            w.write_columns("clients", _clients(args.clients, node, k))
            w.write_columns("events", _events(args.events, k))
    n = len(NODES)
    return {"consistency": n * args.rows, "churn": n * args.events, "balance": n * (args.rows + args.clients),
            "simulate": args.sim_clients}


# -- one master (child process) ----------------------------------------------------------------------


def _job_runners(args: argparse.Namespace) -> dict[str, Callable[[Any, Path], object]]:
    """Each job as the CLI runs it, on the bench's input; called as ``run(spark, out_dir)``."""
    from shoal.analytics import balance, churn, consistency, simulate

    inputs = [Path(args.input)]
    params = simulate.SimParams(nodes=100, clients=args.sim_clients, partitions=args.sim_partitions)
    return {
        "consistency": lambda spark, out: consistency.run(spark, inputs, out, show_progress=False),
        "churn": lambda spark, out: churn.run(spark, inputs, out, show_progress=False),
        "balance": lambda spark, out: balance.run(spark, inputs, out, show_progress=False),
        "simulate": lambda spark, out: simulate.run(spark, params, out, show_progress=False),
    }


def run_master(args: argparse.Namespace) -> int:
    from shoal.analytics.session import build_session

    conf = dict(kv.split("=", 1) for kv in args.conf)
    spark = build_session(args.master, "shoal-bench-cluster", conf=conf, driver_memory="2g")
    runners = _job_runners(args)
    samples: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="shoal-bench-out-") as tmp:
            for job in args.jobs:
                times = []
                for i in range(args.warmup + args.repeat):
                    t = time.perf_counter()
                    runners[job](spark, Path(tmp) / job)
                    if i >= args.warmup:
                        times.append(time.perf_counter() - t)
                samples[job] = times
                print(f"{args.master} {job}: {', '.join(f'{s:.2f}' for s in times)} s", file=sys.stderr)
        master = str(spark.sparkContext.master)
        parallelism = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()
    Path(args.result).write_text(json.dumps({"master": master, "parallelism": parallelism, "samples": samples}))
    return 0


# -- both masters (the parent) -----------------------------------------------------------------------


def _child(args: argparse.Namespace, input_dir: Path, master: str, conf: list[str], result: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.analytics.bench_cluster", "--master", master, "--input", str(input_dir),
            "--result", str(result), "--repeat", str(args.repeat), "--warmup", str(args.warmup),
            "--sim-clients", str(args.sim_clients), "--sim-partitions", str(args.sim_partitions),
            "--jobs", *args.jobs]
    for kv in conf:
        argv += ["--conf", kv]
    subprocess.run(argv, check=True, timeout=args.timeout)
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def _figures(rows: int, samples: list[float]) -> dict[str, Any]:
    median = statistics.median(samples)
    return {"median_s": round(median, 3), "rows_per_s": round(rows / median),
            "samples_s": [round(s, 3) for s in samples]}


def run_both(args: argparse.Namespace) -> int:
    from shoal.testing.spark import SparkStandalone

    with tempfile.TemporaryDirectory(prefix="shoal-bench-cluster-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        rows = generate(root / "in", args)
        generate_s = time.perf_counter() - t
        local = _child(args, root / "in", LOCAL, [], root / "local.json")
        t = time.perf_counter()
        with SparkStandalone(root / "spark", workers=2, cores=1, memory=args.worker_memory) as cluster:
            start_s = time.perf_counter() - t
            conf = [f"{k}={v}" for k, v in cluster.driver_conf().items()]
            remote = _child(args, root / "in", cluster.master_url, conf, root / "cluster.json")
            apps = [a["id"] for a in cluster.applications() if a["name"] == "shoal-bench-cluster"]
            executors = {app: cluster.executors_of(app) for app in apps}
    jobs = {}
    for job in args.jobs:
        loc, rem = _figures(rows[job], local["samples"][job]), _figures(rows[job], remote["samples"][job])
        jobs[job] = {"rows": rows[job], "local": loc, "cluster": rem,
                     "cluster_vs_local": round(rem["rows_per_s"] / loc["rows_per_s"], 3)}
    figures = {
        "local_master": local["master"], "local_parallelism": local["parallelism"],
        "cluster_master": remote["master"], "cluster_parallelism": remote["parallelism"],
        "cluster": {"workers": 2, "cores_per_worker": 1, "worker_memory": args.worker_memory,
                    "start_s": round(start_s, 2), "executors": executors},
        "repeat": args.repeat, "warmup": args.warmup, "generate_s": round(generate_s, 1),
        "input": {"nodes": len(NODES), "instances_per_node": args.rows, "clients_per_node": args.clients,
                  "events_per_node": args.events, "sim_clients": args.sim_clients,
                  "sim_partitions": args.sim_partitions},
        "jobs": jobs,
    }
    _record("analytics_cluster", figures)
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "analytics_cluster", "loadavg_1m": os.getloadavg()[0],
                                               **figures}, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="instances per node (default: 200,000)")
    parser.add_argument("--clients", type=int, default=100_000, help="clients per node (default: 100,000)")
    parser.add_argument("--events", type=int, default=200_000, help="change events per node (default: 200,000)")
    parser.add_argument("--sim-clients", type=int, default=1_000_000, help="simulated clients (default: 1,000,000)")
    parser.add_argument("--sim-partitions", type=int, default=4,
                        help="simulate's partitions on both masters (default: 4)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per job and master (default: 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: 1)")
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    parser.add_argument("--worker-memory", default="512m", help="memory of each worker and executor (default: 512m)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per master (default: 3600)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    # the driver of one master (the parent runs itself once per master)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be >= 1 and --warmup >= 0")
    return run_master(args) if args.master else run_both(args)


if __name__ == "__main__":
    sys.exit(main())
