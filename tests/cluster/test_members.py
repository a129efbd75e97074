"""Member lists: parsing, cluster.conf reload, self detection, suspicion before death."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shoal.config import Config
from shoal.distro.members import MemberManager, MemberState, parse_member_list, read_cluster_conf
from shoal.errors import ConfigError
from shoal.testing import SimCluster


def test_cluster_conf_format(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.conf"
    conf.write_text("# the cluster\n10.0.0.1:8848\n10.0.0.2   # default port\n\n10.0.0.3:9000,10.0.0.4:8848\n")
    assert read_cluster_conf(conf) == [("10.0.0.1", 8848), ("10.0.0.2", 8848), ("10.0.0.3", 9000),
                                       ("10.0.0.4", 8848)]
    with pytest.raises(ConfigError, match="bad cluster member"):
        parse_member_list("10.0.0.1:notaport")


def test_self_is_found_by_port_and_local_address() -> None:
    members = [("10.9.9.9", 8848), ("127.0.0.1", 8848), ("127.0.0.1", 8849)]
    manager = MemberManager.from_list(members, 8849, lambda: 0)
    assert manager.self_address == "127.0.0.1:8849"
    assert sorted(manager.peers) == ["10.9.9.9:8848", "127.0.0.1:8848"]
    assert MemberManager.from_list(members, 8848, lambda: 0, self_ip="10.9.9.9").self_address == "10.9.9.9:8848"
    with pytest.raises(ConfigError, match="not in the member list"):
        MemberManager.from_list([("10.9.9.9", 8848)], 8848, lambda: 0)


async def test_cluster_conf_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.conf"
    conf.write_text("10.9.0.1:8848\n10.9.0.2:8848\n")
    cluster = SimCluster(2, cluster_conf=str(conf))
    node = cluster[0]
    await node.distro.reload_cluster_conf()
    assert sorted(node.members.peers) == ["10.9.0.2:8848"]
    conf.write_text("10.9.0.1:8848\n10.9.0.2:8848\n10.9.0.3:8848\n")
    import os
    os.utime(conf, ns=(10**18, 10**18))
    await node.distro.reload_cluster_conf()
    assert sorted(node.members.peers) == ["10.9.0.2:8848", "10.9.0.3:8848"]
    assert node.members.peers["10.9.0.3:8848"].state is MemberState.UP
    conf.write_text("oops:port\n")
    os.utime(conf, ns=(2 * 10**18, 2 * 10**18))
    await node.distro.reload_cluster_conf()  # a broken file keeps the current members
    assert len(node.members.peers) == 2


def test_auth_in_a_cluster_requires_a_cluster_identity() -> None:
    with pytest.raises(ConfigError, match="identity"):
        dataclasses.replace(Config(), auth_enabled=True, members="127.0.0.1:8848,127.0.0.1:8858").validate()
    dataclasses.replace(Config(), auth_enabled=True, members="127.0.0.1:8848,127.0.0.1:8858",
                        cluster_identity_key="k", cluster_identity_value="v").validate()
