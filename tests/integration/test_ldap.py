"""LDAP logins (``nacos.core.auth.system.type=ldap``) on a real node against a real OpenLDAP slapd:
the directory's users log in as ``LDAP_<name>`` with the Nacos roles bound to that name, the
node's own users still log in first, a stock SDK logs in through LDAP, and a directory that is
down or hung gives a clear refusal instead of a hang."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService, RegisterInstanceParam

from shoal.testing import SECURE, ServerProcess, kill, start_server
from shoal.testing.http import call, call_json
from shoal.testing.ldap import ADMIN_DN, BASE, Slapd

DIRECTORY_ADMIN_PW = "directory-root-pw"
ALICE_PW = "alice-in-ldap"
ADMIN_PW = "local-admin-pw"


def ldap_args(url: str, *extra: str) -> list[str]:
    settings = {"nacos.core.auth.system.type": "ldap", "nacos.core.auth.ldap.url": url,
                "nacos.core.auth.ldap.basedc": BASE, "nacos.core.auth.ldap.userDn": ADMIN_DN,
                "nacos.core.auth.ldap.password": DIRECTORY_ADMIN_PW, "nacos.core.auth.ldap.filter.prefix": "uid",
                "nacos.core.auth.ldap.case.sensitive": "false", "nacos.core.auth.ldap.timeout": "1000"}
    return [arg for key, value in settings.items() for arg in ("-D", f"{key}={value}")] + list(extra)


@pytest.fixture
def slapd(tmp_path: Path) -> Iterator[Slapd]:
    with Slapd(tmp_path / "slapd", {"alice": ALICE_PW, "bob": "bob-in-ldap"}, DIRECTORY_ADMIN_PW) as server:
        yield server


@pytest.fixture
def ldap_node(tmp_path: Path) -> Iterator[Callable[[str], ServerProcess]]:
    """A node on the secure defaults checking logins against the LDAP server at the URL given,
    with the local first admin made."""
    started: list[ServerProcess] = []

    def factory(url: str) -> ServerProcess:
        node = start_server(tmp_path, ldap_args(url), auth=SECURE)
        started.append(node)
        assert call_json("POST", node.url("/nacos/v3/auth/user/admin"), data={"password": ADMIN_PW})["code"] == 0
        return node

    yield factory
    for node in started:
        kill(node)


def login(node: ServerProcess, username: str, password: str) -> tuple[int, str]:
    return call("POST", node.url("/nacos/v1/auth/login"), data={"username": username, "password": password})


def token(node: ServerProcess, username: str, password: str) -> dict[str, object]:
    return dict(call_json("POST", node.url("/nacos/v1/auth/login"), data={"username": username,
                                                                          "password": password}))


def register(node: ServerProcess, access_token: str, ip: str) -> tuple[int, str]:
    return call("POST", node.url("/nacos/v1/ns/instance"), {"serviceName": "ldap-svc", "ip": ip, "port": "80",
                                                            "accessToken": access_token})


async def test_a_directory_user_logs_in_with_the_nacos_roles_bound_to_its_ldap_name(
        slapd: Slapd, ldap_node: Callable[[str], ServerProcess], tmp_path: Path) -> None:
    node = ldap_node(slapd.url)
    alice = token(node, "alice", ALICE_PW)
    assert (alice["username"], alice["globalAdmin"]) == ("LDAP_alice", False)
    assert register(node, str(alice["accessToken"]), "10.8.0.1") == (403, "authorization failed!")  # no roles yet

    admin = str(token(node, "nacos", ADMIN_PW)["accessToken"])  # the node's own users log in first
    users = call_json("GET", node.url("/nacos/v1/auth/users"), {"accessToken": admin, "pageNo": "1",
                                                                "pageSize": "10"})
    assert sorted(u["username"] for u in users["pageItems"]) == ["LDAP_alice", "nacos"]
    for path, params in (("/nacos/v1/auth/roles", {"role": "devs", "username": "LDAP_alice"}),
                         ("/nacos/v1/auth/permissions", {"role": "devs", "resource": "public:*:*", "action": "rw"})):
        assert call("POST", node.url(path), {**params, "accessToken": admin})[0] == 200
    assert register(node, str(alice["accessToken"]), "10.8.0.1") == (200, "ok")
    upper = token(node, "ALICE", ALICE_PW)  # case.sensitive=false: the same directory user
    assert upper["username"] == "LDAP_alice" and register(node, str(upper["accessToken"]), "10.8.0.2") == (200, "ok")

    assert login(node, "alice", "wrong") == (403, "unknown user!")
    assert login(node, "carol", ALICE_PW) == (403, "unknown user!")
    assert login(node, "LDAP_alice", ALICE_PW) == (403, "unknown user!")  # never the stand-in itself
    assert token(node, "bob", "bob-in-ldap")["username"] == "LDAP_bob"

    # a stock SDK configured with the directory user's name and password logs in through LDAP
    config = (ClientConfigBuilder().server_address(node.addr).log_level("WARNING").username("alice")
              .password(ALICE_PW).log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
              .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
    sdk = await NacosNamingService.create_naming_service(config)
    try:
        assert await sdk.register_instance(RegisterInstanceParam(service_name="ldap-sdk", ip="10.8.0.3", port=1))
    finally:
        await sdk.shutdown()


def test_a_directory_that_is_down_or_hung_is_a_clear_refusal(slapd: Slapd,
                                                              ldap_node: Callable[[str], ServerProcess]) -> None:
    node = ldap_node(slapd.url)
    assert token(node, "alice", ALICE_PW)["username"] == "LDAP_alice"
    slapd.stop()
    status, text = login(node, "alice", ALICE_PW)
    assert status == 403 and f"LDAP server {slapd.url} not reachable" in text
    assert token(node, "nacos", ADMIN_PW)["globalAdmin"] is True  # local users are not held up by it

    with socket.socket() as hung:  # accepts connections (the kernel's backlog) and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        stuck = ldap_node(f"ldap://127.0.0.1:{hung.getsockname()[1]}")
        status, text = login(stuck, "alice", ALICE_PW)  # call() gives up after 10 s: a hang fails here
        assert status == 403 and "not reachable" in text
        assert call("GET", stuck.url("/nacos/v1/console/health/liveness"))[0] == 200
