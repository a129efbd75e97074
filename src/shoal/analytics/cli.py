"""The ``shoal analytics <job>`` and ``shoal simulate`` subcommands.

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
    if inputs:
        p.add_argument("--keep-staging", action="store_true",
                       help="keep the Parquet copies of the snapshots under OUT/_staging")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``analytics`` (with ``consistency|churn|balance|history``) and ``simulate`` to ``subparsers``."""
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
        help="model a Distro cluster at scale with Spark (ownership, verify, sync, movement)",
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
        """),
        epilog="example: shoal simulate --nodes 1000 --clients 10000000 --churn 0.01   (writes report/simulate/)",
    )
    s.add_argument("--nodes", type=int, required=True, metavar="N", help="cluster members (2..64000)")
    s.add_argument("--clients", type=int, required=True, metavar="M", help="ip:port clients")
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
    return f"analytics {job}" if job else "simulate"


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

        with spark_session(args.master, "shoal-consistency") as spark:
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

        with spark_session(args.master, "shoal-churn") as spark:
            res = churn.run(spark, args.input, args.out, bucket_s=args.bucket_seconds, top=args.top,
                            keep_staging=args.keep_staging, show_progress=not args.quiet)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def _run_balance(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import balance
        from shoal.analytics.session import spark_session

        with spark_session(args.master, "shoal-balance") as spark:
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
        with spark_session(args.master, "shoal-history") as spark:
            res = history.run(spark, args.input, args.out, service=args.service, ip=args.ip, since_ms=since)
        _print_summary(args, res.outputs["summary"])
        return EXIT_OK

    return _guarded(args, body)


def _run_simulate(args: argparse.Namespace) -> int:
    def body() -> int:
        from shoal.analytics import simulate
        from shoal.analytics.session import spark_session

        params = simulate.SimParams(
            nodes=args.nodes, clients=args.clients, churn=args.churn, rounds=args.rounds, loss=args.loss,
            seed=args.seed, vnodes=args.vnodes, partitions=args.partitions,
        )
        params.validate()  # before paying for a JVM
        with spark_session(args.master, "shoal-simulate") as spark:
            res = simulate.run(spark, params, args.out, show_progress=not args.quiet)
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
