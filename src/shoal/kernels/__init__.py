"""Hot-path kernels: each is a Cython extension (ext/<name>.pyx) with a pure-Python twin.

Callers import ``shoal.kernels.<name>`` only; that selector module binds the compiled functions
unless ``SHOAL_NO_EXTENSIONS`` is set (or the extension failed to import), in which case it binds
the twin in ``shoal.kernels.<name>_py``. The twin is the specification; tests run both.
"""

from __future__ import annotations

import importlib
import logging
import os

#: Set SHOAL_NO_EXTENSIONS=1 to force the pure-Python twins (it also skips the build).
NO_EXTENSIONS: bool = os.environ.get("SHOAL_NO_EXTENSIONS", "") not in ("", "0")

KERNELS: tuple[str, ...] = ("expiry", "ownership", "verify", "syncser", "payload")

log = logging.getLogger(__name__)

_chosen: dict[str, str] = {}
_failures: dict[str, str] = {}


def load(name: str) -> object:
    """Return the compiled module for ``name`` or its pure-Python twin, and record which."""
    if not NO_EXTENSIONS:
        try:
            module = importlib.import_module(f"shoal._ext.{name}")
        except ImportError as exc:
            _failures[name] = str(exc)
        else:
            _chosen[name] = "cython"
            return module
    _chosen[name] = "python"
    return importlib.import_module(f"shoal.kernels.{name}_py")


def implementation() -> dict[str, str]:
    """Which implementation each kernel is bound to ("cython" or "python")."""
    for name in KERNELS:
        if name not in _chosen:
            try:
                importlib.import_module(f"shoal.kernels.{name}")
            except ImportError as exc:  # kernel not written yet
                _failures.setdefault(name, str(exc))
    return dict(_chosen)


def load_failures() -> dict[str, str]:
    """Import errors of compiled kernels that fell back to Python (empty when all loaded)."""
    return dict(_failures)


def log_implementations() -> dict[str, str]:
    """Log which implementation every kernel is bound to (INFO), and each compiled kernel that
    failed to import (WARNING, with the import error) unless the twins were asked for."""
    chosen = implementation()
    log.info("kernels: %s%s", ", ".join(f"{name}={impl}" for name, impl in sorted(chosen.items())),
             " (SHOAL_NO_EXTENSIONS is set)" if NO_EXTENSIONS else "", extra={"kernels": chosen})
    if not NO_EXTENSIONS:
        for name, error in sorted(load_failures().items()):
            log.warning("compiled kernel %s failed to import, using its pure-Python twin: %s", name, error,
                        extra={"kernel": name, "import_error": error})
    return chosen
