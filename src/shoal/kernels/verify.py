"""Distro verify digests: the compiled kernel, or its pure-Python twin.

See :mod:`shoal.kernels.verify_py` for the specification and the wire-level hash contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.kernels import load

__all__ = [
    "bucket_digests", "bucket_of", "diff_sorted", "fnv1a64", "salted32", "splitmix64", "sub_keys",
]

if TYPE_CHECKING:
    from shoal.kernels.verify_py import (
        bucket_digests,
        bucket_of,
        diff_sorted,
        fnv1a64,
        salted32,
        splitmix64,
        sub_keys,
    )
else:
    _impl = load("verify")
    fnv1a64 = _impl.fnv1a64
    splitmix64 = _impl.splitmix64
    bucket_of = _impl.bucket_of
    bucket_digests = _impl.bucket_digests
    diff_sorted = _impl.diff_sorted
    salted32 = _impl.salted32
    sub_keys = _impl.sub_keys
