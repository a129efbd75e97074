"""Members of nodes of workers: a worker's own node is its workers from the start, another node
is its workers once a report says so, and the per-node view sums them up (issue 21)."""

from __future__ import annotations

import json

import pytest

from shoal.distro.bodies import report_request
from shoal.distro.members import MemberManager, MemberState, NodeLayout, parse_report
from shoal.errors import BadRequestBody
from shoal.workers.placement import WorkerPlacement

NODES = [("10.9.0.1", 8848), ("10.9.0.2", 8848), ("10.9.0.3", 8848)]


def _worker_of_node_1(index: int = 0) -> MemberManager:
    """Worker ``index`` of 10.9.0.1:8848, which runs two workers on private ports 9100 and 9102."""
    return MemberManager.from_list(NODES, 8848, lambda: 0, self_ip="10.9.0.1",
                                   placement=WorkerPlacement(index, (9100, 9102)))


def _states(manager: MemberManager) -> dict[str, str]:
    return {m.address: m.state.value for m in manager.nodes()}


def test_a_worker_is_its_private_port_and_its_siblings_are_members_from_the_start() -> None:
    manager = _worker_of_node_1(1)
    assert manager.self_address == "10.9.0.1:9102" and manager.self_node_address == "10.9.0.1:8848"
    # the sibling at once; the other nodes under their node addresses until they report
    assert sorted(manager.peers) == ["10.9.0.1:9100", "10.9.0.2:8848", "10.9.0.3:8848"]
    assert manager.healthy_addresses() == ["10.9.0.1:9100", "10.9.0.1:9102", "10.9.0.2:8848", "10.9.0.3:8848"]
    assert manager.node_of("10.9.0.1:9100") == "10.9.0.1:8848"
    nodes = manager.nodes()
    assert [m.address for m in nodes] == ["10.9.0.1:8848", "10.9.0.2:8848", "10.9.0.3:8848"]
    own = manager.self_node_member().to_nacos()
    assert own["address"] == "10.9.0.1:8848" and own["state"] == "UP"
    assert own["extendInfo"]["workers"] == "2"
    assert own["extendInfo"]["workerStates"] == "10.9.0.1:9100=UP,10.9.0.1:9102=UP"


def test_a_process_that_is_not_a_worker_is_as_before() -> None:
    manager = MemberManager.from_list(NODES, 8848, lambda: 0, self_ip="10.9.0.3")
    assert manager.self_address == manager.self_node_address == "10.9.0.3:8848"
    assert sorted(manager.peers) == ["10.9.0.1:8848", "10.9.0.2:8848"]
    assert [m.address for m in manager.nodes()] == ["10.9.0.1:8848", "10.9.0.2:8848", "10.9.0.3:8848"]


def test_a_node_of_workers_with_no_member_list_is_alone_with_its_workers() -> None:
    manager = MemberManager.from_list([], 8848, lambda: 0, placement=WorkerPlacement(0, (9100, 9102, 9104)))
    assert manager.self_address == "127.0.0.1:9100" and manager.is_clustered()
    assert sorted(manager.peers) == ["127.0.0.1:9102", "127.0.0.1:9104"]
    assert [m.address for m in manager.nodes()] == ["127.0.0.1:8848"]


