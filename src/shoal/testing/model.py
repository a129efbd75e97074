"""The model stack on a :class:`~shoal.clock.ManualClock`, for in-process tests.

Its CP half is real: an embedded SQLite store (:class:`~shoal.cp.embedded.EmbeddedStore`) in a
directory of its own under the system's temporary directory, created only when a test starts it
(:meth:`Registry.start_cp`) and removed when it stops it. A test that never starts it uses the
AP half only; a persistent write then has no store to go to.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.clock import ManualClock
from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import CpStore
from shoal.model.client import Client, ClientKind
from shoal.stack import ModelStack


@dataclass
class Registry(ModelStack):
    """A :class:`~shoal.stack.ModelStack` whose clock only moves when a test advances it."""

    clock: ManualClock

    def connect(self, client_id: str, ip: str = "10.0.0.1") -> Client:
        """Add a native gRPC connection client, as a connecting SDK would."""
        client = Client(client_id, ClientKind.CONNECTION, native=True, created_ms=self.clock.now_ms(), client_ip=ip)
        self.clients.add(client)
        return client

    async def start_cp(self, start_store: bool = True) -> None:
        """Start the CP store (unless a test shares a store it started itself: ``start_store``
        false) and both views, and wait for their first full read."""
        if start_store:
            await self.cp_store.start()
        self.start_views()
        await self.wait_views_ready()

    async def stop_cp(self, stop_store: bool = True) -> None:
        """Stop the views and, with ``stop_store``, close the store and remove its directory."""
        await self.stop_views()
        if stop_store:
            await self.cp_store.close()
            if isinstance(self.cp_store, EmbeddedStore) and self.cp_store.path.parent.name.startswith(_PREFIX):
                shutil.rmtree(self.cp_store.path.parent, ignore_errors=True)


_PREFIX = "shoal-registry-"


def scratch_store() -> EmbeddedStore:
    """An embedded CP store in a fresh directory under the system's temporary directory (made
    when the store starts, removed by :meth:`Registry.stop_cp`)."""
    return EmbeddedStore(Path(tempfile.gettempdir()) / f"{_PREFIX}{uuid.uuid4().hex}" / "store.sqlite3")


def config_with(**overrides: Any) -> Config:
    """The default Config with ``overrides`` (field names), validated."""
    return dataclasses.replace(Config(), **overrides).validate()


def make_registry(store: CpStore | None = None, **overrides: Any) -> Registry:
    """A fresh model stack on a new ManualClock with the default Config plus ``overrides``; its CP
    half on ``store`` (another registry's, to play a second node), else on a scratch embedded store."""
    return Registry.build(config_with(**overrides), ManualClock(), store if store is not None else scratch_store())
