"""Two nodes of two workers start together without a refused call (issue 21): a worker's cluster
requests name its node and workers, so a process its node's member report has not reached yet
admits its first snapshot load instead of answering 403 "not a member" until a report comes."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.testing import OPEN, NodeCluster, ServerProcess, call
from shoal.testing.procs import metric_sum
from shoal.testing.workers import every_worker

pytestmark = pytest.mark.integration

ROUNDS = 3  # a refusal needed a load to reach a worker no report had reached: a race, so three starts


def _cluster_requests(node: ServerProcess, index: int, **labels: str) -> float:
    status, text = call("GET", node.worker_url(index, "/nacos/actuator/prometheus"), timeout=3.0)
    assert status == 200, text
    return metric_sum(text, "shoal_requests_total", transport="cluster", **labels)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_no_worker_refuses_another_nodes_worker_while_they_start(tmp_path: Path, round_: int) -> None:
    with NodeCluster(tmp_path, 2, ["-D", "shoal.cp.mode=embedded"], auth=OPEN, workers=2) as cluster:
        cluster.start_all()  # ready: every worker answers ready on its private port, its snapshot loaded
        workers = every_worker(cluster.all())
        loads = sum(_cluster_requests(node, i, type="DistroSnapshotRequest", code="200") for node, i in workers)
        refused = {f"{node.port}/{i}": _cluster_requests(node, i, code="403") for node, i in workers}
        assert loads >= 1, "no snapshot was loaded"
        assert sum(refused.values()) == 0, refused
