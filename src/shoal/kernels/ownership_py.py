"""Distro ownership arithmetic: pure-Python twin (the specification) of ``ext/ownership.pyx``.

Mirrors Nacos ``DistroMapper``: a key (client id / service key) belongs to the member at index
``distroHash(key) % members.size()`` of the sorted healthy member list, where ``distroHash`` is
``Math.abs(key.hashCode() % Integer.MAX_VALUE)`` and ``hashCode`` is Java's ``String.hashCode``.
Keys and member addresses must be ``str`` (``TypeError`` otherwise).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

__all__ = ["distro_hash", "java_hash", "moved_keys", "owner_indices"]

_MASK32 = 0xFFFFFFFF
_INT_MAX = 2147483647  # Java Integer.MAX_VALUE


def java_hash(s: str) -> int:
    """Java ``String.hashCode`` of ``s``, as a signed 32-bit int.

    ``h = 31 * h + unit`` over the UTF-16 code units of ``s`` with 32-bit wrap-around; a code point
    above U+FFFF counts as its two surrogate units, exactly as Java stores it.
    """
    if not isinstance(s, str):
        raise TypeError(f"expected str, got {type(s).__name__}")
    h = 0
    for ch in s:
        c = ord(ch)
        if c > 0xFFFF:
            c -= 0x10000
            h = (31 * h + (0xD800 | (c >> 10))) & _MASK32  # high surrogate
            c = 0xDC00 | (c & 0x3FF)  # low surrogate
        h = (31 * h + c) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def distro_hash(s: str) -> int:
    """``abs(java_hash(s)) % Integer.MAX_VALUE``: in ``[0, 2**31 - 2]``; -2**31 maps to 1."""
    return abs(java_hash(s)) % _INT_MAX


def owner_indices(keys: Sequence[str], n_members: int) -> list[int]:
    """``distro_hash(key) % n_members`` for every key (index into the caller's member list)."""
    n_members = operator.index(n_members)
    if n_members <= 0:
        raise ValueError(f"n_members must be positive, got {n_members}")
    return [distro_hash(key) % n_members for key in keys]


def moved_keys(keys: Sequence[str], old_members: Sequence[str], new_members: Sequence[str]) -> list[int]:
    """Ascending indices of keys whose owner address differs between two member lists.

    The owner of a key under a member list ``m`` is ``m[distro_hash(key) % len(m)]``; the lists are
    used in the order given (callers sort them, as Nacos does). When exactly one list is empty,
    every key counts as moved; when both are, none does. Keys are type-checked in every case.
    """
    for member in (*old_members, *new_members):
        if not isinstance(member, str):
            raise TypeError(f"member addresses must be str, got {type(member).__name__}")
    n_old = len(old_members)
    n_new = len(new_members)
    if n_old == 0 or n_new == 0:
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"expected str, got {type(key).__name__}")
        return [] if n_old == n_new else list(range(len(keys)))
    moved: list[int] = []
    for i, key in enumerate(keys):
        h = distro_hash(key)
        if old_members[h % n_old] != new_members[h % n_new]:
            moved.append(i)
    return moved
