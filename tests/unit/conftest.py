"""In-process fixtures: the model stack on a ManualClock (built by :mod:`shoal.testing`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shoal.testing import Registry, make_registry


@pytest.fixture
def registry() -> Registry:
    return make_registry()


@pytest.fixture
async def cp_registry() -> AsyncIterator[Registry]:
    """A registry whose CP half runs: its embedded store started and both views read."""
    registry = make_registry()
    await registry.start_cp()
    try:
        yield registry
    finally:
        await registry.stop_cp()
