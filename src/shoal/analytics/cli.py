"""The ``shoal analytics <job>``, ``shoal simulate`` and ``shoal simulate workers`` subcommands.

``shoal/__main__.py`` owns the ``shoal`` parser and calls :func:`register` (importing this module
lazily, so the server never imports analytics). Until then, and for scripts, ``python -m
shoal.analytics.cli ...`` runs the same subcommands. Handlers import pyspark only when they run, so
``--help`` is instant and works without the analytics extra installed. Each job writes into a
directory of its own, ``report/<job>/`` unless ``--out`` names another, and refuses a directory
holding another job's results (jobs share file names such as ``summary.txt``). Each handler takes
the parsed namespace and returns an exit code: 0 success, 1 bad input (missing or invalid
snapshots, invalid parameters, ``--out`` holding another job's results), 3 ``--fail-on-diff`` and
the nodes disagree, 4 the analytics extra is not installed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main", "register"]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_BAD_INPUT = 1
EXIT_DIFFERENCES = 3
EXIT_MISSING_EXTRA = 4

_EXTRA_MODULES = frozenset({"pyspark", "pandas", "matplotlib", "numpy", "py4j"})

_FORMATTER = argparse.RawDescriptionHelpFormatter

#: Where each job writes when --out is not given: ``report/<job>``.
DEFAULT_REPORT_ROOT = Path("report")


def _doc(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def _common(p: argparse.ArgumentParser, job: str, *, inputs: bool) -> None:
    if inputs:
        p.add_argument(
            "--input", "-i", nargs="+", required=True, metavar="DIR", type=Path,
            help="snapshot directories, or directories containing snapshot directories "
                 "(as written by `shoal export`, or by a node started with -D shoal.export.dir=DIR)",
        )
    p.add_argument("--out", "-o", metavar="DIR", type=Path, default=DEFAULT_REPORT_ROOT / job,
                   help=f"directory for this job's results (default: {DEFAULT_REPORT_ROOT / job}); created, "
                        "a rerun replaces its files, a directory holding another job's results is refused")
    p.add_argument("--master", metavar="URL", default=None,
                   help="Spark master URL (default: local[*]); e.g. spark://host:7077. "
                        "Executors need Shoal installed")
    p.add_argument("--conf", metavar="KEY=VALUE", action="append", default=[], type=_spark_conf,
                   help="a Spark setting for this run, repeatable (as spark-submit's --conf); e.g. "
                        "spark.executor.memory=2g on a cluster whose workers offer less than 1g")
    if inputs:
        p.add_argument("--keep-staging", action="store_true",
                       help="keep the Parquet copies of the snapshots under OUT/_staging")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip().startswith("spark."):
        raise argparse.ArgumentTypeError(f"expected spark.KEY=VALUE, got {text!r}")
    return key.strip(), value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``analytics`` (with ``consistency|churn|balance|history``) and ``simulate`` (with its
    optional model ``workers``) to ``subparsers``."""
    analytics = subparsers.add_parser(
        "analytics",
        help="PySpark jobs over exported registry snapshots",
        formatter_class=_FORMATTER,
        description=_doc("""
            Offline analyses of registry snapshots (Arrow files written by `shoal export`, or
            periodically by a node started with -D shoal.export.dir=DIR), run with PySpark (local
            mode unless --master is given). Each job writes Parquet tables (points in time as UTC
            timestamps), a PNG chart and summary.txt into a directory of its own, report/<job>/
            unless --out names another, and prints the summary; progress goes to stderr.
            Requires the `analytics` extra: pip install 'shoal[analytics]' (and a Java 17+ runtime).
        """),
    )
    jobs = analytics.add_subparsers(dest="job", metavar="JOB", required=True)

    p = jobs.add_parser(
        "consistency",
        help="instances missing, extra or different per service and node; agreement ratio",
        formatter_class=_FORMATTER,
        description=_doc("""
            Compare the newest snapshot of every node (take them at about the same time). An
            instance is identified by namespace, group, service, cluster, ip and port; copies differ
            when weight, healthy, enabled or metadata differ. Reference per instance: the copy of its
            owner node if that node was snapshotted, else the majority of nodes. Agreement ratio:
            instances identical on all nodes / all instances.

            Writes per_service_node.parquet, services.parquet, diffs.parquet/, consistency.png and
            summary.txt (which names the first differences: service, ip:port, node, what differs).
        """),
        epilog="example: shoal analytics consistency --input exports/   (writes report/consistency/)",
    )
    _common(p, "consistency", inputs=True)
    p.add_argument("--first", type=int, default=20, metavar="N",
                   help="differences named in summary.txt (default: 20)")
    p.add_argument("--fail-on-diff", action="store_true",
                   help=f"exit with status {EXIT_DIFFERENCES} when any difference is found")
    p.set_defaults(func=_run_consistency)

    p = jobs.add_parser(
        "churn",
        help="registrations, deregistrations and health flips per service over time; flapping instances",
        formatter_class=_FORMATTER,
        description=_doc("""
            Count the change events of all snapshots' event logs (duplicates from overlapping logs
            of successive snapshots are dropped) per service and time bucket, and rank instances by
            flaps (health flips + deregister/register cycles).

            Writes service_buckets.parquet (bucket_start: a timestamp), flapping.parquet (first_at,
            last_at), nodes.parquet, churn.png and summary.txt.
        """),
        epilog="example: shoal analytics churn --input exports/ --bucket-seconds 300   (writes report/churn/)",
    )
    _common(p, "churn", inputs=True)
    p.add_argument("--bucket-seconds", type=int, default=60, metavar="S",
                   help="time bucket width in seconds (default: 60)")
    p.add_argument("--top", type=int, default=20, metavar="N",
                   help="services and instances listed in summary.txt (default: 20)")
    p.set_defaults(func=_run_churn)

    p = jobs.add_parser(
        "balance",
        help="clients and instances per owner node, skew, movement on membership change",
        formatter_class=_FORMATTER,
        description=_doc("""
            Clients and instances per owner node with skew (max/mean, stddev), and the fraction of
            ip:port clients that change owner when a member joins or leaves, for Nacos modulo hashing
            (sorted_members[distroHash(ip:port) % n]) and for a consistent-hash ring.

            Writes nodes.parquet, skew.parquet, movement.parquet, balance.png and summary.txt.
        """),
        epilog="example: shoal analytics balance --input exports/   (writes report/balance/)",
    )
    _common(p, "balance", inputs=True)
    p.add_argument("--join-member", metavar="IP:PORT", default=None,
                   help="address of the joining member (default: next IPv4 after the highest member)")
    p.add_argument("--vnodes", type=int, default=160, metavar="V",
                   help="virtual nodes per member on the consistent-hash ring (default: 160)")
    p.set_defaults(func=_run_balance)

    p = jobs.add_parser(
        "history",
        help="an instance's lifecycle across every node's history log",
        formatter_class=_FORMATTER,
        description=_doc("""
            Read the history logs of every node (each node writes them under <data_dir>/history;
            give those directories, the data directories, or copies of them) and print the
            lifecycle of a service's instances across the nodes, in time order: registered by
            which client on which node, edits, health flips, and how each went (deregistered,
            expired with the beat reason, connection closed, Distro removal, moved).

            Writes lifecycle.parquet (one row per event, at: a timestamp) and summary.txt.
        """),
        epilog="example: shoal analytics history --input node-a/history node-b/history --service orders",
    )
    p.add_argument("--input", "-i", nargs="+", required=True, metavar="PATH", type=Path,
                   help="history directories, data directories or segment files of every node")
    p.add_argument("--service", required=True, metavar="NAME",
                   help="the service (name, group@@name or namespace/group@@name)")
    p.add_argument("--ip", default="", help="only instances with this IP")
    p.add_argument("--since", default="", metavar="T",
                   help="only events at or after T (epoch ms, ISO 8601, or a span back from now: 15m, 2h)")
    _common(p, "history", inputs=False)
    p.set_defaults(func=_run_history)

    s = subparsers.add_parser(
        "simulate",
        help="model a Distro cluster at scale with Spark (ownership, verify, sync, movement; workers per node)",
        formatter_class=_FORMATTER,
        description=_doc("""
            Generate M synthetic ip:port clients across N nodes inside Spark partitions and compute,
            with the ownership kernel: clients per node; verify traffic per round (Nacos: one request
            per client per peer; Shoal: one digest request per peer, plus bucket lists for diverged
            clients); sync fan-out under churn (changes x (N-1)); clients moving on N -> N+1 and
            N -> N-1 for Nacos modulo hashing and a consistent-hash ring. The model and its constants
            are described in shoal.analytics.simulate.

            Writes ownership.parquet, rounds.parquet, node_rounds.parquet, movement.parquet,
            run.parquet (parameters, started_at, elapsed time), simulate.png and summary.txt (with
            elapsed time and clients/s).

            `shoal simulate workers ...` models nodes of several workers instead (see its --help).
        """),
        epilog="example: shoal simulate --nodes 1000 --clients 10000000 --churn 0.01   (writes report/simulate/)",
    )
    s.add_argument("--nodes", type=int, default=None, metavar="N", help="cluster members (2..64000; required)")
    s.add_argument("--clients", type=int, default=None, metavar="M", help="ip:port clients (required)")
    s.add_argument("--churn", type=float, default=0.01, metavar="R",
                   help="fraction of clients changing per round (default: 0.01)")
    s.add_argument("--rounds", type=int, default=5, metavar="K", help="verify rounds simulated (default: 5)")
    s.add_argument("--loss", type=float, default=0.001, metavar="P",
                   help="fraction of changes whose sync misses a peer (default: 0.001)")
    s.add_argument("--partitions", type=int, default=None, metavar="P",
                   help="Spark partitions for the clients (default: Spark's default parallelism)")
    s.add_argument("--seed", type=int, default=42, metavar="S", help="seed (default: 42)")
    s.add_argument("--vnodes", type=int, default=160, metavar="V",
                   help="virtual nodes per member on the consistent-hash ring (default: 160)")
    _common(s, "simulate", inputs=False)
    s.set_defaults(func=_run_simulate)
    models = s.add_subparsers(dest="model", metavar="MODEL", required=False)
    _register_workers(models)


