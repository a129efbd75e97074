"""Operators' edits of ephemeral instances (issue 22): kept in the CP store (a real embedded one)
apart from the client's publication, laid over whatever publication carries the ``ip:port`` on
every read, kept when another client registers it again, cleaned after the expired-metadata delay,
and written by every operator route (v1 PUT and the console's PATCH, v2 PATCH, the metadata batch,
v3 admin PUT) through the one use case."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from shoal.cp.store import Keyspace
from shoal.errors import NotFound
from shoal.model.client import Publication
from shoal.model.events import ServiceChanged
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.overlays import InstanceOverlay
from shoal.service_layer.switches import Switches
from shoal.testing import OPEN_SETTINGS, Registry, make_registry
from shoal.transport.http.console_api import ConsoleRoutes
from shoal.transport.http.forward import Forwarder, Standalone
from shoal.transport.http.naming import NamingRoutes
from shoal.transport.http.operator import OperatorRoutes
from shoal.transport.http.routes import ADMIN
from shoal.transport.http.server import HttpServer
from shoal.transport.http.v3_naming import V3NamingRoutes

SVC = ServiceKey("public", "DEFAULT_GROUP", "web")
IP, PORT = "10.1.0.1", 8080
NAME = f"public/DEFAULT_GROUP@@web/DEFAULT/{IP}:{PORT}"


def publish(registry: Registry, client_id: str, weight: float = 1.0, **metadata: str) -> None:
    """A gRPC client ``client_id`` (connected if new) registers the instance, as an SDK (or its redo)."""
    if registry.clients.get(client_id) is None:
        registry.connect(client_id)
    registry.naming.instance_ops.register_connection(client_id, SVC, InstanceInfo(IP, PORT, weight, metadata=metadata))


def shown(registry: Registry) -> tuple[bool, float, dict[str, str]] | None:
    """(enabled, weight, metadata) of the instance as every reader gets it (the admin list)."""
    hosts = [h for h in registry.naming.reads.service_instances(SVC) if (h["ip"], h["port"]) == (IP, PORT)]
    return (hosts[0]["enabled"], hosts[0]["weight"], hosts[0]["metadata"]) if hosts else None


def pushed_ports(registry: Registry) -> list[int]:
    """What a subscriber is pushed (enabled instances only)."""
    return [h["port"] for h in json.loads(registry.naming.reads.push_payload(SVC, ""))["hosts"]]


async def test_an_edit_is_laid_over_the_publication_and_pushed(cp_registry: Registry) -> None:
    publish(cp_registry, "c1", a="1")
    changes: list[ServiceChanged] = []
    cp_registry.bus.subscribe(ServiceChanged, changes.append)
    await cp_registry.naming.instance_ops.update(SVC, IP, PORT, "DEFAULT", ephemeral=True, weight=3.5,
                                                 enabled=False, metadata={"b": "2"})
    assert shown(cp_registry) == (False, 3.5, {"a": "1", "b": "2"})
    assert pushed_ports(cp_registry) == []  # disabled: not pushed
    assert [e.service for e in changes] == [SVC]  # the change is what schedules the push
    client = cp_registry.clients.get("c1")
    assert client is not None and client.publications[SVC].instances[0].weight == 1.0  # the client's own, untouched
    assert cp_registry.overlays.get(SVC, (IP, PORT, "DEFAULT")) == InstanceOverlay(3.5, False, {"b": "2"})
    stored = await cp_registry.cp_store.get(Keyspace.INSTANCE_EDITS.key(NAME))
    assert stored is not None and json.loads(stored.value)["weight"] == 3.5
    detail = cp_registry.naming.reads.find_instance(SVC, IP, PORT, "DEFAULT")  # the detail reads it too
    assert (detail.enabled, detail.weight) == (False, 3.5)
    assert cp_registry.naming.catalog.summary(SVC).enabled_count == 0


async def test_a_patch_sets_only_what_it_is_given_and_merges_with_the_earlier_edit(cp_registry: Registry) -> None:
    publish(cp_registry, "c1")
    ops = cp_registry.naming.instance_ops
    await ops.patch(SVC, IP, PORT, "DEFAULT", weight=None, enabled=False, metadata=None)
    await ops.patch(SVC, IP, PORT, "DEFAULT", weight=3.5, enabled=None, metadata=None)
    assert shown(cp_registry) == (False, 3.5, {})
    await ops.patch(SVC, IP, PORT, "DEFAULT", weight=1.0, enabled=True, metadata=None)
    assert shown(cp_registry) == (True, 1.0, {})


async def test_the_redo_of_another_client_keeps_the_edit(cp_registry: Registry) -> None:
    """The SDK's node dies: its copy of the client goes, the client registers again on another
    node as a new client with the weight it always had; the operator's edit stays on it."""
    publish(cp_registry, "old-connection")
    await cp_registry.naming.instance_ops.update(SVC, IP, PORT, "DEFAULT", ephemeral=True, weight=3.5,
                                                 enabled=False)
    cp_registry.clients.remove("old-connection", "expired: not renewed by its owner")
    assert shown(cp_registry) is None
    publish(cp_registry, "new-connection", weight=1.0)
    assert shown(cp_registry) == (False, 3.5, {})
    assert pushed_ports(cp_registry) == []
    publish(cp_registry, "other-client-same-ip-port", weight=2.0)  # two publishers: both shown edited, once
    assert [h["weight"] for h in cp_registry.naming.reads.service_instances(SVC)] == [3.5]


