"""Auth across a real three-node cluster on managed etcd: one set of users, roles, permissions
and one token key for every node, all of it back after every node and etcd member is killed,
and ``shoal users`` working on the cluster's etcd."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing import SECURE, ServerProcess, kill, poll_until, start_server
from shoal.testing.http import call, call_json
from shoal.testing.nodes import CpCluster

ADMIN_PW = "admin-pass-1"
DEV_PW = "dev-pass-1"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[CpCluster]:
    cluster = CpCluster(tmp_path, 3, auth=SECURE)
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.stop_all()


def login(node: ServerProcess, username: str, password: str) -> tuple[int, str]:
    return call("POST", node.url("/nacos/v1/auth/login"), data={"username": username, "password": password})


def token_of(node: ServerProcess, username: str, password: str) -> str:
    status, text = login(node, username, password)
    assert status == 200, text
    return str(call_json("POST", node.url("/nacos/v1/auth/login"),
                         data={"username": username, "password": password})["accessToken"])


def register(node: ServerProcess, token: str, namespace: str) -> tuple[int, str]:
    return call("POST", node.url("/nacos/v1/ns/instance"), {"accessToken": token, "namespaceId": namespace,
                                                             "serviceName": "svc", "ip": "10.9.0.1", "port": "80"})


def run_users(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", "users", *args], capture_output=True, text=True,
                          timeout=60)


def users(cluster: CpCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run_users(*args, "--cp-endpoints", ",".join(f"127.0.0.1:{p - 1000}" for p in cluster.ports))


def test_one_set_of_users_and_one_token_key_for_the_cluster(cluster: CpCluster, tmp_path: Path) -> None:
    a, b, c = (cluster.node(i) for i in range(3))
    assert call_json("POST", a.url("/nacos/v1/auth/users/admin"), data={"password": ADMIN_PW})["username"] == "nacos"
    # the admin made on A logs in on B, and a second admin cannot be made on C
    poll_until(lambda: login(b, "nacos", ADMIN_PW)[0] == 200, timeout=10, what="the admin on B")
    assert call("POST", c.url("/nacos/v1/auth/users/admin"), data={"password": "other"})[0] == 409
    admin = token_of(a, "nacos", ADMIN_PW)
    # a token issued by A works on C
    assert call_json("GET", c.url("/nacos/v1/auth/users"), {"accessToken": admin})["totalCount"] == 1

    # a user made on A, a role and a permission granted on B: they apply on A
    assert call("POST", a.url("/nacos/v1/auth/users"), {"accessToken": admin, "username": "dev",
                                                        "password": DEV_PW})[0] == 200
    poll_until(lambda: login(b, "dev", DEV_PW)[0] == 200, timeout=10, what="dev on B")
    assert call("POST", b.url("/nacos/v1/auth/roles"), {"accessToken": admin, "role": "devs",
                                                        "username": "dev"})[0] == 200
    assert call("POST", b.url("/nacos/v1/auth/permissions"), {"accessToken": admin, "role": "devs",
                                                              "resource": "dev:*:*", "action": "rw"})[0] == 200
    dev = token_of(c, "dev", DEV_PW)
    poll_until(lambda: register(a, dev, "dev")[0] == 200, timeout=10, what="the permission applied on A")
    assert register(a, dev, "prod") == (403, "authorization failed!")
    assert call("POST", b.url("/nacos/v2/console/namespace"), {"accessToken": admin, "namespaceId": "dev",
                                                               "namespaceName": "Dev"})[0] == 200

    # every node and every etcd member killed, then started again: all of it is back
    cluster.kill_all()
    cluster.start_all()
    a, b, c = (cluster.node(i) for i in range(3))
    assert call_json("GET", c.url("/nacos/v1/auth/users"), {"accessToken": admin})["totalCount"] == 2  # same key
    poll_until(lambda: register(b, token_of(b, "dev", DEV_PW), "dev")[0] == 200, timeout=10,
               what="dev's permission after the restart")
    assert register(c, dev, "prod")[0] == 403
    assert "dev" in [n["namespace"] for n in call_json("GET", a.url("/nacos/v1/console/namespaces"))["data"]]

    # the command line on the cluster's etcd
    listed = users(cluster, "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["dev\tdevs", "nacos\tROLE_ADMIN"]
    pw = tmp_path / "pw"
    pw.write_text("changed-by-cli\n")
    done = users(cluster, "passwd", "dev", "--password-file", str(pw))
    assert done.returncode == 0, done.stderr
    poll_until(lambda: login(a, "dev", "changed-by-cli")[0] == 200, timeout=10, what="the new password on A")
    assert login(b, "dev", DEV_PW)[0] == 403
    done = users(cluster, "delete", "dev")
    assert done.returncode == 0, done.stderr
    poll_until(lambda: login(c, "dev", "changed-by-cli")[0] == 403, timeout=10, what="dev gone on C")
    assert users(cluster, "delete", "nacos").returncode == 2  # the admin stays


def test_users_commands_on_the_data_dir_of_a_running_standalone_node(tmp_path: Path) -> None:
    server = start_server(tmp_path, ["--auth"], auth=SECURE)
    data = ["--data-dir", str(server.data_dir)]
    pw = tmp_path / "pw"
    try:
        pw.write_text("first-pass\n")
        done = run_users("create", "ops", "--password-file", str(pw), *data)
        assert done.returncode == 0, done.stderr
        assert login(server, "ops", "first-pass")[0] == 200  # a new user: seen at the next login
        pw.write_text("second-pass\n")
        assert run_users("passwd", "ops", "--password-file", str(pw), *data).returncode == 0
        assert login(server, "ops", "first-pass")[0] == 403
        assert login(server, "ops", "second-pass")[0] == 200
        listed = run_users("list", *data)
        assert (listed.returncode, listed.stdout) == (0, "ops\n")
        assert run_users("delete", "ops", *data).returncode == 0
        assert login(server, "ops", "second-pass")[0] == 403
        assert run_users("delete", "ops", *data).returncode == 2  # no such user
        # roles granted meanwhile reach the running node too
        assert run_users("create", "boss", "--password-file", str(pw), "--admin", *data).returncode == 0
        poll_until(lambda: '"globalAdmin":true' in login(server, "boss", "second-pass")[1], timeout=10,
                   what="the new admin's role on the running node")
    finally:
        kill(server)
