"""The analytics jobs on a real standalone Spark cluster (a master and two workers from PySpark's own
distribution, on loopback) give exactly the results of ``local[*]``, from the same unchanged CLI
command with only ``--master`` (and executor sizing) told apart, and the work ran on the workers.

One cluster serves the whole module (starting it costs seconds). A job is one :data:`JOBS` entry:
its CLI arguments, and what in its outputs legitimately differs between two runs (timings, the
master's URL). Each job runs in a process of its own, as an operator would run it.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from analytics_data import make_snapshots_for_every_job

from shoal.testing import SparkStandalone, spark_standalone
from shoal.testing.history import write_node_log

LOCAL = "local[*]"
#: Summary lines that say how long a run took: different on every run.
TIMING_LINES = (r"^elapsed: ",)


@dataclass(frozen=True)
class ClusterJob:
    """One analytics command as run on both masters."""

    app: str  #: the Spark application name the command uses (shoal-<job>)
    argv: tuple[str, ...]  #: the CLI arguments before --input/--out/--master
    takes_input: bool = True
    #: what --input gets: the snapshots every snapshot job reads, or two nodes' history logs
    history_input: bool = False
    #: per output table (file or directory name): columns that differ between runs by nature
    volatile_columns: dict[str, frozenset[str]] = field(default_factory=dict)
    #: summary.txt lines (regular expressions) that differ between runs by nature
    volatile_lines: tuple[str, ...] = TIMING_LINES
    #: whether summary.txt names the master the run used
    summary_names_master: bool = False


JOBS = [
    pytest.param(ClusterJob("shoal-consistency", ("analytics", "consistency", "--first", "200")), id="consistency"),
    pytest.param(ClusterJob("shoal-churn", ("analytics", "churn", "--bucket-seconds", "30", "--top", "50")),
                 id="churn"),
    pytest.param(ClusterJob("shoal-balance", ("analytics", "balance", "--vnodes", "40")), id="balance"),
    pytest.param(ClusterJob(
        "shoal-simulate",
        # --partitions fixed: the default (Spark's parallelism) differs between the two masters
        ("simulate", "--nodes", "7", "--clients", "10000", "--churn", "0.05", "--rounds", "3",
         "--partitions", "4", "--seed", "5"),
        takes_input=False,
        volatile_columns={"run.parquet": frozenset({"master", "started_at", "elapsed_s", "job_s", "rows_per_s"})},
        volatile_lines=(r"^spark: master ",),
        summary_names_master=True,
    ), id="simulate"),
    pytest.param(ClusterJob("shoal-history", ("analytics", "history", "--service", "orders"), history_input=True,
                            # the line naming the inputs ends with how long the job took
                            volatile_lines=(*TIMING_LINES, r"segment file\(s\), [0-9.]+ s$")),
                 id="history"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with spark_standalone(tmp_path_factory.mktemp("spark-standalone")) as standalone:
        yield standalone


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_snapshots_for_every_job(tmp_path_factory.mktemp("every-job"))


@pytest.fixture(scope="module")
def history_inputs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two nodes' history logs, written by the nodes' own history code."""
    root = tmp_path_factory.mktemp("history-logs")
    asyncio.run(write_node_log(root / "a" / "history", "10.0.0.1:8848", 1_800_000_000_000, expire=False))
    asyncio.run(write_node_log(root / "b" / "history", "10.0.0.2:8848", 1_800_000_060_000, expire=True))
    return [root / "a", root / "b"]


def start_cli(job: ClusterJob, master: str, out: Path, inputs: Path | list[Path],
              extra: Sequence[str] = ()) -> subprocess.Popen[str]:
    """Start the job's command in a process of its own, as an operator runs it."""
    argv = [sys.executable, "-m", "shoal.analytics.cli", *job.argv, "--master", master, "--out", str(out), "-q",
            *extra]
    if job.takes_input:
        argv += ["--input", *map(str, inputs if isinstance(inputs, list) else [inputs])]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> None:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args))} exited {proc.returncode}:\n{err[-4000:]}"


def outputs(out: Path, job: ClusterJob) -> dict[str, Any]:
    """Every table of a result directory as rows (volatile columns dropped), and its summary."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("*.parquet")):
        table = pq.read_table(path)
        keep = [c for c in table.column_names if c not in job.volatile_columns.get(path.name, ())]
        tables[path.name] = table.select(keep).to_pylist()
    volatile = re.compile("|".join(job.volatile_lines), re.MULTILINE)
    summary = [line for line in (out / "summary.txt").read_text().splitlines() if not volatile.search(line)]
    return {"tables": tables, "summary": summary}


@pytest.mark.parametrize("job", JOBS)
def test_job_on_a_standalone_cluster_gives_the_results_of_local_mode(
    job: ClusterJob, cluster: SparkStandalone, inputs: Path, history_inputs: list[Path], tmp_path: Path
) -> None:
    given: Path | list[Path] = history_inputs if job.history_input else inputs
    seen = {a["id"] for a in cluster.applications()}
    # side by side: much of each run is waiting (JVM start, executors registering), not computing
    local_run = start_cli(job, LOCAL, tmp_path / "local", given)
    cluster_run = start_cli(job, cluster.master_url, tmp_path / "cluster", given, cluster.conf_args())
    finish(local_run)
    finish(cluster_run)

    # it ran on the cluster: the master lists one new application, finished, and each worker ran
    # an executor of it (its work directory), so the tasks were spread over both workers' JVMs
    new = [a for a in cluster.applications() if a["id"] not in seen]
    assert [(a["name"], a["state"]) for a in new] == [(job.app, "FINISHED")], cluster.logs()
    executors = cluster.executors_of(new[0]["id"])
    assert sorted(executors) == [0, 1] and all(len(ids) == 1 for ids in executors.values()), executors

    local, remote = outputs(tmp_path / "local", job), outputs(tmp_path / "cluster", job)
    assert local["tables"] and set(remote["tables"]) == set(local["tables"])
    for name, rows in local["tables"].items():
        assert remote["tables"][name] == rows, f"{name} differs between {LOCAL} and the cluster"
    assert any(rows for rows in local["tables"].values())
    assert remote["summary"] == local["summary"]
    if job.summary_names_master:  # the master a run used is in its summary
        text = (tmp_path / "cluster" / "summary.txt").read_text()
        assert cluster.master_url in text and LOCAL not in text


def test_a_running_session_is_never_silently_reused_for_another_master(cluster: SparkStandalone) -> None:
    """In one process, a command naming another master than the running session's is refused (the
    CLI's bad-input exit) instead of running the job on the session it happened to find."""
    code = """
import sys
from shoal.analytics import cli
from shoal.analytics.session import build_session
build_session("local[1]", "shoal-already-running", driver_memory="1g")
sys.exit(cli.main(["simulate", "--nodes", "3", "--clients", "100", "--out", sys.argv[2], "-q",
                   "--master", sys.argv[1]]))
"""
    seen = {a["id"] for a in cluster.applications()}
    proc = subprocess.run([sys.executable, "-c", code, cluster.master_url, str(Path(cluster.root) / "refused")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"a Spark session on local[1] already runs in this process; it cannot also run on {cluster.master_url}" \
        in proc.stderr
    assert {a["id"] for a in cluster.applications()} == seen
