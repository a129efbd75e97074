"""Push engine: coalescing, targeted first-subscribe pushes, bounded retry and backlog."""

from __future__ import annotations

import asyncio
import json

from shoal.metrics import Metrics, NamingFigures
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.push.service import PushGone, PushService
from shoal.testing import Registry, make_registry

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


class FakeSender:
    """In-memory PushSender: records pushes; answers from a script or holds them open."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.results: list[object] = []  # True/False/exception per push, default True
        self.hold: asyncio.Event | None = None

    async def send_push(self, client_id: str, service_info_json: str, timeout_ms: int) -> bool:
        self.sent.append((client_id, json.loads(service_info_json)))
        if self.hold is not None:
            await self.hold.wait()
        result = self.results.pop(0) if self.results else True
        if isinstance(result, BaseException):
            raise result
        return bool(result)


def make_push(registry: Registry, sender: FakeSender) -> PushService:
    def payload(client_id: str, service: ServiceKey) -> str | None:
        client = registry.clients.get(client_id)
        sub = client.subscriptions.get(service) if client else None
        return registry.naming.reads.push_payload(service, sub.clusters) if sub else None

    return PushService(registry.live, registry.clock, registry.bus, sender, registry.index.subscribers_of, payload)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_changes_within_the_delay_coalesce_into_one_push() -> None:
    registry = make_registry(push_task_delay_ms=100)
    sender = FakeSender()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    for i in range(5):
        registry.connect(f"pub{i}")
        registry.naming.ephemeral.register_instance(f"pub{i}", SVC, InstanceInfo(f"10.0.0.{i}", 80))
        registry.clock.advance(10)
    assert push.process_due() == 0  # not due yet: 50 ms < 100 ms
    registry.clock.advance(50)
    assert push.process_due() == 1
    await settle()
    assert len(sender.sent) == 1
    client_id, info = sender.sent[0]
    assert client_id == "sub" and len(info["hosts"]) == 5 and info["clusters"] == ""


async def test_push_carries_the_subscribers_clusters_filter() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.connect("pub")
    registry.naming.subscriptions.subscribe("sub", SVC, "a", "10.9.9.9", "a", "b")
    registry.naming.ephemeral.batch_register_instances("pub", SVC, [InstanceInfo("10.0.0.1", 1, cluster="a"),
                                                          InstanceInfo("10.0.0.2", 2, cluster="b")])
    push.process_due()
    await settle()
    # the first-subscribe push and the change push were merged: one push, cluster-filtered
    assert len(sender.sent) == 1
    assert sender.sent[0][1]["clusters"] == "a"
    assert [h["ip"] for h in sender.sent[0][1]["hosts"]] == ["10.0.0.1"]


async def test_failed_push_is_retried_a_bounded_number_of_times() -> None:
    registry = make_registry(push_task_delay_ms=0, push_task_retry_delay_ms=1000, push_max_retries=2)
    sender = FakeSender()
    sender.results = [False, TimeoutError(), False, True]
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    push.process_due()
    await settle()
    assert len(sender.sent) == 1
    for expected in (2, 3):
        registry.clock.advance(999)
        push.process_due()
        await settle()
        assert len(sender.sent) == expected - 1  # retry waits the full retry delay
        registry.clock.advance(1)
        push.process_due()
        await settle()
        assert len(sender.sent) == expected
    registry.clock.advance(10_000)
    push.process_due()
    await settle()
    assert len(sender.sent) == 3  # gave up after 1 try + 2 retries
    assert push.pending == {}


async def test_gone_connection_is_not_retried() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    sender.results = [PushGone("gone")]
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    push.process_due()
    await settle()
    registry.clock.advance(60_000)
    push.process_due()
    await settle()
    assert len(sender.sent) == 1 and push.pending == {}


async def test_change_during_inflight_push_is_sent_after_the_ack_with_newest_data() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    sender.hold = asyncio.Event()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.connect("pub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    push.process_due()
    await settle()
    assert len(sender.sent) == 1
    for port in (1, 2, 3):  # three changes while the first push is unacknowledged
        registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", port))
        push.process_due()
        await settle()
    assert len(sender.sent) == 1
    sender.hold.set()
    await settle()
    assert len(sender.sent) == 2  # one more push, not three
    assert [h["port"] for h in sender.sent[1][1]["hosts"]] == [3]


async def test_backlog_per_connection_is_bounded() -> None:
    registry = make_registry(push_task_delay_ms=0, push_backlog_per_connection=2)
    sender = FakeSender()
    sender.hold = asyncio.Event()
    push = make_push(registry, sender)
    registry.connect("sub")
    services = [ServiceKey("public", "G", f"s{i}") for i in range(6)]
    for service in services:
        registry.naming.subscriptions.subscribe("sub", service, "", "10.9.9.9", "a", "b")
    push.process_due()
    await settle()
    assert len(sender.sent) == 2
    assert push.backlog()["inflight"] == 2 and push.backlog()["dirty"] == 4
    sender.hold.set()
    for _ in range(6):
        await settle()
    assert sorted(info["name"] for _, info in sender.sent) == sorted(s.name for s in services)


async def test_unsubscribed_or_disconnected_targets_are_skipped() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.connect("pub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    registry.clients.remove("sub", "test")
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", 1))
    push.process_due()
    await settle()
    assert sender.sent == []


async def test_runner_fires_by_itself_on_the_real_clock() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    push.start()
    try:
        async with asyncio.timeout(5):
            while not sender.sent:
                await asyncio.sleep(0.001)
    finally:
        await push.stop()
    assert sender.sent[0][0] == "sub"


async def test_changes_of_services_nobody_subscribes_to_schedule_nothing() -> None:
    registry = make_registry()
    push = make_push(registry, FakeSender())
    registry.connect("pub")
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", 1))
    assert push.pending == {}


async def test_pushes_of_no_hosts_are_counted_as_empty() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    metrics = Metrics()
    metrics.add_naming(NamingFigures)
    push = make_push(registry, sender)
    push.metrics = metrics
    registry.connect("sub")
    registry.connect("pub")
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", 80))
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    push.process_due()
    await settle()
    registry.naming.ephemeral.deregister_instance("pub", SVC)
    push.process_due()
    await settle()
    assert [len(info["hosts"]) for _, info in sender.sent] == [1, 0]
    page = metrics.render().decode()
    assert 'nacos_monitor{module="naming",name="totalPush"} 2.0' in page
    assert 'nacos_monitor{module="naming",name="emptyPush"} 1.0' in page


async def test_default_window_pushes_at_once_and_still_merges_a_burst() -> None:
    """The default pushTaskDelay adds no wait (push p99 <= 10 ms); changes made before
    the engine runs still travel in one push, and changes while a push is unacknowledged in one more."""
    registry = make_registry()  # the default push_task_delay_ms
    sender = FakeSender()
    sender.hold = asyncio.Event()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    for i in range(5):  # a burst within one loop turn
        registry.connect(f"pub{i}")
        registry.naming.ephemeral.register_instance(f"pub{i}", SVC, InstanceInfo(f"10.0.0.{i}", 80))
    assert push.process_due() == 1  # due now: the clock did not move
    await settle()
    assert len(sender.sent) == 1 and len(sender.sent[0][1]["hosts"]) == 5
    for i in range(5):  # churn while that push waits for its ack
        registry.naming.ephemeral.deregister_instance(f"pub{i}", SVC)
        push.process_due()
        await settle()
    assert len(sender.sent) == 1
    sender.hold.set()
    await settle()
    assert len(sender.sent) == 2 and sender.sent[1][1]["hosts"] == []
