"""Deadline scans (keep-alive and heartbeat checks): the compiled kernel, or its pure-Python twin.

See :mod:`shoal.kernels.expiry_py` for the specification.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.kernels import load

__all__ = ["beat_deadlines", "idle_slots"]

if TYPE_CHECKING:
    from shoal.kernels.expiry_py import beat_deadlines, idle_slots
else:
    _impl = load("expiry")
    idle_slots = _impl.idle_slots
    beat_deadlines = _impl.beat_deadlines
