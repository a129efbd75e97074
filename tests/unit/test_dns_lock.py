"""The DNS and lock modules' settings, the DNS rate limiter, and the lock rules on a real embedded
CP store with a hand-stepped clock (the wire is tested in tests/integration/test_dns.py and
test_lock.py)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import pytest

from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import Keyspace
from shoal.dns import DnsResolver, RateLimiter
from shoal.dns.resolver import UDP_EDNS_MAX, Prepared
from shoal.errors import ConfigError, InvalidParam
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.service_layer.lock import LockService, check_lock
from shoal.testing import make_registry


def test_dns_and_lock_settings_use_nacos_names_and_defaults() -> None:
    c = Config.load(env={})
    assert (c.dns_enabled, c.dns_bind_address, c.dns_port, c.dns_ttl) == (False, "127.0.0.1", 5353, 60)
    assert (c.lock_default_expire_ms, c.lock_max_expire_ms) == (30_000, 1_800_000)
    c = Config.load(env={}, overrides={"nacos.naming.dns.enabled": "true", "nacos.naming.dns.port": "1053",
                                       "nacos.naming.dns.domain-suffix": "svc.example",
                                       "nacos.naming.dns.default-group": "G", "nacos.naming.dns.namespace": "dev",
                                       "nacos.naming.dns.ttl": "5", "nacos.lock.max_expire_time": "1000"})
    assert (c.dns_enabled, c.dns_port, c.dns_domain_suffix, c.dns_default_group, c.dns_namespace, c.dns_ttl,
            c.lock_max_expire_ms) == (True, 1053, "svc.example", "G", "dev", 5, 1000)


@pytest.mark.parametrize(("prop", "value"), [
    ("nacos.naming.dns.domain-suffix", "bad suffix"),
    ("nacos.naming.dns.domain-suffix", "a..b"),
    ("nacos.naming.dns.port", "70000"),
    ("nacos.naming.dns.ttl", "-1"),
    ("nacos.naming.dns.default-group", " "),
    ("shoal.dns.rate-limit", "0"),
    ("nacos.lock.default_expire_time", "0"),
])
def test_bad_dns_and_lock_settings_are_refused(prop: str, value: str) -> None:
    with pytest.raises(ConfigError, match=prop.replace(".", r"\.")):
        Config.load(env={}, overrides={prop: value})


def test_rate_limiter_buckets_refill_per_source() -> None:
    now = [0.0]
    limiter = RateLimiter(10, clock=lambda: now[0], max_sources=2)
    assert sum(limiter.allow("a") for _ in range(25)) == 10  # a burst of `rate`
    assert limiter.allow("b")  # another source has its own bucket
    now[0] += 0.5
    assert sum(limiter.allow("a") for _ in range(25)) == 5  # refilled at `rate` per second
    limiter.allow("c")  # a third source pushes out the least recently seen (b)
    assert len(limiter._buckets) == 2


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(tmp_path / "cp.sqlite3")
    await store.start()
    yield store
    await store.close()


async def test_lock_rules_on_the_embedded_store(store: EmbeddedStore) -> None:
    now = [1_000_000]
    locks = LockService(store, "n1:8848", lambda: now[0], default_expire_ms=30_000, max_expire_ms=60_000)
    a, b = locks.holder_of("c1"), locks.holder_of("c2")
    mutex = check_lock("k", "NACOS_LOCK", -1, None)
    assert await locks.acquire(mutex, a)
    assert not await locks.acquire(mutex, b)
    now[0] += 29_999
    assert not await locks.acquire(mutex, b)
    now[0] += 1  # the default expiry (negative expiredTime) has passed
    assert await locks.acquire(check_lock("k", "NACOS_LOCK", 10**9, None), b)  # capped at the maximum
    now[0] += 60_000
    assert await locks.acquire(mutex, a)
    # a closed connection's locks go; a lock it lost to expiry stays with its new holder
    assert await locks.acquire(check_lock("other", "REENTRANT", 1000, None), b)
    now[0] += 1000
    assert await locks.acquire(check_lock("other", "REENTRANT", 1000, None), a)
    await locks.release_holder(b, locks.held.pop(b))
    assert not await locks.acquire(check_lock("other", "REENTRANT", 1000, "z"), b)
    await locks.release_holder(a, locks.held.pop(a))
    assert await locks.acquire(mutex, b)
    # the sweep deletes what expired and nobody touched again
    now[0] += 10**6
    await locks.sweep()
    assert (await store.range(Keyspace.LOCKS.prefix)).items == ()


@pytest.mark.parametrize(("key", "lock_type", "expire", "owner"), [
    (None, "NACOS_LOCK", 1, None), ("", "NACOS_LOCK", 1, None), ("k" * 2000, "NACOS_LOCK", 1, None),
    ("k", None, 1, None), ("k", "FAIR", 1, None), ("k", "NACOS_LOCK", 1.5, None), ("k", "NACOS_LOCK", True, None),
    ("k", "REENTRANT", 1, 7),
])
def test_bad_lock_instances_are_invalid_params(key: object, lock_type: object, expire: object,
                                               owner: object) -> None:
    with pytest.raises(InvalidParam):
        check_lock(key, lock_type, expire, owner)


def _ask(resolver: DnsResolver, name: str, rdtype: str = "A", max_size: int | None = 512) -> dns.message.Message:
    wire = resolver.answer(dns.message.make_query(name, rdtype, use_edns=False).to_wire(), max_size)
    assert wire is not None
    return dns.message.from_wire(wire)


def _records(message: dns.message.Message) -> list[str]:
    return [rd.to_text() for rrset in message.answer for rd in rrset]


def test_dns_answers_follow_every_change_of_the_service() -> None:
    """The records are cached per version of the service: each change shows in the next answer."""
    reg = make_registry()
    resolver = DnsResolver(reg.config, reg.naming, random.Random(1))
    key = ServiceKey("public", "DEFAULT_GROUP", "svc")
    reg.connect("c1")
    assert _ask(resolver, "svc.nacos").rcode() == dns.rcode.NXDOMAIN
    reg.naming.ephemeral.batch_register_instances("c1", key, [InstanceInfo("10.0.0.1", 80)])
    assert _records(_ask(resolver, "svc.nacos")) == ["10.0.0.1"]
    reg.naming.ephemeral.batch_register_instances("c1", key,
                                                  [InstanceInfo("10.0.0.1", 80), InstanceInfo("10.0.0.2", 80)])
    assert sorted(_records(_ask(resolver, "svc.nacos"))) == ["10.0.0.1", "10.0.0.2"]
    reg.naming.ephemeral.batch_register_instances("c1", key, [InstanceInfo("10.0.0.1", 80, healthy=False),
                                                    InstanceInfo("10.0.0.2", 80)])
    assert _records(_ask(resolver, "svc.nacos")) == ["10.0.0.2"]
    reg.naming.ephemeral.deregister_instance("c1", key)
    reply = _ask(resolver, "svc.nacos")
    assert reply.rcode() == dns.rcode.NOERROR and not reply.answer  # the empty service is still there


def test_a_big_service_builds_only_what_an_answer_can_hold() -> None:
    reg = make_registry()
    resolver = DnsResolver(reg.config, reg.naming, random.Random(2))
    reg.connect("c1")
    reg.naming.ephemeral.batch_register_instances("c1", ServiceKey("public", "DEFAULT_GROUP", "big"),
                                        [InstanceInfo(f"10.1.{i // 250}.{i % 250}", 80) for i in range(2000)])
    prepared = resolver.prepare(dns.message.make_query("big.nacos", "SRV").to_wire(), 512)
    assert isinstance(prepared, Prepared) and prepared.records <= 2 * (UDP_EDNS_MAX // 16 + 1)
    udp = _ask(resolver, "big.nacos", "A")
    assert udp.flags & dns.flags.TC and len(_records(udp)) < 40
    tcp = _ask(resolver, "big.nacos", "A", None)
    assert not tcp.flags & dns.flags.TC and len(_records(tcp)) == 2000