def test_a_report_replaces_a_node_by_its_workers_and_a_single_process_node_stays_itself() -> None:
    manager = _worker_of_node_1()
    changes: list[int] = []
    manager.listeners.append(lambda: changes.append(1))
    assert manager.learn(NodeLayout("10.9.0.2:9100", "10.9.0.2:8848", (9100, 9102)))
    assert sorted(manager.peers) == ["10.9.0.1:9102", "10.9.0.2:9100", "10.9.0.2:9102", "10.9.0.3:8848"]
    assert manager.node_of("10.9.0.2:9102") == "10.9.0.2:8848" and changes == [1]
    assert manager.workers_of("10.9.0.2:8848") == (9100, 9102)
    # the same layout again (every report round, a restarted worker) changes nothing
    manager.report_failed("10.9.0.2:9102", refused=True)
    assert not manager.learn(NodeLayout("10.9.0.2:9102", "10.9.0.2:8848", (9100, 9102)))
    assert manager.peers["10.9.0.2:9102"].state is MemberState.DOWN
    # a single-process node says no workers: it stays its node address, now known as one process
    assert not manager.learn(NodeLayout("10.9.0.3:8848", "10.9.0.3:8848", ()))
    assert "10.9.0.3:8848" in manager.peers and manager.workers_of("10.9.0.3:8848") == ()
    assert next(m for m in manager.nodes() if m.address == "10.9.0.3:8848").extend == {"workers": "1"}


def test_only_a_listed_node_is_learnt_and_only_from_a_process_it_names() -> None:
    manager = _worker_of_node_1()
    before = sorted(manager.peers)
    assert not manager.learn(NodeLayout("10.66.6.6:9100", "10.66.6.6:8848", (9100,)))  # not listed
    assert not manager.learn(NodeLayout("10.66.6.6:9100", "10.9.0.2:8848", (9100,)))  # not one of its workers
    assert not manager.learn(NodeLayout("10.9.0.1:9999", "10.9.0.1:8848", (9100, 9999)))  # our own node
    # an answer to a call to node 3 cannot speak for node 2
    assert not manager.learn(NodeLayout("10.9.0.2:9100", "10.9.0.2:8848", (9100,)), via="10.9.0.3:8848")
    assert sorted(manager.peers) == before


def test_a_node_leaving_the_list_takes_its_workers_and_comes_back_undiscovered() -> None:
    manager = _worker_of_node_1()
    manager.learn(NodeLayout("10.9.0.2:9100", "10.9.0.2:8848", (9100, 9102)))
    assert manager.set_members([NODES[0], NODES[2]])
    assert sorted(manager.peers) == ["10.9.0.1:9102", "10.9.0.3:8848"]
    assert [m.address for m in manager.nodes()] == ["10.9.0.1:8848", "10.9.0.3:8848"]
    manager.set_members(NODES)
    assert "10.9.0.2:8848" in manager.peers and manager.workers_of("10.9.0.2:8848") is None


def test_a_node_of_workers_is_up_while_one_worker_answers_and_then_its_worst_state() -> None:
    manager = _worker_of_node_1()
    manager.learn(NodeLayout("10.9.0.2:9100", "10.9.0.2:8848", (9100, 9102)))
    manager.report_failed("10.9.0.2:9100", refused=True)  # a paused or dead worker: DOWN for Distro
    assert "10.9.0.2:9100" not in manager.healthy_addresses()
    assert _states(manager)["10.9.0.2:8848"] == "UP"
    node = next(m for m in manager.nodes() if m.address == "10.9.0.2:8848").to_nacos()
    assert node["extendInfo"]["workers"] == "2"
    assert node["extendInfo"]["workerStates"] == "10.9.0.2:9100=DOWN,10.9.0.2:9102=UP"
    manager.report_failed("10.9.0.2:9102")
    assert _states(manager)["10.9.0.2:8848"] == "UP"  # SUSPICIOUS still answers
    manager.report_failed("10.9.0.2:9102", refused=True)
    assert _states(manager)["10.9.0.2:8848"] == "DOWN"
    # a node that is one member keeps that member's own state
    manager.report_failed("10.9.0.3:8848")
    assert _states(manager)["10.9.0.3:8848"] == "SUSPICIOUS"


