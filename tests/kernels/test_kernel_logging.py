"""A node says which kernel implementations it runs, and a compiled kernel that fails to import
is reported as a WARNING with its import error instead of silently falling back."""

from __future__ import annotations

import logging
import sys

import pytest

from shoal import kernels


@pytest.fixture
def fresh_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run with empty selection records; the real ones are restored afterwards."""
    monkeypatch.setattr(kernels, "_chosen", {})
    monkeypatch.setattr(kernels, "_failures", {})


def test_implementations_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="shoal.kernels"):
        chosen = kernels.log_implementations()
    assert set(chosen) == set(kernels.KERNELS)
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and infos[0].kernels == chosen  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.skipif(kernels.NO_EXTENSIONS, reason="the twins were asked for: no import is attempted")
def test_a_failed_extension_import_is_a_warning(fresh_selection: None, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "shoal._ext.expiry", None)  # makes `import shoal._ext.expiry` fail
    module = kernels.load("expiry")
    assert module.__name__ == "shoal.kernels.expiry_py"
    for name in kernels.KERNELS:  # the others load as usual
        if name != "expiry":
            kernels.load(name)
    with caplog.at_level(logging.INFO, logger="shoal.kernels"):
        chosen = kernels.log_implementations()
    assert chosen["expiry"] == "python"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.kernel for r in warnings] == ["expiry"]  # type: ignore[attr-defined]
    assert warnings[0].import_error == kernels.load_failures()["expiry"]  # type: ignore[attr-defined]
