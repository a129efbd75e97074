"""What a node's CP views log while their store cannot be read: once at INFO when it starts, a
WARNING once only if it lasts (cp/store.py ``OUTAGE_WARN_AFTER_S``), then an INFO when it reads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shoal.cp import store as cp_store
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import CpView, Keyspace
from shoal.testing import wait_until


async def test_views_of_an_unreadable_store_say_so_once_and_warn_once_if_it_lasts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cp_store, "OUTAGE_WARN_AFTER_S", 0.3)
    store = EmbeddedStore(tmp_path / "cp" / "store.sqlite3")  # not started yet: every read fails
    views = [CpView(store, keyspace, bytes, bytes, retry_delay_ms=20) for keyspace in Keyspace]
    caplog.set_level(logging.DEBUG, logger="shoal.cp.store")
    for view in views:
        view.start()
    try:
        await wait_until(lambda: any(r.levelno == logging.WARNING for r in caplog.records), 5, "the WARNING")
        await store.start()
        for view in views:
            await view.wait_ready(5)
        await wait_until(lambda: any("readable after" in r.getMessage() for r in caplog.records), 5, "recovery")
    finally:
        for view in views:
            await view.stop()
        await store.close()
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records if r.levelno >= logging.INFO]
    assert said[0] == ("INFO", "CP store not readable yet")
    assert [level for level, _ in said] == ["INFO", "WARNING", "INFO"]  # one line each, for every view
    assert said[-1][0] == "INFO" and said[-1][1].startswith("CP store readable after")
