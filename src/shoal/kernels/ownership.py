"""Distro ownership arithmetic (Nacos DistroMapper): the compiled kernel, or its pure-Python twin.

See :mod:`shoal.kernels.ownership_py` for the specification.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.kernels import load

__all__ = ["distro_hash", "java_hash", "moved_keys", "owner_indices"]

if TYPE_CHECKING:
    from shoal.kernels.ownership_py import distro_hash, java_hash, moved_keys, owner_indices
else:
    _impl = load("ownership")
    java_hash = _impl.java_hash
    distro_hash = _impl.distro_hash
    owner_indices = _impl.owner_indices
    moved_keys = _impl.moved_keys