def _register_workers(models: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = models.add_parser(
        "workers",
        help="nodes run as several worker processes: throughput, replication share, memory",
        formatter_class=_FORMATTER,
        description=_doc("""
            Model nodes run as N worker processes (a supervisor and N workers), each worker a Distro
            member with a full replica: a query costs q on one worker; a write costs r on its worker
            plus, for each of the other nodes x workers - 1 members, a sync send (s) and a receive +
            apply (a); every node gets the same load, spread over its min(workers, cores) busy
            cores. The per-operation costs and the memory per instance are measured on a real node
            (--inputs; the shipped figures and how they were measured: docs/workers-model.md). A
            Spark job sweeps every core
            count x workers 1..cores x write fraction (0, 0.01, 0.02, then to 1 in steps of 0.05)
            for the cluster and for one node alone, and for two alternatives: one replica per node
            with its writes spread over the cores, and one replica per node with one writer.

            Writes sweep.parquet, table.parquet (per core count: query-only, register-only and mixed
            rates, replication share, memory per worker and node), knees.parquet, inputs.json,
            run.parquet, simulate-workers.png and summary.txt (with whether one 8-core node reaches
            --target-queries and --target-registers).
        """),
        epilog="example: shoal simulate workers --nodes 3 --cores 8,16,32   (writes report/simulate-workers/)",
    )
    w.add_argument("--nodes", type=int, default=3, metavar="K", help="nodes in the cluster (default: 3)")
    w.add_argument("--cores", type=_int_list, default=(8, 16, 32), metavar="C,C,...",
                   help="cores per node, comma-separated (default: 8,16,32)")
    w.add_argument("--workers-per-node", type=_workers, default=None, metavar="auto|N",
                   help="workers per node in the table (default: auto, one per core)")
    w.add_argument("--write-fraction", type=float, default=0.25, metavar="F",
                   help="writes in the mixed load (default: 0.25, i.e. 40,000 registrations per 120,000 queries)")
    w.add_argument("--efficiency", type=float, default=1.0, metavar="E",
                   help="parallel efficiency of a node's cores, (0, 1] (default: 1, every core a whole core)")
    w.add_argument("--instances", type=_int_list, default=(100_000, 1_000_000), metavar="I,I,...",
                   help="instances in the cluster for the memory columns (default: 100000,1000000)")
    w.add_argument("--node-memory-gib", type=float, default=16.0, metavar="G",
                   help="a node's memory for the workers-that-fit figure (default: 16)")
    w.add_argument("--target-queries", type=float, default=120_000, metavar="Q",
                   help="queries/s one 8-core node should serve (default: 120000)")
    w.add_argument("--target-registers", type=float, default=40_000, metavar="R",
                   help="registrations/s one 8-core node should serve (default: 40000)")
    w.add_argument("--inputs", type=Path, default=None, metavar="FILE",
                   help="measured per-operation costs as JSON (default: the figures shipped with Shoal, "
                        "shoal/analytics/workers_inputs.json)")
    w.add_argument("--partitions", type=int, default=None, metavar="P",
                   help="Spark partitions for the sweep (default: Spark's default parallelism)")
    _common(w, "simulate-workers", inputs=False)
    w.set_defaults(func=_run_simulate_workers)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def _workers(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a whole number, got {text!r}") from None


# -- handlers ---------------------------------------------------------------------------------------


def _guarded(args: argparse.Namespace, body: Callable[[], int]) -> int:
    from shoal.export.reader import SnapshotError

    try:
        return body()
    except (SnapshotError, ValueError, FileExistsError) as exc:
        print(f"shoal {_name(args)}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _EXTRA_MODULES:
            raise
        print(f"shoal {_name(args)}: {exc.name} is not installed; install the analytics extra: "
              "pip install 'shoal[analytics]' (PySpark also needs a Java 17+ runtime)", file=sys.stderr)
        return EXIT_MISSING_EXTRA


def _name(args: argparse.Namespace) -> str:
    job = getattr(args, "job", None)
    model = getattr(args, "model", None)
    return f"analytics {job}" if job else f"simulate {model}" if model else "simulate"


def _print_summary(args: argparse.Namespace, path: Path) -> None:
    sys.stdout.write(path.read_text())
    sys.stdout.flush()
    if not args.quiet:
        from shoal.analytics.progress import status

        status(f"results in {path.parent}")


def _run_consistency(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import consistency
        from shoal.analytics.session import spark_session

        with spark_session(args.master, "shoal-consistency", dict(args.conf)) as spark:
            res = consistency.run(spark, args.input, args.out, first=args.first,
                                  keep_staging=args.keep_staging, show_progress=not args.quiet)
        _print_summary(args, res.outputs["summary"])
        if args.fail_on_diff and sum(res.counts.values()):
            return EXIT_DIFFERENCES
        return EXIT_OK

    return _guarded(args, body)


def _run_churn(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import churn
        from shoal.analytics.session import spark_session

        with spark_session(args.master, "shoal-churn", dict(args.conf)) as spark:
            res = churn.run(spark, args.input, args.out, bucket_s=args.bucket_seconds, top=args.top,
                            keep_staging=args.keep_staging, show_progress=not args.quiet)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def _run_balance(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import balance
        from shoal.analytics.session import spark_session

        with spark_session(args.master, "shoal-balance", dict(args.conf)) as spark:
            res = balance.run(spark, args.input, args.out, join_member=args.join_member, vnodes=args.vnodes,
                              keep_staging=args.keep_staging, show_progress=not args.quiet)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def _run_history(args: argparse.Namespace) -> int:
    def body() -> int:
        import time

        from shoal.analytics import history
        from shoal.analytics.session import spark_session
        from shoal.export.history_rows import parse_service, parse_time

        parse_service(args.service)  # before paying for a JVM
        since = parse_time(args.since, int(time.time() * 1000)) if args.since else 0
        history.find_segments(args.input)
        with spark_session(args.master, "shoal-history", dict(args.conf)) as spark:
            res = history.run(spark, args.input, args.out, service=args.service, ip=args.ip, since_ms=since)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def _run_simulate(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import simulate
        from shoal.analytics.session import spark_session

        missing = [f"--{name}" for name in ("nodes", "clients") if getattr(args, name) is None]
        if missing:
            raise ValueError(f"the following arguments are required: {', '.join(missing)} "
                             "(or a model: shoal simulate workers ...)")
        params = simulate.SimParams(
            nodes=args.nodes, clients=args.clients, churn=args.churn, rounds=args.rounds, loss=args.loss,
            seed=args.seed, vnodes=args.vnodes, partitions=args.partitions,
        )
        params.validate()  # before paying for a JVM
        with spark_session(args.master, "shoal-simulate", dict(args.conf)) as spark:
            res = simulate.run(spark, params, args.out, show_progress=not args.quiet)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def _run_simulate_workers(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import workers_model
        from shoal.analytics.session import spark_session

        params = workers_model.WorkersParams(
            nodes=args.nodes, cores=args.cores, workers=args.workers_per_node, write_fraction=args.write_fraction,
            efficiency=args.efficiency, instances=args.instances, node_memory_gib=args.node_memory_gib,
            target_queries=args.target_queries, target_registers=args.target_registers, partitions=args.partitions,
        )
        params.validate()  # before paying for a JVM
        inputs = workers_model.Inputs.load(args.inputs or workers_model.DEFAULT_INPUTS)
        with spark_session(args.master, "shoal-simulate-workers", dict(args.conf)) as spark:
            res = workers_model.run(spark, params, inputs, args.out, show_progress=not args.quiet)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shoal.analytics.cli analytics <job> ...`` / ``... simulate ...``."""
    parser = argparse.ArgumentParser(prog="shoal", description="Shoal analytics and simulation")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
