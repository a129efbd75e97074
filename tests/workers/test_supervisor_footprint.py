"""A node's supervisor stays small (issue 21): it starts, restarts and stops workers, so it loads
none of the server's compiled modules (transports, Arrow, bcrypt, the kernels), standalone or in a
cluster (where it checks the member list as its workers will)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shoal.testing import OPEN, NodeCluster, ServerProcess
from shoal.testing.workers import mapped_libraries, server_libraries

pytestmark = pytest.mark.integration


def _supervisor_pid(node: ServerProcess) -> int:
    state = node.workers_state()
    assert state is not None, "no workers.json"
    assert state["supervisor"] == node.pid
    return node.pid


def test_a_standalone_supervisor_loads_no_server_module(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    pid = _supervisor_pid(node)
    assert any("uvloop" in path for path in mapped_libraries(pid))  # the maps are read: its loop is there
    assert server_libraries(pid) == []
    for worker in node.worker_pids():  # the same check sees what a worker loads
        assert server_libraries(worker), f"worker {worker} maps none of {mapped_libraries(worker)}"


def test_a_clustered_supervisor_loads_no_server_module(tmp_path: Path) -> None:
    with NodeCluster(tmp_path, 2, ["-D", "shoal.cp.mode=embedded"], auth=OPEN, workers=2) as cluster:
        cluster.start_all()
        for node in cluster.all():
            node.wait_workers()
            assert server_libraries(_supervisor_pid(node)) == []
