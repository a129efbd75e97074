"""``shoal analytics history`` on real local Spark: the logs of two nodes, written by the nodes' own
history code, read back as one lifecycle in time order across the nodes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from shoal.analytics import cli
from shoal.testing.history import HISTORY_SERVICE, write_node_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SERVICE = HISTORY_SERVICE


async def test_lifecycle_across_two_nodes(spark: SparkSession, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    await write_node_log(tmp_path / "a" / "history", "10.0.0.1:8848", 1_800_000_000_000, expire=False)
    await write_node_log(tmp_path / "b" / "history", "10.0.0.2:8848", 1_800_000_060_000, expire=True)
    out = tmp_path / "report"
    code = cli.main(["analytics", "history", "-q", "--input", str(tmp_path / "a"), str(tmp_path / "b"),
                     "--service", "orders", "--ip", "10.0.0.9", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    steps = [line.strip() for line in text.splitlines() if line.startswith("  ")]
    assert [s.split(" ", 1)[0] for s in steps] == ["registered", "deregistered", "registered", "expired"]
    assert "on node 10.0.0.1:8848" in steps[0] and "on node 10.0.0.2:8848" in steps[2]
    assert "expired at 2027-01-15 08:01:05.000Z: no beat for 30 s" in steps[3]
    assert "4 events of orders 10.0.0.9 from 2 node(s)" in text
    table = pq.read_table(out / "lifecycle.parquet")
    assert table.column("kind").to_pylist() == ["register", "deregister", "register", "expire"]


def test_no_segments_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code = cli.main(["analytics", "history", "-q", "--input", str(tmp_path / "empty"), "--service", "orders",
                     "--out", str(tmp_path / "o")])
    assert code == 1
    assert "no history segments" in capsys.readouterr().err
