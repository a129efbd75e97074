"""The DNS and lock modules' settings, the DNS rate limiter, and the lock rules on a real embedded
CP store with a hand-stepped clock (the wire is tested in tests/integration/test_dns.py and
test_lock.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import Keyspace
from shoal.dns import RateLimiter
from shoal.errors import ConfigError, InvalidParam
from shoal.service_layer.lock import LockService, check_lock


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