async def test_every_node_sharing_the_store_shows_the_edit(cp_registry: Registry) -> None:
    other = make_registry(cp_registry.cp_store)  # a second node on the same CP store
    await other.start_cp(start_store=False)
    try:
        publish(cp_registry, "c1")
        publish(other, "c1-copy")  # its Distro copy, as the other node holds it
        await cp_registry.naming.instance_ops.update(SVC, IP, PORT, "DEFAULT", ephemeral=True, weight=2.0,
                                                     enabled=True)
        await other.edit_view.wait_revision(cp_registry.edit_view.revision, 5)
        assert shown(other) == (True, 2.0, {})
    finally:
        await other.stop_cp(stop_store=False)


async def test_removed_metadata_keys_are_hidden_when_published_and_dropped_from_the_edit(
        cp_registry: Registry) -> None:
    publish(cp_registry, "c1", team="a", zone="z")
    ops = cp_registry.naming.instance_ops
    await ops.update(SVC, IP, PORT, "DEFAULT", ephemeral=True, metadata={"env": "prod", "team": "b"})
    assert shown(cp_registry) == (True, 1.0, {"team": "b", "zone": "z", "env": "prod"})
    await ops.update(SVC, IP, PORT, "DEFAULT", ephemeral=True, metadata=None, remove_keys=("env", "zone"))
    assert shown(cp_registry) == (True, 1.0, {"team": "b"})
    assert cp_registry.overlays.get(SVC, (IP, PORT, "DEFAULT")) == InstanceOverlay(
        None, None, {"team": "b", "zone": None})


async def test_an_edit_of_an_unknown_instance_is_404_and_writes_nothing(cp_registry: Registry) -> None:
    publish(cp_registry, "c1")
    with pytest.raises(NotFound):
        await cp_registry.naming.instance_ops.update(SVC, "10.9.9.9", PORT, "DEFAULT", ephemeral=True, weight=2.0)
    assert len(cp_registry.edit_view) == 0


async def test_an_edit_whose_instance_is_gone_is_cleaned_after_the_delay(cp_registry: Registry) -> None:
    edits, clock = cp_registry.naming.edits, cp_registry.clock
    delay = cp_registry.config.expired_metadata_expired_ms
    assert (delay, cp_registry.config.expired_metadata_clean_interval_ms) == (60_000, 5_000)  # Nacos's defaults
    publish(cp_registry, "c1")
    await cp_registry.naming.instance_ops.update(SVC, IP, PORT, "DEFAULT", ephemeral=True, weight=3.5)
    assert await edits.clean() == 0  # published: kept
    cp_registry.naming.instance_ops.deregister_connection("c1", SVC)
    assert await edits.clean() == 0  # gone from now on
    clock.advance(delay - 1)
    assert await edits.clean() == 0
    publish(cp_registry, "c2")  # back within the delay: it keeps the edit, and the count starts again
    assert shown(cp_registry) == (True, 3.5, {})
    assert await edits.clean() == 0
    cp_registry.naming.instance_ops.deregister_connection("c2", SVC)
    assert await edits.clean() == 0
    clock.advance(delay)
    assert await edits.clean() == 1
    assert len(cp_registry.edit_view) == 0 and cp_registry.overlays.get(SVC, (IP, PORT, "DEFAULT")) is None
    publish(cp_registry, "c3")  # registered after the cleaning: as its client publishes it
    assert shown(cp_registry) == (True, 1.0, {})


async def test_a_persistent_instance_is_edited_in_its_own_document_and_no_edit_is_laid_over_it(
        cp_registry: Registry) -> None:
    db = ServiceKey("public", "DEFAULT_GROUP", "db")
    ops = cp_registry.naming.instance_ops
    await ops.register(db, InstanceInfo(IP, 3306), ephemeral=False)
    await ops.patch(db, IP, 3306, "DEFAULT", weight=4.0, enabled=None, metadata=None)
    [host] = cp_registry.naming.reads.service_instances(db)
    assert (host["weight"], host["ephemeral"]) == (4.0, False)
    assert len(cp_registry.edit_view) == 0  # one layer only: the instance's document


