"""The model's one write path (ClientManager): each change of a client publishes its events, and
no other module builds client events."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import shoal
from shoal.model.client import Publication, Subscriber
from shoal.model.events import (
    ClientChanged,
    ClientDeregisteredService,
    ClientRegisteredService,
    ClientSubscribedService,
    ClientUnsubscribedService,
    InstanceHealthChanged,
    ServiceChanged,
)
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey

from .conftest import Registry

A = ServiceKey("public", "G", "a")
B = ServiceKey("public", "G", "b")
CLIENT_EVENTS = (ClientRegisteredService, ClientDeregisteredService, ClientChanged, ClientSubscribedService,
                 ClientUnsubscribedService, InstanceHealthChanged)


def record(registry: Registry) -> list[Any]:
    events: list[Any] = []
    for t in (*CLIENT_EVENTS, ServiceChanged):
        registry.bus.subscribe(t, events.append)
    return events


def client_events(events: list[Any]) -> list[type]:
    return [type(e) for e in events if not isinstance(e, ServiceChanged)]


def pub(*ports: int, batch: bool = False) -> Publication:
    return Publication(tuple(InstanceInfo("10.0.0.1", p) for p in ports), batch)


def test_publish_changes_the_client_and_publishes_register_then_changed(registry: Registry) -> None:
    client = registry.connect("c")
    events = record(registry)
    assert registry.clients.publish(client, A, pub(1), now_ms=7)
    assert client.publications[A] == pub(1) and client.revision == 1 and client.last_updated_ms == 7
    assert client_events(events) == [ClientRegisteredService, ClientChanged]
    assert registry.index.publishers_of(A) == {"c"}
    events.clear()
    assert not registry.clients.publish(client, A, pub(1), now_ms=8)  # unchanged: nothing happens
    assert events == [] and client.revision == 1


def test_unpublish_carries_the_removed_instances(registry: Registry) -> None:
    client = registry.connect("c")
    registry.clients.publish(client, A, pub(1, 2, batch=True), now_ms=1)
    events = record(registry)
    removed = registry.clients.unpublish(client, A, now_ms=2)
    assert removed == pub(1, 2, batch=True) and A not in client.publications and client.revision == 2
    assert client_events(events) == [ClientDeregisteredService, ClientChanged]
    assert [(i.ip, i.port) for i in events[-2].instances] == [("10.0.0.1", 1), ("10.0.0.1", 2)]
    assert registry.index.publishers_of(A) == set()
    events.clear()
    assert registry.clients.unpublish(client, A, now_ms=3) is None
    assert events == []


def test_replace_republishes_changed_removes_vanished_and_takes_the_given_revision(registry: Registry) -> None:
    client = registry.connect("c")
    registry.clients.publish(client, A, pub(1), now_ms=1)
    registry.clients.publish(client, B, pub(2), now_ms=1)
    events = record(registry)
    assert registry.clients.replace(client, {A: pub(3)}, now_ms=5, revision=40)
    assert client.publications == {A: pub(3)} and client.revision == 40 and client.last_updated_ms == 5
    assert client_events(events) == [ClientRegisteredService, ClientDeregisteredService, ClientChanged]
    deregistered = [e for e in events if isinstance(e, ClientDeregisteredService)]
    assert [(e.service, [i.port for i in e.instances]) for e in deregistered] == [(B, [2])]
    events.clear()
    assert not registry.clients.replace(client, {A: pub(3)}, now_ms=6, revision=40)
    assert registry.clients.replace(client, {A: pub(3)}, now_ms=7, revision=41)  # revision only
    assert events == [] and client.revision == 41
    assert registry.clients.replace(client, {}, now_ms=8)  # no revision given: it moves by one
    assert client.revision == 42 and client.publications == {}


def test_set_health_flips_every_instance_and_publishes_health_service_and_client_events(registry: Registry) -> None:
    client = registry.connect("c")
    registry.clients.publish(client, A, pub(1, 2, batch=True), now_ms=1)
    events = record(registry)
    assert registry.clients.set_health(client, A, False, wall_ms=1234)
    assert [i.healthy for i in client.publications[A].instances] == [False, False]
    assert client.publications[A].batch and client.revision == 2
    assert [type(e) for e in events] == [InstanceHealthChanged, ServiceChanged, ClientChanged]
    assert events[1].changed_at_ms == 1234
    events.clear()
    assert not registry.clients.set_health(client, A, False, wall_ms=1235)
    assert not registry.clients.set_health(client, B, True, wall_ms=1235)  # nothing published there
    assert events == []


def test_subscribe_and_unsubscribe_publish_their_events(registry: Registry) -> None:
    client = registry.connect("c")
    events = record(registry)
    subscriber = Subscriber("10.0.0.1", "agent", "app", A)
    assert registry.clients.subscribe(client, subscriber, now_ms=3)
    assert not registry.clients.subscribe(client, subscriber, now_ms=4)
    assert [(type(e), e.first) for e in events] == [(ClientSubscribedService, True), (ClientSubscribedService, False)]
    assert registry.index.subscribers_of(A) == {"c"}
    events.clear()
    assert registry.clients.unsubscribe(client, A, now_ms=5)
    assert not registry.clients.unsubscribe(client, A, now_ms=6)
    assert client_events(events) == [ClientUnsubscribedService]
    assert registry.index.subscribers_of(A) == set() and client.subscriptions == {}


def test_only_the_model_writer_builds_client_events() -> None:
    names = {t.__name__ for t in CLIENT_EVENTS}
    root = Path(shoal.__file__).parent
    writers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                writers.add(path.relative_to(root).as_posix())
    assert writers == {"model/clients.py"}


#: Replicated fields of a client that only the client manager writes, and of a service record
#: that only the service manager writes (each write there publishes its event).
CLIENT_FIELDS = {"publications", "subscriptions", "native", "owner", "last_renew_ms", "revision"}
SERVICE_FIELDS = {"ephemeral", "protect_threshold", "metadata", "has_metadata"}


def _field_writes(tree: ast.AST, fields: set[str]) -> list[tuple[int, str]]:
    """(line, field) of every ``x.field = …`` / ``x.field += …`` whose ``x`` is not ``self``, and
    of every in-place change of such a field (``x.field[k] = …``, ``x.field.pop(…)``…)."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("pop", "update", "clear", "setdefault", "popitem")):
            targets = [node.func.value]
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if (isinstance(target, ast.Attribute) and target.attr in fields
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")):
                found.append((node.lineno, target.attr))
    return found


def test_only_the_model_writers_change_replicated_client_and_service_fields() -> None:
    root = Path(shoal.__file__).parent
    writers: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fields, owner in ((CLIENT_FIELDS, "model/clients.py"), (SERVICE_FIELDS, "model/services.py")):
            if rel != owner:
                writers.setdefault(rel, []).extend(_field_writes(tree, fields))
    assert {rel: lines for rel, lines in writers.items() if lines} == {}


def test_the_scan_sees_each_kind_of_write() -> None:
    source = ("client.native = True\nrecord.metadata['k'] = 'v'\nc.revision += 1\nr.metadata.update(x)\n"
              "self.native = False\nother.name = 1\n")
    assert _field_writes(ast.parse(source), CLIENT_FIELDS | SERVICE_FIELDS) == [
        (1, "native"), (2, "metadata"), (3, "revision"), (4, "metadata")]


def test_ownership_mutators_publish_only_real_changes(registry: Registry) -> None:
    from shoal.model.events import ClientOwnershipChanged

    client = registry.connect("c")
    events: list[Any] = []
    registry.bus.subscribe(ClientOwnershipChanged, events.append)
    assert registry.clients.set_native(client, False) and not client.native
    assert not registry.clients.set_native(client, False)
    assert registry.clients.set_owner(client, "10.0.0.2:8848") and client.owner == "10.0.0.2:8848"
    assert not registry.clients.set_owner(client, "10.0.0.2:8848")
    registry.clients.renew(client, 99)
    assert client.last_renew_ms == 99
    assert [e.client for e in events] == [client, client]


def test_service_record_update_publishes_service_changed_once_per_change(registry: Registry) -> None:
    registry.services.get_or_create(A, now_ms=1)
    events = record(registry)
    assert registry.services.update(A, 50, protect_threshold=0.5, metadata={"k": "v"}, has_metadata=True)
    record_a = registry.services.get(A)
    assert record_a is not None and record_a.protect_threshold == 0.5 and record_a.metadata == {"k": "v"}
    assert record_a.has_metadata and record_a.ephemeral
    assert [(type(e), e.changed_at_ms) for e in events] == [(ServiceChanged, 50)]
    assert record_a.last_change_ms == 50  # the views saw it
    events.clear()
    assert not registry.services.update(A, 60, protect_threshold=0.5, metadata={"k": "v"})  # nothing new
    assert not registry.services.update(B, 60, ephemeral=False)  # no such record
    assert events == []
    assert registry.services.update(A, 70, ephemeral=False)
    assert not record_a.ephemeral and len(events) == 1


def test_an_operator_edit_changes_through_its_one_writer_which_publishes_service_changed(registry: Registry) -> None:
    from shoal.model.overlays import InstanceOverlay

    target = ("10.0.0.1", 1, "DEFAULT")
    client = registry.connect("c")
    registry.clients.publish(client, A, pub(1), now_ms=1)
    events = record(registry)
    assert registry.overlays.set(A, target, InstanceOverlay(weight=2.0), wall_ms=10)
    assert [(type(e), e.service, e.changed_at_ms) for e in events] == [(ServiceChanged, A, 10)]
    assert [i.weight for i in registry.storage.view(A).instances] == [2.0]  # the view was dropped and rebuilt
    assert client.publications[A] == pub(1)  # the client's publication is not the edit's to change
    events.clear()
    assert not registry.overlays.set(A, target, InstanceOverlay(weight=2.0), wall_ms=11)  # nothing new
    assert not registry.overlays.set(B, target, None, wall_ms=11)  # nothing to remove
    assert events == []
    assert registry.overlays.set(A, target, InstanceOverlay(), wall_ms=12)  # empty: removed
    assert registry.overlays.of(A) is None and [type(e) for e in events] == [ServiceChanged]
    assert [i.weight for i in registry.storage.view(A).instances] == [1.0]
