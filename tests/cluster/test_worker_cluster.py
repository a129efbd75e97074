"""A cluster of two nodes of two workers and one single-process node, in memory: Distro sees the
five processes once the member reports have gone round, Nacos sees the three nodes (issue 21)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shoal.app import build_cp_phase
from shoal.auth.service import AuthService
from shoal.distro.members import REPORT_REQUEST, MemberState, introduced_by
from shoal.distro.snapshot import SNAPSHOT_REQUEST
from shoal.distro.sync import SYNC_REQUEST
from shoal.distro.transport import NODE_HEADER, WORKERS_HEADER
from shoal.errors import Forbidden
from shoal.metrics import Metrics
from shoal.testing import OPEN_SETTINGS, SimCluster
from shoal.testing.model import config_with
from shoal.transport.http.forward import Forwarder, MemberList, Standalone
from shoal.transport.http.server import HttpServer

FIVE = ["10.9.0.1:9100", "10.9.0.1:9102", "10.9.0.2:9100", "10.9.0.2:9102", "10.9.0.3:8848"]
NODES = ["10.9.0.1:8848", "10.9.0.2:8848", "10.9.0.3:8848"]


async def _reported() -> SimCluster:
    cluster = SimCluster.of_workers([2, 2, 0], **OPEN_SETTINGS)
    await cluster.report_rounds()
    return cluster


async def test_after_the_reports_every_process_knows_the_five_distro_members() -> None:
    cluster = SimCluster.of_workers([2, 2, 0])
    assert cluster.addresses == FIVE
    # before any report: the own node's workers, the other nodes under their node addresses
    first = cluster.nodes["10.9.0.1:9100"].members
    assert [m.address for m in first.all_members()] == ["10.9.0.1:9100", "10.9.0.1:9102", "10.9.0.2:8848",
                                                         "10.9.0.3:8848"]
    await cluster.report_rounds()
    for address, node in cluster.nodes.items():
        assert [m.address for m in node.members.all_members()] == FIVE, address
        assert node.members.healthy_addresses() == FIVE, address
        assert [m.address for m in node.members.nodes()] == NODES, address


async def test_ip_port_responsibility_spreads_over_the_five_and_every_process_agrees() -> None:
    cluster = await _reported()
    tags = [f"10.0.{i // 200}.{i % 200}:8080" for i in range(1000)]
    owners = {address: node.distro.mapper.owners_of(tags) for address, node in cluster.nodes.items()}
    first = owners[FIVE[0]]
    assert all(o == first for o in owners.values())
    spread = Counter(first)
    assert sorted(spread) == FIVE and min(spread.values()) > 100  # 200 each, give or take the hash


async def test_a_write_on_one_worker_reaches_every_other_process() -> None:
    cluster = await _reported()
    writer = cluster.nodes["10.9.0.2:9102"]
    writer.register("c1", 7001)
    await cluster.flush()
    for address in FIVE:
        assert cluster.nodes[address].ports() == [7001], address
        assert cluster.nodes[address].clients.get("c1") is not None
    # sent to each worker under its own name, never to a node's shared address
    assert {c[1] for c in cluster.calls(SYNC_REQUEST) if c[0] == writer.address} == set(FIVE) - {writer.address}


async def test_a_worker_cut_off_goes_down_for_distro_while_its_node_stays_up() -> None:
    cluster = await _reported()
    paused = "10.9.0.1:9102"
    cluster.network.down.add(paused)
    for address in ("10.9.0.2:9100", "10.9.0.3:8848", "10.9.0.1:9100"):  # another node's, one process, a sibling
        node = cluster.nodes[address]
        await node.distro.report_round()
        assert node.members.peers[paused].state is MemberState.DOWN, address
        assert paused not in node.members.healthy_addresses()
        listed = {m.address: m for m in node.members.nodes()}
        assert sorted(listed) == NODES and listed["10.9.0.1:8848"].state is MemberState.UP
        assert "10.9.0.1:9102=DOWN" in listed["10.9.0.1:8848"].to_nacos()["extendInfo"]["workerStates"]
    # and a write no longer waits on it: the others get it
    cluster.nodes["10.9.0.3:8848"].register("c2", 7002)
    await cluster.flush()
    assert all(cluster.nodes[a].ports() == [7002] for a in FIVE if a != paused)


class _Serving:
    def is_serving(self) -> bool:
        return True

    def readiness_problem(self) -> str | None:
        return None


async def test_the_nacos_node_list_of_a_worker_has_the_three_nodes() -> None:
    """``/v1/core/cluster/nodes`` and the v2 list, over the members as app.py wires them."""
    cluster = await _reported()
    members = cluster.nodes["10.9.0.2:9100"].members
    config = cluster.config
    auth = AuthService(config)
    await auth.start()
    server = HttpServer(config, _Serving(), Metrics(), auth, Forwarder(Standalone(), 1000),
                        MemberList(members.nodes))
    server.install(server.routes())
    client = TestClient(TestServer(server.app))
    await client.start_server()
    try:
        v1 = await (await client.get("/nacos/v1/core/cluster/nodes")).json()
        v2 = await (await client.get("/nacos/v2/core/cluster/node/list")).json()
    finally:
        await client.close()
        await auth.stop()
    assert [m["address"] for m in v1["data"]] == NODES == [m["address"] for m in v2["data"]]
    assert all(m["state"] == "UP" for m in v1["data"])
    assert [m["extendInfo"].get("workers") for m in v1["data"]] == ["2", "2", "1"]


async def test_the_cp_store_of_a_worker_has_one_etcd_member_per_node(tmp_path: Path) -> None:
    """``build_cp_phase``: the managed etcd members are the nodes, this one placed at its node."""
    cluster = await _reported()
    members = cluster.nodes["10.9.0.1:9102"].members
    cp = build_cp_phase(config_with(data_dir=str(tmp_path)), members)
    try:
        assert cp.runtime.supervisor is not None
        assert [m.name for m in cp.runtime.supervisor.cluster] == [
            "shoal-10.9.0.1-8848", "shoal-10.9.0.2-8848", "shoal-10.9.0.3-8848"]
        assert cp.runtime.supervisor.me.name == "shoal-10.9.0.1-8848"
    finally:
        await cp.runtime.store.close()


async def test_a_report_from_a_worker_not_known_yet_is_learnt_and_a_stranger_is_refused() -> None:
    cluster = SimCluster.of_workers([2, 2, 0], **OPEN_SETTINGS)
    single = cluster.nodes["10.9.0.3:8848"].distro
    worker = "10.9.0.1:9102"
    body = json.dumps({"node": {"ip": "10.9.0.1", "port": 9102, "address": worker},
                       "nodeAddress": "10.9.0.1:8848", "workers": [9100, 9102]}).encode()
    with pytest.raises(Forbidden):  # not a member yet, and a sync does not say who it is
        await single.dispatch(worker, SYNC_REQUEST, b"")
    with pytest.raises(Forbidden):  # claims node 1's workers but is none of them
        await single.dispatch("10.9.0.1:9999", REPORT_REQUEST, body)
    kind, answer = await single.dispatch(worker, REPORT_REQUEST, body)
    assert kind == "MemberReportResponse"
    assert json.loads(answer)["nodeAddress"] == "10.9.0.3:8848" and json.loads(answer)["workers"] == []
    assert sorted(single.members.peers) == ["10.9.0.1:9100", "10.9.0.1:9102", "10.9.0.2:8848"]


async def test_a_worker_not_known_yet_is_admitted_by_the_introduction_its_requests_carry() -> None:
    # A worker's first snapshot load may reach a process its node's report has not reached yet
    # (the public cluster port is any worker): its request names its node and workers itself.
    cluster = SimCluster.of_workers([2, 2, 0], **OPEN_SETTINGS)
    single = cluster.nodes["10.9.0.3:8848"].distro
    worker = cluster.nodes["10.9.0.1:9102"]
    headers = worker.members.introduction()
    assert headers == {NODE_HEADER: "10.9.0.1:8848", WORKERS_HEADER: "9100,9102"}
    assert cluster.nodes["10.9.0.3:8848"].members.introduction() == {}  # a single process needs none
    load = json.dumps({"session": "", "offset": 0, "stream": True}).encode()
    with pytest.raises(Forbidden):  # another ip than its node's: no worker of it
        await single.dispatch("10.9.0.7:9102", SNAPSHOT_REQUEST, load, introduced_by("10.9.0.7:9102", headers))
    with pytest.raises(Forbidden):  # a node nobody listed
        await single.dispatch("10.9.0.7:9102", SNAPSHOT_REQUEST, load, introduced_by(
            "10.9.0.7:9102", {NODE_HEADER: "10.9.0.7:8848", WORKERS_HEADER: "9102"}))
    kind, _page = await single.dispatch(worker.address, SNAPSHOT_REQUEST, load, introduced_by(worker.address, headers))
    assert kind == "DistroSnapshotResponse"
    assert sorted(single.members.peers) == ["10.9.0.1:9100", "10.9.0.1:9102", "10.9.0.2:8848"]
    assert introduced_by(worker.address, {NODE_HEADER: "10.9.0.1:8848", WORKERS_HEADER: "x"}) is None