def test_the_report_body_keeps_the_old_fields_and_says_the_node_and_its_workers() -> None:
    new = {"node": {"ip": "10.9.0.2", "port": 9102, "address": "10.9.0.2:9102"},
           "nodeAddress": "10.9.0.2:8848", "workers": [9102, 9100]}
    assert parse_report(json.dumps(new).encode()) == NodeLayout("10.9.0.2:9102", "10.9.0.2:8848", (9100, 9102))
    old = {"node": {"ip": "10.9.0.3", "port": 8848}}  # an older Shoal node: one process, itself
    assert parse_report(json.dumps(old).encode()) == NodeLayout("10.9.0.3:8848", "10.9.0.3:8848", ())
    assert parse_report(b"{}") is None and parse_report(b"not json") is None
    for body in (b"{}", b"", json.dumps(new).encode(), json.dumps(old).encode()):
        report_request(body)
    for bad in ({"workers": "9100"}, {"workers": [True]}, {"workers": [70000]}, {"nodeAddress": 1}, {"node": []}):
        with pytest.raises(BadRequestBody):
            report_request(json.dumps(bad).encode())


async def test_workers_tell_their_siblings_their_connections_and_no_other_node() -> None:
    """A worker's report to a sibling, and the sibling's answer, carry the sender's connections
    (the limits hold for the node); a report to another node does not."""
    from shoal.distro.members import MemberReporter, worker_load
    from shoal.distro.transport import InMemoryNetwork
    from shoal.transport.grpc.limits import ConnectionLimitRule, SiblingConnections

    rule = ConnectionLimitRule(count_limit_per_ip_default=3)
    network = InMemoryNetwork()
    heard: dict[str, SiblingConnections] = {}
    reporters: dict[str, MemberReporter] = {}
    for index, (total, per_ip) in enumerate([(2, {"10.0.0.1": 2}), (5, {"10.0.0.1": 1, "10.0.0.2": 4})]):
        manager = _worker_of_node_1(index)
        counts = (total, per_ip)
        heard[manager.self_address] = SiblingConnections(lambda c=counts: c, lambda: rule, lambda: 0, 10_000)
        reporter = MemberReporter(manager, network.transport(manager.self_address), 1000,
                                  heard[manager.self_address])
        reporters[manager.self_address] = reporter
        network.attach(manager.self_address, lambda sender, kind, body, r=reporter: r.handle(sender, body))
    to_node_2: list[bytes] = []

    async def node_2(sender: str, kind: str, body: bytes) -> tuple[str, bytes]:
        to_node_2.append(body)
        return "MemberReportResponse", b'{"node":{"address":"10.9.0.2:8848"}}'
    network.attach("10.9.0.2:8848", node_2)

    await reporters["10.9.0.1:9100"].report_round()  # worker 0 reports; worker 1's answer comes back
    assert heard["10.9.0.1:9102"].total() == 2 and heard["10.9.0.1:9102"].per_ip("10.0.0.1") == 2
    assert heard["10.9.0.1:9100"].total() == 5 and heard["10.9.0.1:9100"].per_ip("10.0.0.2") == 4
    assert to_node_2 and all(worker_load(body) is None for body in to_node_2)


def test_a_siblings_figures_age_out_and_bad_ones_are_ignored() -> None:
    from shoal.transport.grpc.limits import ConnectionLimitRule, SiblingConnections

    now = [0]
    siblings = SiblingConnections(lambda: (0, {}), ConnectionLimitRule, lambda: now[0], 5000)
    siblings.received("w1", {"total": 3, "perIp": {"10.0.0.1": 3}})
    for bad in (None, "x", {"total": -1}, {"total": True}, {"total": 2, "perIp": ["10.0.0.1"]}):
        siblings.received("w2", bad)
    assert (siblings.total(), siblings.per_ip("10.0.0.1"), siblings.by_member()) == (3, 3, {"w1": 3})
    assert "perIp" not in siblings.outgoing()  # the rule limits no ip: counts per ip are not sent
    now[0] = 5001  # a sibling that stopped reporting took its connections with it
    assert (siblings.total(), siblings.per_ip("10.0.0.1")) == (0, 0)
