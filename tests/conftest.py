"""Suite-wide guard: with extensions enabled, every kernel must really be the compiled one."""

from __future__ import annotations

import pytest

from shoal import kernels


def pytest_sessionstart(session: pytest.Session) -> None:
    chosen = kernels.implementation()
    if kernels.NO_EXTENSIONS:
        return
    python_bound = sorted(name for name, impl in chosen.items() if impl != "cython")
    if python_bound:
        raise pytest.UsageError(
            "compiled kernels did not load while SHOAL_NO_EXTENSIONS is unset: "
            f"{python_bound} ({kernels.load_failures()}); run `make test` to build them, "
            "or set SHOAL_NO_EXTENSIONS=1 to test the pure-Python twins"
        )


def pytest_report_header(config: pytest.Config) -> str:
    return f"shoal kernels: {kernels.implementation()}"
