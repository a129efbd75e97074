"""The harness's worker count: SHOAL_TEST_WORKERS picks it for nodes that do not, and never reaches the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.testing import OPEN, ServerProcess
from shoal.testing.procs import WORKERS_ENV, default_workers


def test_the_default_is_one_worker_and_the_variable_changes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert default_workers() == 1
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert default_workers() == 2
    for bad in ("0", "two"):
        monkeypatch.setenv(WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=WORKERS_ENV):
            default_workers()


def test_a_node_takes_the_variable_unless_told_and_the_server_never_sees_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(WORKERS_ENV, "2")
    node = ServerProcess(1234, tmp_path, auth=OPEN)
    assert node.workers == 2 and node.args[node.args.index("--workers") + 1] == "2"
    assert WORKERS_ENV not in node.env  # a server refuses SHOAL_* names it does not know
    assert ServerProcess(1234, tmp_path, auth=OPEN, workers=1).workers == 1
    assert ServerProcess(1234, tmp_path, ["--workers", "3"], auth=OPEN).workers == 3  # the last --workers wins
