"""Benchmarks for snapshot export and the analytics jobs (a script, not collected by pytest).

    .venv/bin/python bench/analytics/bench_analytics.py export      [--rows 1000000] [--batch-rows 16384]
    .venv/bin/python bench/analytics/bench_analytics.py consistency [--rows 1000000] [--nodes 3]
    .venv/bin/python bench/analytics/bench_analytics.py simulate    [--nodes 1000] [--clients 10000000]
                                                                    [--partitions 1 2 4]
    .venv/bin/python bench/analytics/bench_analytics.py all

Targets: export of 1,000,000 instances <= 2 s with the event loop never blocked > 50 ms;
consistency over 3 x 1,000,000 rows in local mode; ``simulate --nodes 1000 --clients 10000000`` <= 5
min, with rows/s at 1, 2 and 4 partitions. Results are printed and appended as JSON lines to
bench/results/analytics.jsonl (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shoal.export.writer import DEFAULT_BATCH_ROWS, SnapshotWriter

RESULTS = Path(__file__).resolve().parents[1] / "results" / "analytics.jsonl"
T0 = 1_700_000_000_000


def _record(name: str, figures: dict[str, Any]) -> None:
    row = {
        "bench": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1m": round(os.getloadavg()[0], 2),  # the box may be shared: judge the figures by it
        **figures,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=2))


# -- export ------------------------------------------------------------------------------------------


def instance_chunk(start: int, n: int, node: str) -> list[tuple[Any, ...]]:
    """Rows as the node's export task would hand them over: tuples in schema order."""
    rows = []
    for i in range(start, start + n):
        ip = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        rows.append(
            (
                "public",
                "DEFAULT_GROUP",
                f"svc-{i % 20000:05d}",
                "DEFAULT",
                ip,
                8080,
                1.0,
                True,
                True,
                True,
                {"app": f"app-{i % 50}", "zone": "z1"} if i % 3 else {},
                None,
                f"{ip}:8080#true",
                node,
                i,
                T0 + i,
                None,
            )
        )
    return rows


