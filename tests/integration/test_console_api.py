"""Console APIs against real `shoal server` processes: the users / roles search of the Nacos auth
plugin (v1 bare lists, v3 Results) with auth on, and the per-member Distro figures of the
cluster page on a real 3-node cluster."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, ServerProcess, ServerSet, free_port_blocks, poll_until
from shoal.testing.auth import PASSWORD
from shoal.testing.http import call as http

from . import test_auth_e2e

auth_server = test_auth_e2e.auth_server  # `shoal server --auth` with an admin `nacos`
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def login(server: ServerProcess, username: str, password: str) -> str:
    status, text = http("POST", server.url("/nacos/v1/auth/login"), {"username": username, "password": password})
    assert status == 200, text
    return str(json.loads(text)["accessToken"])


def call(server: ServerProcess, method: str, path: str, token: str, **params: str) -> tuple[int, Any]:
    status, text = http(method, server.url(path), {"accessToken": token, **params})
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def test_users_and_roles_search_admin_only_with_nacos_shapes(auth_server: Callable[..., ServerProcess]) -> None:
    server = auth_server()
    admin = login(server, "nacos", PASSWORD)
    for user in ("alice", "alina", "bob", "Alfred"):
        assert call(server, "POST", "/nacos/v1/auth/users", admin, username=user, password="pw-" + user)[0] == 200
    for role, user in (("ops", "alice"), ("ops", "bob"), ("dev-ops", "alina"), ("reader", "bob")):
        assert call(server, "POST", "/nacos/v1/auth/roles", admin, role=role, username=user)[0] == 200

    # v1: a bare JSON list of names, contained anywhere, case-insensitive, '*' as wildcard.
    assert call(server, "GET", "/nacos/v1/auth/users/search", admin, username="al") == (
        200, ["Alfred", "alice", "alina"])
    assert call(server, "GET", "/nacos/v1/auth/users/search", admin, username="a*i") == (200, ["alice", "alina"])
    assert call(server, "GET", "/nacos/v1/auth/roles/search", admin, role="ops") == (200, ["dev-ops", "ops"])
    assert call(server, "GET", "/nacos/v1/auth/roles/search", admin, role="OPS") == (200, ["dev-ops", "ops"])
    # empty matches every name; odd input matches nothing and is answered cleanly
    status, everyone = call(server, "GET", "/nacos/v1/auth/users/search", admin, username="")
    assert status == 200 and set(everyone) == {"nacos", "alice", "alina", "bob", "Alfred"}
    # SQL's wildcards are plain characters here: '_' is an underscore, '%' a percent sign
    assert call(server, "GET", "/nacos/v1/auth/roles/search", admin, role="_") == (200, ["ROLE_ADMIN"])
    for odd in ("%", "(", "[a-z]+", ".*", "\\", "x" * 5000, "ü'\";--"):
        assert call(server, "GET", "/nacos/v1/auth/users/search", admin, username=odd) == (200, []), odd
        assert call(server, "GET", "/nacos/v1/auth/roles/search", admin, role=odd) == (200, []), odd
    # the parameter itself is required (Spring's @RequestParam): 400 naming it
    status, text = call(server, "GET", "/nacos/v1/auth/users/search", admin)
    assert status == 400 and "username" in str(text)
    status, text = call(server, "GET", "/nacos/v1/auth/roles/search", admin)
    assert status == 400 and "role" in str(text)

    # v3: the same names in a Result
    assert call(server, "GET", "/nacos/v3/auth/user/search", admin, username="ali") == (
        200, {"code": 0, "message": "success", "data": ["alice", "alina"]})
    assert call(server, "GET", "/nacos/v3/auth/role/search", admin, role="read") == (
        200, {"code": 0, "message": "success", "data": ["reader"]})
    status, answer = call(server, "GET", "/nacos/v3/auth/role/search", admin)
    assert status == 400 and answer["code"] == 10000 and "role" in answer["data"]  # PARAMETER_MISSING

    # admin only: a user without ROLE_ADMIN, and no token at all, are refused 403
    bob = login(server, "bob", "pw-bob")
    for path, param in (("/nacos/v1/auth/users/search", "username"), ("/nacos/v1/auth/roles/search", "role"),
                        ("/nacos/v3/auth/user/search", "username"), ("/nacos/v3/auth/role/search", "role")):
        assert call(server, "GET", path, bob, **{param: "a"})[0] == 403, path
        status, _text = http("GET", server.url(path), {param: "a"})
        assert status == 403, path


def distro_figures(server: ServerProcess) -> dict[str, Any]:
    status, text = http("GET", server.url("/nacos/v1/console/cluster/distro"))
    assert status == 200, text
    answer: dict[str, Any] = json.loads(text)
    return answer


def register(server: ServerProcess, ip: str, port: int) -> None:
    query = urllib.parse.urlencode({"serviceName": "figures", "ip": ip, "port": str(port), "ephemeral": "true"})
    status, text = http("POST", server.url(f"/nacos/v1/ns/instance?{query}"))
    assert (status, text) == (200, "ok")


def test_cluster_distro_figures_per_member(tmp_path: Path) -> None:
    ports = free_port_blocks(3)
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    fast = ["-D", "nacos.core.protocol.distro.data.verify.intervalMs=300", "-D", "shoal.member.report-interval-ms=200"]
    with ServerSet(tmp_path, auth=OPEN) as servers:
        nodes = [servers.start(port, ["--members", members, *fast]) for port in ports]
        for node in nodes:
            node.wait_ready()
        # ip:port instances are owned by the node the Distro mapper names: each lands on its owner
        for n in range(12):
            register(nodes[0], f"10.9.0.{n + 1}", 9000)
        addresses = [f"127.0.0.1:{p}" for p in ports]

        def settled() -> dict[str, Any] | None:
            figures = distro_figures(nodes[0])
            rows = {m["address"]: m for m in figures["members"]}
            if set(rows) != set(addresses) or any(m["state"] != "UP" for m in rows.values()):
                return None
            if sum(m["clientsOwned"] for m in rows.values()) != 12:
                return None
            if any((rows[a]["lastVerify"] or {}).get("result") not in ("ok", "repaired") for a in addresses[1:]):
                return None
            if any(rows[a]["syncQueue"] != 0 for a in addresses[1:]):
                return None  # the registrations' syncs may still be queued on a loaded box
            return figures

        figures = poll_until(settled, timeout=30,
                             what="three members UP, 12 clients, a verify with each peer, sync queues drained")
        assert figures["self"] == addresses[0] and figures["loaded"] is True
        rows = {m["address"]: m for m in figures["members"]}
        me = rows[addresses[0]]
        assert me["self"] is True and me["syncQueue"] is None and me["lastVerify"] is None
        for peer in addresses[1:]:
            row = rows[peer]
            assert row["self"] is False and row["syncQueue"] == 0
            assert row["lastVerify"]["result"] in ("ok", "repaired") and row["lastVerify"]["time"] > 0
            assert row["lastSyncFailure"] is None
        assert set(figures["node"]) >= {"transport", "kernels", "settings"}
        settings = {s["property"]: s for s in figures["node"]["settings"]}
        assert settings["nacos.core.protocol.distro.data.verify.intervalMs"]["value"] == 300
        assert "nacos.core.protocol.distro.data.sync.delayMs" in settings  # Distro settings always shown

        # A peer goes away: node 0's view shows it leave UP, and the sync towards it failing.
        nodes[2].kill()
        for n in range(12, 40):
            register(nodes[0], f"10.9.0.{n + 1}", 9000)

        def peer_failed() -> dict[str, Any] | None:
            row = {m["address"]: m for m in distro_figures(nodes[0])["members"]}[addresses[2]]
            return row if row["state"] != "UP" and row["lastFailure"] is not None else None

        row = poll_until(peer_failed, timeout=30, what="node 2 seen failing by node 0")
        assert row["lastFailure"]["time"] > 0 and row["lastFailure"]["reason"]
