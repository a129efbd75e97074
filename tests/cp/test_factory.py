"""Choosing and building a node's CP store from its settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.etcd import EtcdStore
from shoal.cp.factory import build_cp, cp_mode
from shoal.errors import ConfigError

MEMBERS = [("127.0.0.1", 18848), ("127.0.0.1", 18858), ("127.0.0.1", 18868)]


def _config(tmp_path: Path, **overrides: str) -> Config:
    return Config.load(env={}, overrides={"data_dir": str(tmp_path), **overrides})


def test_the_mode_follows_the_deployment(tmp_path: Path) -> None:
    assert cp_mode(_config(tmp_path), clustered=False) == "embedded"
    assert cp_mode(_config(tmp_path), clustered=True) == "managed-etcd"
    assert cp_mode(_config(tmp_path, cp_endpoints="e1:2379"), clustered=True) == "etcd"
    assert cp_mode(_config(tmp_path, **{"shoal.cp.mode": "Embedded"}), clustered=True) == "embedded"
    for bad in ({"shoal.cp.mode": "raft"}, {"shoal.cp.mode": "etcd"},
                {"shoal.cp.tls.cert": "c.pem"}, {"shoal.cp.request-timeout-ms": "0"}):
        with pytest.raises(ConfigError):
            cp_mode(_config(tmp_path, **bad), clustered=True)
    with pytest.raises(ConfigError):
        cp_mode(_config(tmp_path, **{"shoal.cp.mode": "managed-etcd"}), clustered=False)


def test_build_each_mode(tmp_path: Path) -> None:
    embedded = build_cp(_config(tmp_path))
    assert isinstance(embedded.store, EmbeddedStore) and embedded.supervisor is None
    assert embedded.store.path == tmp_path / "cp" / "store.sqlite3"
    # a worker of a multi-worker node: the node's one file, polled often for its siblings' writes
    worker = build_cp(_config(tmp_path), worker=True)
    assert isinstance(worker.store, EmbeddedStore) and worker.store.path == embedded.store.path
    assert worker.store.poll_interval_s <= 0.2 < embedded.store.poll_interval_s

    external = build_cp(_config(tmp_path, cp_endpoints="10.0.0.1:2379, 10.0.0.2:2379",
                                **{"shoal.cp.tls.ca": "/ca.pem"}), MEMBERS, "127.0.0.1:18858")
    assert isinstance(external.store, EtcdStore) and external.supervisor is None
    assert external.store.endpoints == ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]

    managed = build_cp(_config(tmp_path, **{"shoal.cp.etcd-binary": "/opt/etcd"}), MEMBERS, "127.0.0.1:18858")
    assert managed.mode == "managed-etcd" and managed.supervisor is not None
    assert (managed.supervisor.me.client_port, managed.supervisor.me.peer_port) == (17858, 17859)
    assert managed.supervisor.binary == "/opt/etcd"
    assert isinstance(managed.store, EtcdStore)
    assert managed.store.endpoints[0] == "http://127.0.0.1:17858" and len(managed.store.endpoints) == 3
    with pytest.raises(ConfigError):
        build_cp(_config(tmp_path), MEMBERS, "127.0.0.1:9999")


def test_the_managed_members_log_is_bounded_by_the_settings(tmp_path: Path) -> None:
    default = build_cp(_config(tmp_path), MEMBERS, "127.0.0.1:18858").supervisor
    assert default is not None and default.log_limits == (64 * 1024 * 1024, 2, 30_000)
    managed = build_cp(_config(tmp_path, **{"shoal.cp.etcd-log.max-bytes": "4096", "shoal.cp.etcd-log.count": "5",
                                            "shoal.cp.etcd-log.check-interval-ms": "250"}),
                       MEMBERS, "127.0.0.1:18858").supervisor
    assert managed is not None and managed.log_limits == (4096, 5, 250)
    assert [p.name for p in managed.rotated_log_paths()] == [f"etcd.log.{n}" for n in range(1, 6)]
    for prop in ("shoal.cp.etcd-log.max-bytes", "shoal.cp.etcd-log.count", "shoal.cp.etcd-log.check-interval-ms"):
        with pytest.raises(ConfigError, match=f"{prop} must be positive"):
            _config(tmp_path, **{prop: "0"})


def test_cp_flags_reach_the_settings() -> None:
    from shoal.__main__ import _server_config, build_parser

    args = build_parser().parse_args(["server", "--cp-endpoints", "a:1,b:2", "--cp-tls-ca", "ca.pem",
                                      "--cp-tls-cert", "c.pem", "--cp-tls-key", "k.pem"])
    config, _report = _server_config(args)
    assert (config.cp_endpoints, config.cp_tls_ca, config.cp_tls_cert, config.cp_tls_key) == (
        "a:1,b:2", "ca.pem", "c.pem", "k.pem")


PEER = "nacos.remote.peer.rpc.tls"


def _peer_tls(**extra: str) -> dict[str, str]:
    return {f"{PEER}.enableTls": "true", f"{PEER}.certChainFile": "/pki/node.crt",
            f"{PEER}.certPrivateKey": "/pki/node.key", **extra}


def test_cluster_tls_carries_over_to_the_managed_members(tmp_path: Path) -> None:
    mutual = build_cp(_config(tmp_path, **_peer_tls(**{f"{PEER}.trustCollectionCertFile": "/pki/ca.crt",
                                                         f"{PEER}.mutualAuthEnable": "true"})),
                      MEMBERS, "127.0.0.1:18858")
    assert mutual.supervisor is not None and isinstance(mutual.store, EtcdStore)
    assert mutual.store.endpoints == ["https://127.0.0.1:17858", "https://127.0.0.1:17848", "https://127.0.0.1:17868"]
    cmd = mutual.supervisor.command()
    assert not [arg for arg in cmd if arg.startswith("http://")]
    assert cmd[cmd.index("--listen-client-urls") + 1] == "https://127.0.0.1:17858"
    assert cmd[cmd.index("--listen-peer-urls") + 1] == "https://127.0.0.1:17859"
    for flag, value in (("--cert-file", "/pki/node.crt"), ("--key-file", "/pki/node.key"),
                        ("--trusted-ca-file", "/pki/ca.crt"), ("--peer-cert-file", "/pki/node.crt"),
                        ("--peer-key-file", "/pki/node.key"), ("--peer-trusted-ca-file", "/pki/ca.crt")):
        assert cmd[cmd.index(flag) + 1] == value, flag
    assert "--client-cert-auth" in cmd and "--peer-client-cert-auth" in cmd

    # no mutual auth asked for: clients need no certificate (etcd would require one with a CA file)
    one_way = build_cp(_config(tmp_path, **_peer_tls(**{f"{PEER}.trustCollectionCertFile": "/pki/ca.crt"})),
                       MEMBERS, "127.0.0.1:18858").supervisor
    assert one_way is not None
    cmd = one_way.command()
    assert "--client-cert-auth" not in cmd and "--trusted-ca-file" not in cmd and "--peer-client-cert-auth" in cmd

    plain = build_cp(_config(tmp_path), MEMBERS, "127.0.0.1:18858").supervisor
    assert plain is not None and not [arg for arg in plain.command() if "https" in arg or "cert" in arg]


@pytest.mark.parametrize(("extra", "problem"), [
    ({}, f"{PEER}.trustCollectionCertFile is needed"),
    ({f"{PEER}.trustCollectionCertFile": "/pki/ca.crt", f"{PEER}.certPrivateKeyPassword": "pw"},
     "cannot read an encrypted key"),
    ({f"{PEER}.trustCollectionCertFile": "/pki/ca.crt", "shoal.cp.tls.ca": "/pki/ca.crt"},
     "shoal.cp.tls.* is for an external etcd"),
])
def test_cluster_tls_etcd_cannot_take_is_a_config_error(tmp_path: Path, extra: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.").replace("*", r"\*")):
        build_cp(_config(tmp_path, **_peer_tls(**extra)), MEMBERS, "127.0.0.1:18858")
