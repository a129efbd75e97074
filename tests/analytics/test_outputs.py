"""What an operator gets from a job: a directory per job, timestamps as timestamps, charts that say
what they show (also when there is nothing to show), progress that reaches its total, and help
texts naming only flags that exist."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analytics_data import NODES, instance_row, make_balance_snapshots, make_events
from PIL import Image

from shoal.analytics import churn, cli, consistency, report, simulate
from shoal.export.writer import write_snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
TAB_RED, TAB_BLUE = (214, 39, 40), (31, 119, 180)  # matplotlib's colours of "missing" and "different"


def _snapshots_of_everything(root: Path) -> Path:
    """Three nodes' snapshots holding instances, clients and change events (input for every job)."""
    data = make_balance_snapshots(root / "scratch")
    for i, node in enumerate(NODES):
        write_snapshot(root / "in", node, T0 + 60_000 + i, clients=data["clients"][node],
                       instances=data["instances"][node], events=make_events(i + 1, 60, T0))
    return root / "in"


def test_each_job_writes_its_own_directory_and_never_another_jobs(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = _snapshots_of_everything(tmp_path)
    monkeypatch.chdir(tmp_path)
    summaries = {}
    for job in ("consistency", "churn", "balance"):
        assert cli.main(["analytics", job, "-q", "--input", str(inputs)]) == cli.EXIT_OK
        summaries[job] = capsys.readouterr().out
    produced = {job: {p.name for p in (tmp_path / "report" / job).iterdir()} for job in summaries}
    assert {"consistency.png", "diffs.parquet", "services.parquet", "summary.txt"} <= produced["consistency"]
    assert {"churn.png", "service_buckets.parquet", "flapping.parquet", "summary.txt"} <= produced["churn"]
    assert {"balance.png", "movement.parquet", "skew.parquet", "summary.txt"} <= produced["balance"]
    for job, printed in summaries.items():  # each summary survived the jobs that ran after it
        assert (tmp_path / "report" / job / "summary.txt").read_text() == printed
    assert len(set(summaries.values())) == 3

    # pointing a job at another job's directory is refused, and that directory is left as it was
    before = {p.name: p.read_bytes() for p in (tmp_path / "report" / "churn").iterdir() if p.is_file()}
    code = cli.main(["analytics", "balance", "-q", "--input", str(inputs), "--out", "report/churn"])
    assert code == cli.EXIT_BAD_INPUT
    assert "report/churn" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in (tmp_path / "report" / "churn").iterdir() if p.is_file()}
    assert after == before


def test_job_directory_is_claimed_by_one_job(tmp_path: Path) -> None:
    assert report.job_dir(tmp_path / "a", "churn") == tmp_path / "a"
    assert report.job_dir(tmp_path / "a", "churn") == tmp_path / "a"  # a rerun may replace its own results
    with pytest.raises(FileExistsError):
        report.job_dir(tmp_path / "a", "balance")
    # a directory written before the claim existed is recognised by its chart
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "consistency.png").write_bytes(b"\x89PNG")
    with pytest.raises(FileExistsError):
        report.job_dir(tmp_path / "old", "simulate")
    assert report.job_dir(tmp_path / "old", "consistency") == tmp_path / "old"


