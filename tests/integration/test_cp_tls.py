"""The managed etcd members under the cluster TLS settings (``nacos.remote.peer.rpc.tls.*``): the
CP data (password hashes, the token key) travels between members and to each node over TLS only.

Three real nodes with real etcd members; certificates from ``shoal.testing.certs`` into tmp_path."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path

import pytest

from shoal.testing import OPEN, free_port_blocks, poll_until, start_server, timed_call
from shoal.testing.certs import Pki, encrypted_copy, make_pki
from shoal.testing.etcd import etcd_pids, kill_pid
from shoal.testing.nodes import CpCluster
from shoal.testing.openapi import listed_ips, register_persistent

PEER = "nacos.remote.peer.rpc.tls"


def peer_tls(pki: Pki, mutual: bool = True, trust: bool = True, key: Path | None = None) -> list[str]:
    args = ["-D", f"{PEER}.enableTls=true", "-D", f"{PEER}.certChainFile={pki.server.cert}",
            "-D", f"{PEER}.certPrivateKey={key or pki.server.key}"]
    if trust:
        args += ["-D", f"{PEER}.trustCollectionCertFile={pki.ca}"]
    if mutual:
        args += ["-D", f"{PEER}.mutualAuthEnable=true"]
    return args


def plaintext_answer(url: str) -> int | None:
    """The HTTP status a plaintext request to ``url`` gets, or None when no HTTP answer comes."""
    return timed_call("GET", url, timeout=5)[0] or None  # 0: reset, closed, or a TLS alert that is no HTTP


def https_status(url: str, pki: Pki, with_cert: bool) -> int | None:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        ctx.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    return timed_call("GET", url, timeout=5, context=ctx)[0] or None


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def test_managed_members_form_the_cluster_over_mutual_tls_and_refuse_plaintext(tmp_path: Path, pki: Pki) -> None:
    cluster = CpCluster(tmp_path / "nodes", 3, peer_tls(pki), auth=OPEN)
    try:
        cluster.start_all()
        a, _, c = (cluster.node(i) for i in range(3))
        # every member runs with TLS flags on both listeners
        for node in (a, c):
            [pid] = etcd_pids(node.data_dir)
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"--peer-client-cert-auth" in argv and b"--client-cert-auth" in argv, argv
            assert not any(arg.startswith(b"http://") for arg in argv), argv

        status, body = register_persistent(a, "over-tls", "10.12.0.1")
        assert status == 200, body
        poll_until(lambda: listed_ips(c, "over-tls") == {"10.12.0.1"}, 10, 0.05, "the instance written on A, on C")

        client_port, peer_port = cluster.ports[2] - 1000, cluster.ports[2] - 999
        # over TLS with a certificate the CA signed, both ports answer ...
        assert https_status(f"https://127.0.0.1:{client_port}/health", pki, with_cert=True) == 200
        members = f"https://127.0.0.1:{peer_port}/members"
        assert https_status(members, pki, with_cert=True) == 200
        # ... without a certificate (mutual auth asked for), neither does ...
        assert https_status(f"https://127.0.0.1:{client_port}/health", pki, with_cert=False) is None
        assert https_status(members, pki, with_cert=False) is None
        # ... and plaintext gets no answer that carries data
        for url in (f"http://127.0.0.1:{client_port}/health", f"http://127.0.0.1:{client_port}/version",
                    f"http://127.0.0.1:{peer_port}/members"):
            assert plaintext_answer(url) in (None, 400), url
        status, text, _ = timed_call("POST", f"http://127.0.0.1:{client_port}/v3/kv/range", timeout=5,
                                     body=json.dumps({"key": "AA==", "range_end": "AA=="}).encode())
        assert status in (0, 400), f"plaintext range answered {status}: {text[:200]!r}"
    finally:
        cluster.stop_all()


def _exit(tmp_path: Path, args: list[str]) -> tuple[int, str]:
    ports = free_port_blocks(2)
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    node = start_server(tmp_path / "bad", ["--members", members, *args], port=ports[0], wait=False, auth=OPEN)
    try:
        code = node.proc.wait(30)
    except subprocess.TimeoutExpired:
        node.kill()
        raise AssertionError(f"node started anyway:\n{node.log_tail()}") from None
    finally:
        for pid in etcd_pids(node.data_dir):
            kill_pid(pid)
    return code, node.log()


@pytest.mark.parametrize("case", ["no-trust", "encrypted-key", "cp-tls-for-managed"])
def test_settings_etcd_cannot_use_stop_the_node_with_exit_2(case: str, tmp_path: Path, pki: Pki) -> None:
    if case == "no-trust":
        args, problem = peer_tls(pki, mutual=False, trust=False), f"{PEER}.trustCollectionCertFile is needed"
    elif case == "encrypted-key":
        secret = encrypted_copy(pki.server, tmp_path, "s3cret")
        args = [*peer_tls(pki, key=secret.key), "-D", f"{PEER}.certPrivateKeyPassword=s3cret"]
        problem = "cannot read an encrypted key"
    else:
        args, problem = [*peer_tls(pki), "--cp-tls-ca", str(pki.ca)], "shoal.cp.tls.* is for an external etcd"
    code, log = _exit(tmp_path, args)
    assert code == 2, log[-2000:]
    assert problem in log, log[-2000:]
