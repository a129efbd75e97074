"""A managed-etcd cluster started and stopped together raises no false alarm.

Three real nodes, each with its managed etcd member (the default CP mode of a cluster). While
the members start, a node's seven CP views cannot read yet: that is said once, at INFO, never as
a WARNING per view and retry. Then all three get SIGTERM at the same moment: the etcd leader
hands over to peers that are stopping too, which used to hold one node past its 5 s stop budget
("graceful stop took longer than 5 s", exit 1). Every node now exits 0 within it.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing import OPEN
from shoal.testing.nodes import CpCluster

pytestmark = pytest.mark.faults

_CP_WARNING = re.compile(r"^\S+ \S+ WARNING\s+shoal\.cp\.store: .*$", re.MULTILINE)


@pytest.fixture
def cp_cluster(tmp_path: Path) -> Iterator[CpCluster]:
    cluster = CpCluster(tmp_path, 3, auth=OPEN)
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_a_cluster_started_and_stopped_together_raises_no_false_alarm(cp_cluster: CpCluster) -> None:
    cp_cluster.start_all()
    nodes = [cp_cluster.node(i) for i in range(3)]
    for node in nodes:
        assert node.alive()
    for node in nodes:
        os.kill(node.proc.pid, signal.SIGTERM)
    codes = [node.proc.wait(30) for node in nodes]
    logs = [node.log() for node in nodes]
    warnings = [_CP_WARNING.findall(text) for text in logs]
    waiting = [text.count("CP store not readable yet") for text in logs]
    late = [text.count("graceful stop took longer") for text in logs]
    print(f"start and stop: CP warnings per node {[len(w) for w in warnings]}, 'not readable yet' per node "
          f"{waiting}, exit codes {codes}, late stops {late}")
    assert warnings == [[], [], []]
    assert all(n <= 1 for n in waiting)
    assert codes == [0, 0, 0] and late == [0, 0, 0]
