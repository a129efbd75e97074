"""Fixtures of the CP store tests: each store kind on real things (a SQLite file, a real etcd)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.cp.embedded import EmbeddedStore
from shoal.cp.etcd import EtcdStore
from shoal.cp.store import CpStore
from shoal.cp.supervisor import EtcdSupervisor
from shoal.testing.etcd import managed_cluster
from shoal.testing.wait import wait_until


async def _started(supervisor: EtcdSupervisor) -> EtcdSupervisor:
    await supervisor.start()
    await supervisor.wait_listening(30)
    return supervisor


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[EtcdSupervisor]:
    """One real etcd process on free loopback ports, always stopped at the end."""
    (supervisor,) = managed_cluster(tmp_path, 1)
    try:
        yield await _started(supervisor)
    finally:
        await supervisor.stop()


@pytest.fixture
async def etcd_store(etcd: EtcdSupervisor) -> AsyncIterator[EtcdStore]:
    store = EtcdStore(etcd.endpoints, request_timeout_ms=2000, backoff_max_ms=500)
    await store.start()
    try:
        await wait_until(lambda: _answers(store), timeout=15.0, what="etcd answering")
        yield store
    finally:
        await store.close()


async def _answers(store: CpStore) -> bool:
    try:
        await store.get("/probe")
    except Exception:
        return False
    return True


@pytest.fixture
async def embedded_store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(tmp_path / "cp" / "store.sqlite3")
    await store.start()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(params=["embedded", "etcd"])
def store(request: pytest.FixtureRequest) -> CpStore:
    """Each CP store implementation, fresh (the shared contract runs on both)."""
    found: CpStore = request.getfixturevalue(f"{request.param}_store")
    return found