def bench_export(args: argparse.Namespace) -> None:
    node = "10.0.0.1:8848"
    chunks = [
        instance_chunk(s, min(args.batch_rows, args.rows - s), node) for s in range(0, args.rows, args.batch_rows)
    ]
    with tempfile.TemporaryDirectory(prefix="shoal-bench-export-") as tmp:
        # 1. the writer alone, timed per chunk
        writer = SnapshotWriter(tmp, node, T0, batch_rows=args.batch_rows).open()
        per_chunk = []
        start = time.perf_counter()
        for chunk in chunks:
            t = time.perf_counter()
            writer.write_chunk("instances", chunk)
            per_chunk.append(time.perf_counter() - t)
        t = time.perf_counter()
        info = writer.close()
        close_s = time.perf_counter() - t
        total_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in info.path.iterdir())

        # 2. as the node will run it: chunks written in an executor while the loop keeps ticking
        lag = asyncio.run(_export_on_loop(tmp, node, chunks, args.batch_rows))
    _record(
        "export",
        {
            "rows": args.rows,
            "batch_rows": args.batch_rows,
            "total_s": round(total_s, 3),
            "rows_per_s": round(args.rows / total_s),
            "max_chunk_ms": round(max(per_chunk) * 1000, 1),
            "median_chunk_ms": round(sorted(per_chunk)[len(per_chunk) // 2] * 1000, 1),
            "close_ms": round(close_s * 1000, 1),
            "bytes": size,
            "loop_export_s": round(lag["elapsed_s"], 3),
            "loop_max_lag_ms": round(lag["max_lag_ms"], 1),
            "loop_p99_lag_ms": round(lag["p99_lag_ms"], 1),
        },
    )


async def _export_on_loop(
    tmp: str, node: str, chunks: list[list[tuple[Any, ...]]], batch_rows: int
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append((loop.time() - t - 0.001) * 1000)

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        writer = SnapshotWriter(Path(tmp) / "loop", node, T0, batch_rows=batch_rows)
        for chunk in chunks:
            await loop.run_in_executor(pool, writer.write_chunk, "instances", chunk)
        await loop.run_in_executor(pool, writer.close)
    elapsed = time.perf_counter() - start
    done.set()
    await tick
    lags.sort()
    return {"elapsed_s": elapsed, "max_lag_ms": lags[-1], "p99_lag_ms": lags[int(len(lags) * 0.99)]}


# -- consistency -------------------------------------------------------------------------------------


def _columns(n: int, node: str, owner_nodes: list[str]) -> dict[str, Any]:
    """One node's instances as column arrays (fast to generate at millions of rows)."""
    i = np.arange(n, dtype=np.int64)

    def s(x: np.ndarray) -> pa.Array:
        return pc.cast(pa.array(x), pa.string())

    ip = pc.binary_join_element_wise("10", s(i >> 16 & 255), s(i >> 8 & 255), s(i & 255), ".")
    keys = pa.array(np.where(i % 3 == 0, None, "app"), pa.string())
    values = pc.binary_join_element_wise("a", s(i % 50), "")
    offsets = pa.array(np.concatenate([[0], np.cumsum(i % 3 != 0)]).astype(np.int32))
    md = pa.MapArray.from_arrays(offsets, keys.drop_null(), values.filter(pc.is_valid(keys)))
    return {
        "namespace": pa.array(np.full(n, "public")),
        "group": pa.array(np.full(n, "DEFAULT_GROUP")),
        "service": pc.binary_join_element_wise("svc-", s(i % 20000), ""),
        "cluster": pa.array(np.full(n, "DEFAULT")),
        "ip": ip,
        "port": pa.array(np.full(n, 8080, dtype=np.int32)),
        "weight": pa.array(np.ones(n)),
        "healthy": pa.array(np.ones(n, dtype=bool)),
        "enabled": pa.array(np.ones(n, dtype=bool)),
        "ephemeral": pa.array(np.ones(n, dtype=bool)),
        "metadata": md,
        "client_id": pc.binary_join_element_wise(ip, ":8080#true", ""),
        "owner_node": pa.array(np.array(owner_nodes, dtype=object)[i % len(owner_nodes)], pa.string()),
        "client_revision": pa.array(i),
    }


def bench_consistency(args: argparse.Namespace) -> None:
    from shoal.analytics import consistency
    from shoal.analytics.session import build_session

    nodes = [f"10.0.0.{k + 1}:8848" for k in range(args.nodes)]
    with tempfile.TemporaryDirectory(prefix="shoal-bench-consistency-") as tmp:
        t = time.perf_counter()
        for k, node in enumerate(nodes):
            cols = _columns(args.rows, node, nodes)
            if k == 1:  # node 2 differs: 10 weights changed, 10 instances missing
                weight = np.ones(args.rows)
                weight[np.arange(10) * 997] = 2.0
                cols["weight"] = pa.array(weight)
                keep = pa.array(~np.isin(np.arange(args.rows), np.arange(10) * 991 + 5))
                cols = {c: pc.filter(v, keep) for c, v in cols.items()}
            with SnapshotWriter(Path(tmp) / "in", node, T0 + k * 100) as w:
                w.write_columns("instances", cols)
        gen_s = time.perf_counter() - t
        spark = build_session(args.master)
        t = time.perf_counter()
        res = consistency.run(spark, [Path(tmp) / "in"], Path(tmp) / "out", show_progress=not args.quiet)
        job_s = time.perf_counter() - t
        spark.stop()
    _record(
        "consistency",
        {
            "nodes": args.nodes,
            "rows_per_node": args.rows,
            "total_rows": args.nodes * args.rows,
            "generate_s": round(gen_s, 1),
            "job_s": round(job_s, 1),
            "rows_per_s": round(args.nodes * args.rows / job_s),
            "differences": res.counts,
            "agreement_ratio": res.agreement_ratio,
            "master": args.master or "local[*]",
        },
    )


# -- simulate ----------------------------------------------------------------------------------------


def bench_simulate(args: argparse.Namespace) -> None:
    from shoal.analytics import simulate
    from shoal.analytics.session import build_session
    from shoal.kernels import implementation

    spark = build_session(args.master)
    runs = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-simulate-") as tmp:
        # untimed warm-up: JVM JIT and Python worker start-up would otherwise land on the first run
        simulate.run(spark, simulate.SimParams(nodes=args.nodes, clients=200_000), Path(tmp) / "warm",
                     show_progress=False)
        for parts in args.partitions:
            params = simulate.SimParams(nodes=args.nodes, clients=args.clients, partitions=parts)
            t = time.perf_counter()
            res = simulate.run(spark, params, Path(tmp) / f"p{parts}", show_progress=not args.quiet)
            wall = time.perf_counter() - t
            runs.append(
                {
                    "partitions": parts,
                    "job_s": round(res.job_s, 1),
                    "wall_s": round(wall, 1),
                    "rows_per_s": round(res.rows_per_s),
                }
            )
            print(f"partitions={parts}: job {res.job_s:.1f} s, {res.rows_per_s:,.0f} clients/s", file=sys.stderr)
    spark.stop()
    _record(
        "simulate",
        {
            "nodes": args.nodes,
            "clients": args.clients,
            "master": args.master or "local[*]",
            "ownership_kernel": implementation().get("ownership"),
            "runs": runs,
        },
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    jobs: dict[str, Callable[[argparse.Namespace], None]] = {}

    p = sub.add_parser("export")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch-rows", type=int, default=DEFAULT_BATCH_ROWS)
    jobs["export"] = bench_export

    p = sub.add_parser("consistency")
    p.add_argument("--rows", type=int, default=1_000_000, help="instances per node")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--master", default=None)
    p.add_argument("--quiet", action="store_true")
    jobs["consistency"] = bench_consistency

    p = sub.add_parser("simulate")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--clients", type=int, default=10_000_000)
    p.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--master", default=None)
    p.add_argument("--quiet", action="store_true")
    jobs["simulate"] = bench_simulate

    sub.add_parser("all")
    args = parser.parse_args(argv)
    if args.bench == "all":
        for name in ("export", "consistency", "simulate"):
            jobs[name](parser.parse_args([name]))
    else:
        jobs[args.bench](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
