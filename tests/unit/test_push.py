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


# --- issue 23: no push for nothing, empty-push protection, push lag ----------------------------------
def _subscribed(registry: Registry, sender: FakeSender, **kw: object) -> PushService:
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.connect("pub")
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", 80))
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    return push


async def _step(push: PushService) -> None:
    push.process_due()
    await settle()


async def test_a_change_that_leaves_the_subscribers_list_as_it_was_pushes_nothing() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    metrics = Metrics()
    push = _subscribed(registry, sender)
    push.metrics = metrics
    await _step(push)
    assert len(sender.sent) == 1
    # a service metadata edit changes the record but nothing a ServiceInfo carries
    registry.services.update(SVC, registry.clock.now_ms(), metadata={"owner": "team-a"})
    # the same instance registered again by another client: the deduplicated list is the same
    registry.connect("pub2")
    registry.naming.ephemeral.register_instance("pub2", SVC, InstanceInfo("10.0.0.1", 80))
    registry.clock.advance(5)  # lastRefTime moves; the digest leaves it out
    await _step(push)
    assert len(sender.sent) == 1
    assert 'shoal_push_total{result="unchanged"}' in metrics.render().decode()
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", 80, weight=2.0))
    await _step(push)  # a real change: pushed once
    assert len(sender.sent) == 2 and any(h["weight"] == 2.0 for h in sender.sent[1][1]["hosts"])


async def test_a_new_subscription_gets_its_list_again_and_a_failed_push_is_not_remembered() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    push = _subscribed(registry, sender)
    await _step(push)
    registry.naming.subscriptions.unsubscribe("sub", SVC, "")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    await _step(push)
    assert len(sender.sent) == 2  # same list, but the new subscription is owed its first push
    sender.results = [False]  # the next push fails: what was sent is not what the subscriber holds
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.2", 80))
    await _step(push)
    registry.clock.advance(registry.config.push_task_retry_delay_ms)
    await _step(push)
    assert len(sender.sent) == 4 and sender.sent[3][1]["hosts"][0]["ip"] == "10.0.0.2"


async def test_empty_push_protection_withholds_the_empty_list_until_hosts_come_back() -> None:
    registry = make_registry(push_task_delay_ms=0, push_empty_protection=True)
    sender = FakeSender()
    push = _subscribed(registry, sender)
    push.services = registry.services
    await _step(push)
    registry.naming.ephemeral.deregister_instance("pub", SVC)
    await _step(push)
    assert [len(info["hosts"]) for _, info in sender.sent] == [1]  # the empty list was withheld
    assert push.protected_services() == [SVC]
    assert registry.naming.reads.push_payload(SVC, "").endswith('"hosts":[]}')  # queries answer the truth
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.7", 80))
    await _step(push)
    assert [info["hosts"][0]["ip"] for _, info in sender.sent] == ["10.0.0.1", "10.0.0.7"]
    assert push.protected_services() == []


async def test_service_metadata_turns_empty_push_protection_on_or_off_per_service() -> None:
    other = ServiceKey("public", "DEFAULT_GROUP", "other")
    registry = make_registry(push_task_delay_ms=0)  # off by default
    sender = FakeSender()
    push = _subscribed(registry, sender)
    push.services = registry.services
    registry.naming.ephemeral.register_instance("pub", other, InstanceInfo("10.0.0.2", 80))
    registry.naming.subscriptions.subscribe("sub", other, "", "10.9.9.9", "a", "b")
    registry.services.update(SVC, 0, metadata={"shoal.push.empty-protection": "true"})
    await _step(push)
    registry.naming.ephemeral.deregister_instance("pub", SVC)
    registry.naming.ephemeral.deregister_instance("pub", other)
    await _step(push)
    assert sorted((info["name"], len(info["hosts"])) for _, info in sender.sent) == [
        ("other", 0), ("other", 1), ("svc", 1)]
    assert push.protected_services() == [SVC]
    registry.services.update(SVC, 0, metadata={"shoal.push.empty-protection": "false"})
    assert push.protected_services() == []


async def test_a_first_list_without_hosts_is_pushed_even_when_protected() -> None:
    registry = make_registry(push_task_delay_ms=0, push_empty_protection=True)
    sender = FakeSender()
    push = make_push(registry, sender)
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", SVC, "", "10.9.9.9", "a", "b")
    await _step(push)
    assert [len(info["hosts"]) for _, info in sender.sent] == [0]  # it never had a list to keep


async def test_push_lag_shows_pending_then_the_acked_lag_in_bounded_windows() -> None:
    registry = make_registry(push_task_delay_ms=0)
    sender = FakeSender()
    sender.hold = asyncio.Event()
    metrics = Metrics()
    push = _subscribed(registry, sender)
    push.metrics = metrics
    assert push.lag_of("sub", SVC) is None
    await _step(push)
    registry.clock.advance(40)
    lag = push.lag_of("sub", SVC)
    assert lag is not None and (lag.pending, lag.pending_for_ms, lag.last_ms) == (1, 40, None)
    registry.clock.advance(30)  # still no ack: the wait grows
    assert push.lag_of("sub", SVC).pending_for_ms == 70  # type: ignore[union-attr]
    assert push.lag_summary()["slowest"][0] == {"clientId": "sub", "p99Ms": None, "lastMs": None,
                                                "pending": 1, "oldestPendingMs": 70}
    sender.hold.set()
    await settle()
    lag = push.lag_of("sub", SVC)
    assert lag is not None and (lag.pending, lag.pending_for_ms, lag.last_ms, lag.p99_ms, lag.acks) == (0, 0, 70, 70, 1)
    page = metrics.render().decode()
    assert 'shoal_push_ack_seconds_count{namespace="public",transport="grpc"} 1.0' in page
    for port in range(1, 200):  # many acks: the window stays bounded
        registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", port))
        await _step(push)
    assert len(push._state["sub"].lags) == 64
    assert push.lag_summary()["acks"] == 64


async def test_a_subscriber_given_up_on_keeps_showing_its_unacked_change() -> None:
    registry = make_registry(push_task_delay_ms=0, push_max_retries=0)
    sender = FakeSender()
    sender.results = [TimeoutError()]
    push = _subscribed(registry, sender)
    await _step(push)
    registry.clock.advance(25)
    lag = push.lag_of("sub", SVC)
    assert lag is not None and (lag.pending, lag.pending_for_ms) == (1, 25)
    registry.naming.ephemeral.register_instance("pub", SVC, InstanceInfo("10.0.0.1", 81))
    await _step(push)  # acked at last: the lag counts from the first change it missed
    assert push.lag_of("sub", SVC).last_ms == 25  # type: ignore[union-attr]
