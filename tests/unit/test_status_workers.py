"""``shoal status`` on a cluster of nodes of workers: one line per node, its workers' states,
and a worker that is not UP makes the node degraded (issue 21)."""

from __future__ import annotations

from shoal.distro.members import MemberManager, NodeLayout
from shoal.status_cli import healthy, member_row, render
from shoal.transport.http.forward import MemberList
from shoal.workers.placement import WorkerPlacement


def _info(manager: MemberManager) -> dict[str, object]:
    """What ``collect`` gathers, with the member list this worker's node list answers."""
    return {"addr": "10.9.0.1:8848", "status": "UP", "ready": True, "readiness": "", "counts": {},
            "server": {"version": "shoal", "standalone_mode": "cluster", "auth_enabled": "false"},
            "members": [member_row(m) for m in MemberList(manager.nodes).members()]}


def test_status_lists_the_nodes_with_their_workers_and_a_down_worker_is_degraded() -> None:
    manager = MemberManager.from_list([("10.9.0.1", 8848), ("10.9.0.2", 8848)], 8848, lambda: 0,
                                      self_ip="10.9.0.1", placement=WorkerPlacement(0, (9100, 9102)))
    manager.learn(NodeLayout("10.9.0.2:9100", "10.9.0.2:8848", (9100, 9102)))
    info = _info(manager)
    text = render(info)
    assert "members (2: 2 UP)" in text and healthy(info)
    assert "10.9.0.2:8848" in text and "2 workers: 10.9.0.2:9100 UP, 10.9.0.2:9102 UP" in text
    manager.report_failed("10.9.0.2:9102", refused=True)
    info = _info(manager)
    assert "10.9.0.2:9102 DOWN" in render(info) and not healthy(info)
