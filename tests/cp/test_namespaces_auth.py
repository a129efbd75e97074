"""Namespaces and auth data over real stores (SQLite file, real etcd): validation, one winner
for concurrent creates, optimistic edits, and two nodes' views of one store agreeing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shoal.auth.cpdata import AuthData
from shoal.auth.service import naming_resource
from shoal.cp.store import CpStore, Keyspace, json_view
from shoal.errors import IllegalNamespace, InvalidParam, MissingParam, NamespaceAlreadyExist, NamespaceNotExist
from shoal.service_layer.namespaces import NamespaceService
from shoal.testing.wait import wait_until


@pytest.fixture(params=["embedded", "etcd"])
def store(request: pytest.FixtureRequest) -> CpStore:
    name = "embedded_store" if request.param == "embedded" else "etcd_store"
    fixture: CpStore = request.getfixturevalue(name)
    return fixture


@pytest.fixture
async def two_nodes(store: CpStore) -> AsyncIterator[tuple[NamespaceService, NamespaceService]]:
    views = [json_view(store, Keyspace.NAMESPACES) for _ in range(2)]
    for view in views:
        view.start()
        await view.wait_ready(10)
    try:
        yield NamespaceService(views[0]), NamespaceService(views[1])
    finally:
        for view in views:
            await view.stop()


async def test_namespace_rules(two_nodes: tuple[NamespaceService, NamespaceService]) -> None:
    a, _ = two_nodes
    for bad_id in ("a b", "x" * 129, "é"):
        with pytest.raises(IllegalNamespace):
            await a.create(bad_id, "n", None)
    for bad_name in ("a@b", "50%", "n" * 129, ""):
        with pytest.raises(IllegalNamespace):
            await a.create("ok", bad_name, None)
    with pytest.raises(MissingParam):
        await a.create("ok", None, None)
    for public in ("public", " "):
        with pytest.raises(IllegalNamespace):
            await a.edit(public, "mine", None)
    with pytest.raises(IllegalNamespace):
        await a.delete("public")
    with pytest.raises(NamespaceAlreadyExist):
        await a.create("public", "again", None)
    assert await a.create("  x-1_y  ", "X", None) == "x-1_y"  # trimmed, \w and -
    assert len(await a.create("", "generated", None)) == 36  # a UUID
    with pytest.raises(NamespaceNotExist):
        a.get("absent")
    with pytest.raises(NamespaceNotExist):
        await a.edit("absent", "n", None)
    assert not await a.delete("absent")


async def test_two_nodes_one_winner_and_shared_edits(two_nodes: tuple[NamespaceService, NamespaceService]) -> None:
    a, b = two_nodes
    results = await asyncio.gather(a.create("race", "A", None), b.create("race", "B", None), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["NamespaceAlreadyExist", "str"]
    await wait_until(lambda: b.exists("race") and a.exists("race"), timeout=15.0, what="both views")
    await b.edit("race", "Renamed", "d")
    await wait_until(lambda: a.get("race")["namespaceShowName"] == "Renamed", timeout=15.0, what="the edit on A")
    assert [n["namespace"] for n in a.list()] == ["", "race"]
    assert await a.delete("race")
    await wait_until(lambda: not b.exists("race"), timeout=15.0, what="the delete on B")


async def test_auth_data_is_shared_and_the_token_key_has_one_winner(store: CpStore) -> None:
    a, b = AuthData(store), AuthData(store)
    for data in (a, b):
        data.start()
        await data.wait_ready(10)
    try:
        keys = await asyncio.gather(a.token_key(), b.token_key(), a.token_key(b"c" * 32))
        assert keys[0] == keys[1] == keys[2]
        await a.add_user("dev", "hash")
        with pytest.raises(InvalidParam, match="already exist"):
            await b.add_user("dev", "other")
        await wait_until(lambda: b.has_user("dev"), timeout=15.0, what="dev on B")
        await b.add_role("devs", "dev")
        await b.add_permission("devs", "dev:*:*", "r")
        resource = naming_resource("dev", "G", "svc")
        await wait_until(lambda: a.allowed("dev", resource, "r"), timeout=15.0, what="the grant on A")
        assert not a.allowed("dev", resource, "w")
        await a.delete_role("devs")  # the role, its bindings and its permissions
        await wait_until(lambda: not b.allowed("dev", resource, "r") and not b.permissions(), timeout=15.0,
                         what="revoked on B")
        await b.grant_admin("dev")
        await wait_until(lambda: a.is_global_admin("dev") and a.has_admin(), timeout=15.0, what="admin on A")
        with pytest.raises(InvalidParam, match="cannot delete admin"):
            await a.delete_user("dev")
    finally:
        await a.stop()
        await b.stop()

