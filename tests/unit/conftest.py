"""In-process fixtures: the model stack on a ManualClock (built by :mod:`shoal.testing`)."""

from __future__ import annotations

import pytest

from shoal.testing import Registry, make_registry


@pytest.fixture
def registry() -> Registry:
    return make_registry()