def test_points_in_time_are_parquet_timestamps(spark: SparkSession, tmp_path: Path) -> None:
    write_snapshot(tmp_path / "in", NODES[0], T0 + 1, events=make_events(5, 80, T0))
    res = churn.run(spark, [tmp_path / "in"], tmp_path / "churn", bucket_s=60, show_progress=False)
    sim = simulate.run(spark, simulate.SimParams(nodes=3, clients=300, rounds=1, partitions=1), tmp_path / "sim",
                       show_progress=False)
    utc_ms = pa.timestamp("ms", tz="UTC")
    columns = [(res.outputs["service_buckets"], "bucket_start"), (res.outputs["flapping"], "first_at"),
               (res.outputs["flapping"], "last_at"), (sim.outputs["run"], "started_at")]
    for path, column in columns:
        assert pq.read_schema(path).field(column).type == utc_ms, column
        physical = pq.ParquetFile(path).schema
        logical = json.loads(physical.column(physical.names.index(column)).logical_type.to_json())
        assert (logical["Type"], logical["isAdjustedToUTC"], logical["timeUnit"]) == (
            "Timestamp", True, "milliseconds"), logical
        assert spark.read.parquet(str(path)).schema[column].dataType.typeName() == "timestamp", column
    assert not [name for name in pq.read_schema(res.outputs["service_buckets"]).names if name.endswith("_ms")]
    buckets = pq.read_table(res.outputs["service_buckets"]).column("bucket_start").to_pylist()
    assert min(buckets) == datetime.fromtimestamp(T0 // 60_000 * 60, tz=UTC)
    started = pq.read_table(sim.outputs["run"]).column("started_at")[0].as_py()
    assert started == datetime.fromtimestamp(sim.started_at_ms / 1000, tz=UTC)


def _pixels(path: Path, rgb: tuple[int, int, int]) -> int:
    with Image.open(path) as img:
        return int(np.all(np.asarray(img.convert("RGB")) == rgb, axis=-1).sum())


def test_identical_snapshots_chart_says_no_differences(spark: SparkSession, tmp_path: Path) -> None:
    rows = [instance_row(("public", "DEFAULT_GROUP", f"svc-{i % 3}", "DEFAULT", f"10.4.0.{i}", 8080),
                         (1.0, True, True, ()), NODES[i % 2], 1, f"c{i}") for i in range(12)]
    write_snapshot(tmp_path / "same", NODES[0], T0, instances=rows)
    write_snapshot(tmp_path / "same", NODES[1], T0 + 250, instances=rows)
    changed = list(rows)
    changed[3] = instance_row(rows[3][:6], (2.0, True, True, ()), NODES[1], 1, "c3")
    write_snapshot(tmp_path / "diff", NODES[0], T0, instances=rows)
    write_snapshot(tmp_path / "diff", NODES[1], T0 + 250, instances=changed)

    same = consistency.run(spark, [tmp_path / "same"], tmp_path / "out-same", show_progress=False)
    diff = consistency.run(spark, [tmp_path / "diff"], tmp_path / "out-diff", show_progress=False)
    assert sum(same.counts.values()) == 0 and diff.counts["different"] == 1

    with Image.open(same.outputs["chart"]) as img:
        text = dict(img.text)  # the PNG text chunks
    assert "no differences" in text["Description"]
    # the title names the snapshots and when they were taken
    for expected in (NODES[0], NODES[1], "2023-11-14", "22:13:20.000", "22:13:20.250"):
        assert expected in text["Title"], expected
    # no bars drawn on an empty axis, while the chart of a real difference has them
    assert _pixels(same.outputs["chart"], TAB_BLUE) == 0 and _pixels(same.outputs["chart"], TAB_RED) == 0
    assert _pixels(diff.outputs["chart"], TAB_BLUE) > 100
    with Image.open(diff.outputs["chart"]) as img:
        assert "Description" not in img.text


_LINE = re.compile(r"^\[shoal\] churn: (\d+)% (\d+)/(\d+) steps (.*) \(")


def test_progress_moves_step_by_step_to_the_total(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_snapshot(tmp_path / "in", NODES[0], T0 + 1, events=make_events(9, 100, T0))
    write_snapshot(tmp_path / "in", NODES[1], T0 + 2, events=make_events(10, 100, T0))
    capsys.readouterr()
    churn.run(spark, [tmp_path / "in"], tmp_path / "out", show_progress=True)
    lines = capsys.readouterr().err.splitlines()
    steps = [m.groups() for m in map(_LINE.match, lines) if m]
    total = len(churn.STEPS)
    assert {int(t) for _, _, t, _ in steps} == {total}
    done = [int(d) for _, d, _, _ in steps]
    assert done == sorted(done) and set(range(1, total + 1)) <= set(done)  # every step, in order
    assert steps[-1][0] == "100"
    # a finished Spark step shows all of its tasks done
    tasks = [re.search(r"done: (\d+)/(\d+) tasks", detail) for *_, detail in steps]
    counted = [(int(m.group(1)), int(m.group(2))) for m in tasks if m]
    assert counted and all(d == t > 0 for d, t in counted)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                texts += _help_texts(sub)
    return texts


def test_help_names_only_flags_that_exist() -> None:
    from shoal.__main__ import build_parser

    shoal = build_parser()
    real = _options(shoal)
    assert "--export-dir" not in real
    parser = argparse.ArgumentParser(prog="shoal")
    cli.register(parser.add_subparsers(dest="command"))
    named = {flag for text in _help_texts(parser) for flag in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", text)}
    assert "--out" in named and "-D" in named
    assert named <= real | {"-h", "--help"}, named - real
