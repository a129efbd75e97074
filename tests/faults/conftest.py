"""Fault-suite fixtures: clusters and partitions that are always torn down, even on failure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoal.testing.faults import Partition, PartitionUnavailable, partitions_unavailable
from shoal.testing.nodes import FaultCluster


@pytest.fixture
def fault_cluster(tmp_path: Path) -> Iterator[Callable[..., FaultCluster]]:
    """Factory of :class:`FaultCluster`; every node (stopped ones included) is killed at teardown."""
    made: list[FaultCluster] = []

    def factory(size: int = 3, *base: str) -> FaultCluster:
        """``size`` nodes; ``base`` are `shoal server` arguments every node gets."""
        cluster = FaultCluster(tmp_path, size, base=base)
        made.append(cluster)
        return cluster

    yield factory
    for cluster in made:
        cluster.kill_all()


@pytest.fixture
def partition() -> Iterator[Partition]:
    """An iptables chain of this test's own; skipped where iptables or the kernel refuses."""
    part = Partition()
    try:
        part.open()
    except PartitionUnavailable as exc:
        part.close()
        partitions_unavailable(str(exc))
    try:
        yield part
    finally:
        part.close()
        left = [rule for rule in Partition.leftovers() if part.chain in rule]
        assert not left, f"iptables rules left behind: {left}"
