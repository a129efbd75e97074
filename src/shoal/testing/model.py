"""The model stack on a :class:`~shoal.clock.ManualClock`, for in-process tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from shoal.clock import ManualClock
from shoal.config import Config
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


def config_with(**overrides: Any) -> Config:
    """The default Config with ``overrides`` (field names), validated."""
    return dataclasses.replace(Config(), **overrides).validate()


def make_registry(**overrides: Any) -> Registry:
    """A fresh model stack on a new ManualClock with the default Config plus ``overrides``."""
    return Registry.build(config_with(**overrides), ManualClock())