# --- every operator route writes through the one use case ---------------------------------------
class Http:
    def __init__(self, client: TestClient[Any, Any], registry: Registry) -> None:
        self.client, self.registry = client, registry

    async def call(self, method: str, path: str, **data: str) -> Any:
        resp = await (self.client.request(method, path, params=data) if method == "GET"
                      else self.client.request(method, path, data=data))
        text = await resp.text()
        assert resp.status == 200, (method, path, data, resp.status, text)
        return json.loads(text) if resp.content_type == "application/json" else text


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[Http]:
    registry = make_registry(data_dir=str(tmp_path), **OPEN_SETTINGS)
    await registry.start_cp()
    from shoal.auth.service import AuthService
    from shoal.metrics import Metrics

    auth = AuthService(registry.config, now_s=lambda: registry.clock.now_ms() / 1000)
    await auth.start()
    forwarder = Forwarder(Standalone(), registry.config.http_forward_timeout_ms, None, None)

    class Status:
        def is_serving(self) -> bool:
            return True

        def readiness_problem(self) -> str | None:
            return None

    server = HttpServer(registry.config, Status(), Metrics(), auth, forwarder)
    naming = NamingRoutes(registry.config, registry.naming, lambda: True, forwarder.owner_of)
    operator = OperatorRoutes(registry.naming, Switches(registry.live))
    v3 = V3NamingRoutes(registry.naming, naming, operator, lambda tag: "", lambda: True, forwarder.owner_of)
    server.install([*naming.routes(), *operator.routes(ADMIN), *v3.routes(ADMIN),
                    *ConsoleRoutes(registry.naming).routes()])
    client = TestClient(TestServer(server.app))
    await client.start_server()
    try:
        yield Http(client, registry)
    finally:
        await client.close()
        await auth.stop()
        await registry.stop_cp()


BASE = {"serviceName": "web", "ip": IP, "port": str(PORT)}


@pytest.mark.parametrize(("method", "path", "params"), [
    ("PATCH", "/nacos/v1/ns/instance", {"enabled": "false", "weight": "3.5"}),  # the console's
    ("PUT", "/nacos/v1/ns/instance", {"enabled": "false", "weight": "3.5"}),
    ("PATCH", "/nacos/v2/ns/instance", {"enabled": "false", "weight": "3.5"}),
    ("PUT", "/nacos/v2/ns/instance", {"enabled": "false", "weight": "3.5"}),
    ("PUT", "/nacos/v3/admin/ns/instance", {"enabled": "false", "weight": "3.5", "ephemeral": "true"}),
    ("PUT", "/nacos/v3/admin/ns/instance/partial", {"enabled": "false", "weight": "3.5"}),
])
async def test_every_edit_route_writes_the_edit_that_a_redo_keeps(http: Http, method: str, path: str,
                                                                   params: dict[str, str]) -> None:
    publish(http.registry, "c1")
    await http.call(method, path, **BASE, **params)
    assert len(http.registry.edit_view) == 1  # in the CP store, not in the client's publication
    http.registry.clients.remove("c1", "connection closed")
    publish(http.registry, "c2")  # the client's redo elsewhere
    listed = await http.call("GET", "/nacos/v1/ns/catalog/instances", serviceName="web", pageNo="1", pageSize="10")
    assert [(h["enabled"], h["weight"]) for h in listed["list"]] == [(False, 3.5)]


async def test_the_metadata_batch_writes_edits_and_removes_keys(http: Http) -> None:
    publish(http.registry, "c1", zone="z")
    batch = "/nacos/v2/ns/instance/metadata/batch"
    put = await http.call("PUT", batch, serviceName="web", metadata='{"env":"prod"}')
    assert put["data"] == {"updated": [f"{IP}:{PORT}:DEFAULT"]}
    publish(http.registry, "c1", zone="z", team="t")  # the client publishes again: the edit stays on
    assert shown(http.registry) == (True, 1.0, {"zone": "z", "team": "t", "env": "prod"})
    await http.call("DELETE", batch, serviceName="web", metadata='{"env":"","zone":""}',
                    instances=json.dumps([{"ip": IP, "port": PORT}]))
    assert shown(http.registry) == (True, 1.0, {"team": "t"})
    client = http.registry.clients.get("c1")
    assert client is not None and dict(client.publications[SVC].instances[0].metadata) == {"zone": "z", "team": "t"}
    assert client.publications[SVC] == Publication(client.publications[SVC].instances)  # as the client sent it
