"""The ``analytics`` / ``simulate`` subcommands: help texts, argument errors, and end-to-end runs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest
from analytics_data import instance_row

from shoal.analytics import cli
from shoal.export.reader import read_snapshot
from shoal.export.writer import write_snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

A, B = "10.0.0.1:8848", "10.0.0.2:8848"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["analytics", "consistency", "--help"], "Agreement ratio"),
        (["analytics", "churn", "--help"], "--bucket-seconds"),
        (["analytics", "balance", "--help"], "--join-member"),
        (["simulate", "--help"], "--clients M"),
        (["simulate", "workers", "--help"], "--workers-per-node auto|N"),
    ],
)
def test_help_texts(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert expected in out and "--out DIR" in out and "--master URL" in out


def test_module_entry_point_and_register_into_a_foreign_parser() -> None:
    proc = subprocess.run([sys.executable, "-m", "shoal.analytics.cli", "analytics", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "consistency" in proc.stdout and "balance" in proc.stdout
    parser = argparse.ArgumentParser(prog="shoal")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("server")
    cli.register(sub)
    args = parser.parse_args(["simulate", "--nodes", "3", "--clients", "10", "--out", "x"])
    assert args.func is not None and args.nodes == 3 and args.churn == 0.01 and args.master is None
    with pytest.raises(SystemExit):
        parser.parse_args(["analytics", "consistency", "--out", "x"])  # --input is required


def test_bad_simulation_parameters_fail_before_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["simulate", "--nodes", "1", "--clients", "10", "--out", str(tmp_path)])
    assert code == cli.EXIT_BAD_INPUT
    assert "--nodes must be >= 2" in capsys.readouterr().err


def test_missing_snapshots_are_a_clear_error(spark: SparkSession, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code = cli.main(["analytics", "churn", "-q", "--input", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert code == cli.EXIT_BAD_INPUT
    assert "no snapshot directories" in capsys.readouterr().err


def test_consistency_end_to_end_names_the_injected_difference(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = []
    for i in range(40):
        ident = ("public", "DEFAULT_GROUP", f"orders-{i % 4}", "DEFAULT", f"10.4.0.{i}", 8080)
        rows.append(instance_row(ident, (1.0, True, True, (("v", "1"),)), A if i % 2 else B, 1, f"c{i}"))
    changed = list(rows)
    # the one injected difference: node B's copy of 10.4.0.13:8080 (owned by A) has another weight
    changed[13] = instance_row(rows[13][:6], (3.0, True, True, (("v", "1"),)), A, 1, "c13")
    write_snapshot(tmp_path / "exports", A, 1_700_000_000_000, instances=rows)
    write_snapshot(tmp_path / "exports", B, 1_700_000_000_400, instances=changed)
    assert read_snapshot(next((tmp_path / "exports").iterdir()))["instances"].num_rows == 40

    out = tmp_path / "report"
    code = cli.main(["analytics", "consistency", "--input", str(tmp_path / "exports"), "--out", str(out),
                     "--fail-on-diff"])
    assert code == cli.EXIT_DIFFERENCES
    printed = capsys.readouterr()
    summary = (out / "summary.txt").read_text()
    assert printed.out == summary
    assert ("public/DEFAULT_GROUP/orders-1 cluster DEFAULT 10.4.0.13:8080 on node 10.0.0.2:8848: "
            "different weight 3.0 vs 1.0 (reference: owner 10.0.0.1:8848)") in summary
    assert "differences: 1 (missing 0, extra 0, different 1)" in summary
    assert "agreement ratio 0.975000" in summary
    assert "[shoal] staging snapshots" in printed.err  # progress went to stderr, not stdout
    diffs = pq.read_table(out / "diffs.parquet").to_pylist()
    assert [(d["ip"], d["port"], d["node"], d["differs"]) for d in diffs] == [("10.4.0.13", 8080, B, "weight")]
    assert pq.read_table(out / "per_service_node.parquet").num_rows == 8  # 4 services x 2 nodes
    assert (out / "consistency.png").stat().st_size > 1000
    assert spark.sparkContext._jsc is not None  # the shared session was not stopped by the command


def test_simulate_end_to_end(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    code = cli.main(["simulate", "--nodes", "5", "--clients", "2000", "--churn", "0.05", "--rounds", "2",
                     "--partitions", "2", "--out", str(out), "-q"])
    assert code == cli.EXIT_OK
    assert "clients/s" in capsys.readouterr().out
    for name in ("ownership", "rounds", "node_rounds", "movement", "run"):
        assert pq.read_table(out / f"{name}.parquet").num_rows > 0
    run = pq.read_table(out / "run.parquet").to_pylist()[0]
    assert run["clients"] == 2000 and run["partitions"] == 2 and run["rows_per_s"] > 0
    assert sum(pq.read_table(out / "ownership.parquet")["owned"].to_pylist()) == 2000
    assert (out / "simulate.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_without_a_model_still_needs_nodes_and_clients(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--nodes", "3"]) == cli.EXIT_BAD_INPUT
    assert "required: --clients" in capsys.readouterr().err


def test_bad_workers_model_input_fails_before_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inputs.json").write_text('{"inputs": {}}')
    code = cli.main(["simulate", "workers", "--inputs", str(tmp_path / "inputs.json"), "--out", str(tmp_path / "o")])
    assert code == cli.EXIT_BAD_INPUT
    assert "query_us" in capsys.readouterr().err
    code = cli.main(["simulate", "workers", "--write-fraction", "2", "--out", str(tmp_path / "o")])
    assert code == cli.EXIT_BAD_INPUT
    assert "--write-fraction must be in [0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["simulate", "workers", "--cores", "8,x"])
    assert "comma-separated whole numbers" in capsys.readouterr().err


def test_simulate_workers_end_to_end(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shoal.analytics import workers_model as wm

    # the hand case of test_workers_model: q 40, r 30, send 10 + apply 20 µs, 50 MiB idle, 2,000 B/instance
    hand = wm.Inputs(query_us=40.0, register_us=30.0, sync_send_us=10.0, sync_apply_us=20.0,
                     idle_rss_bytes=50 * 2**20, bytes_per_instance=2000.0, measured_instances=100_000)
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps(hand.to_json()))
    out = tmp_path / "workers"
    code = cli.main(["simulate", "workers", "--nodes", "3", "--cores", "8,16", "--inputs", str(inputs),
                     "--partitions", "2", "--out", str(out), "-q"])
    assert code == cli.EXIT_OK
    printed = capsys.readouterr().out
    assert printed == (out / "summary.txt").read_text()
    params = wm.WorkersParams(nodes=3, cores=(8, 16))
    sweep = pq.read_table(out / "sweep.parquet").to_pylist()
    assert len(sweep) == len(wm.grid(params))
    for row in sweep[::37]:
        assert row["node_ops_per_s"] == pytest.approx(wm.node_ops_per_s(
            hand, row["nodes"], row["cores"], row["workers"], row["write_fraction"], scheme=row["scheme"]))
    table = {(r["scheme"], r["nodes"], r["cores"]): r for r in pq.read_table(out / "table.parquet").to_pylist()}
    assert len(table) == 3 * 2 * 2  # schemes x {alone, 3 nodes} x core counts
    eight = table[("worker", 3, 8)]
    assert (eight["workers"], eight["members"]) == (8, 24)
    assert eight["query_per_s"] == pytest.approx(200_000)
    assert eight["register_per_s"] == pytest.approx(8e6 / 720)
    assert eight["mixed_per_s"] == pytest.approx(8e6 / 210)
    assert eight["replication_share_register"] == pytest.approx(690 / 720)
    assert eight["worker_rss_bytes_1000000"] == 50 * 2**20 + 2_000_000_000
    assert table[("node", 3, 16)]["register_per_s"] == pytest.approx(16e6 / 90)
    knees = {(r["scheme"], r["nodes"], r["cores"], r["load"]): r
             for r in pq.read_table(out / "knees.parquet").to_pylist()}
    assert knees[("worker", 3, 8, "query")]["knee_workers"] is None
    assert knees[("worker", 3, 8, "register")]["knee_workers"] == 1
    assert "queries 200.0k/s (met), registrations 11.1k/s (NOT met)" in printed
    assert "send + apply would need <= 7.4 µs per record (measured 30.0)" in printed
    # one replica per node with one writer: 10^6 / (3 x 20 µs) registrations per node
    assert "replica per node-single-writer, 8 workers: queries 200.0k/s (met), registrations 16.7k/s" in printed
    assert "the writer's apply would need <= 8.3 µs per record (measured 20.0)" in printed
    assert "8 at 1M instances" in printed  # full-replica workers that fit in 16 GiB
    assert json.loads((out / "inputs.json").read_text()) == hand.to_json()
    assert pq.read_table(out / "run.parquet").to_pylist()[0]["configurations"] == len(sweep)
    assert (out / "simulate-workers.png").read_bytes()[:4] == b"\x89PNG"
    # its own directory: the Distro simulation's directory is refused
    sim_dir = tmp_path / "sim"
    (sim_dir).mkdir()
    (sim_dir / ".shoal-job").write_text("simulate\n")
    assert cli.main(["simulate", "workers", "--inputs", str(inputs), "--out", str(sim_dir), "-q"]) == cli.EXIT_BAD_INPUT


def test_missing_analytics_extra_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # as if pyspark were not installed
    code = cli.main(["simulate", "--nodes", "3", "--clients", "10", "--out", str(tmp_path)])
    assert code == cli.EXIT_MISSING_EXTRA
    assert "pip install 'shoal[analytics]'" in capsys.readouterr().err


def test_spark_settings_and_masters_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    from shoal.analytics.session import on_this_machine

    parser = argparse.ArgumentParser(prog="shoal")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", "--nodes", "3", "--clients", "10", "--conf", "spark.executor.memory=512m",
                              "--conf", "spark.x=a=b"])
    assert dict(args.conf) == {"spark.executor.memory": "512m", "spark.x": "a=b"}
    for bad in ("executor.memory=1g", "spark.executor.memory"):
        with pytest.raises(SystemExit):
            parser.parse_args(["simulate", "--nodes", "3", "--clients", "10", "--conf", bad])
        assert f"expected spark.KEY=VALUE, got '{bad}'" in capsys.readouterr().err
    assert all(map(on_this_machine, ["local[*]", "local", "spark://127.0.0.1:7077", "spark://localhost:7077",
                                     "spark://127.0.0.1:7077,127.0.0.2:7078", "spark://[::1]:7077"]))
    assert not any(map(on_this_machine, ["spark://10.0.0.5:7077", "spark://127.0.0.1:7077,10.0.0.5:7077",
                                         "yarn", "k8s://https://127.0.0.1:6443"]))
