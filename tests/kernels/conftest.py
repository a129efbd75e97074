"""Fixtures binding every kernel test to both implementations.

Each fixture yields a module: ``shoal._ext.<name>`` (id "cython", marked ``c_extension``, present
only while ``SHOAL_NO_EXTENSIONS`` is unset) and its twin ``shoal.kernels.<name>_py`` (id "py").
Production code goes through the selector ``shoal.kernels.<name>``; tests pin each side directly.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from shoal.kernels import NO_EXTENSIONS


def _implementations(name: str) -> list[object]:
    params: list[object] = []
    if not NO_EXTENSIONS:
        params.append(pytest.param(f"shoal._ext.{name}", id="cython", marks=pytest.mark.c_extension))
    params.append(pytest.param(f"shoal.kernels.{name}_py", id="py"))
    return params


@pytest.fixture(params=_implementations("expiry"))
def expiry(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)


@pytest.fixture(params=_implementations("ownership"))
def ownership(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)


@pytest.fixture(params=_implementations("verify"))
def verify(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)


@pytest.fixture(params=_implementations("syncser"))
def syncser(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)
