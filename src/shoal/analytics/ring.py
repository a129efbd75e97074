"""Ownership arithmetic for the analytics jobs: Nacos modulo hashing and a consistent-hash ring.

Nacos assigns an ip:port client to ``sorted_members[distroHash(key) % n]`` (the ownership kernel,
:mod:`shoal.kernels.ownership`, is the only implementation of that hash; this module only does the
array arithmetic around it). When the member list changes size almost every key changes owner, which
is what the balance job and the simulation quantify, against the usual alternative: a consistent-hash
ring, where a join or a leave moves only about ``1/n`` of the keys.

The ring used for the comparison: each member gets :data:`DEFAULT_VNODES` (160, as in ketama)
virtual nodes at the positions of the strings ``"<member>#<i>"``; a key belongs to the first virtual
node at or after its own position, wrapping around. Positions are 64-bit SipHash-2-4 values computed
by ``pandas.util.hash_array`` (UTF-8, hash key :data:`HASH_KEY`, no categorisation): vectorised C,
deterministic across processes and machines, unlike Python's ``hash``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_VNODES",
    "HASH_KEY",
    "JAVA_INT_MAX",
    "Ring",
    "distro_hashes",
    "join_position_map",
    "leave_position_map",
    "positions",
]

DEFAULT_VNODES: Final[int] = 160
HASH_KEY: Final[str] = "0123456789123456"  # pandas' default SipHash key, pinned here
JAVA_INT_MAX: Final[int] = 2_147_483_647

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


def positions(keys: Sequence[str] | npt.NDArray[np.object_]) -> U64:
    """Ring positions (uint64) of ``keys``."""
    from pandas.util import hash_array  # type: ignore[import-untyped]  # pandas ships no stubs

    arr = np.asarray(keys, dtype=object)
    if arr.size == 0:
        return np.empty(0, dtype=np.uint64)
    return np.asarray(hash_array(arr, encoding="utf8", hash_key=HASH_KEY, categorize=False), dtype=np.uint64)


def distro_hashes(keys: Sequence[str]) -> I64:
    """Nacos ``distroHash`` of every key, through the ownership kernel, as int64.

    ``owner_indices(keys, n)`` is ``distro_hash(key) % n`` and ``distro_hash`` lies in
    ``[0, Integer.MAX_VALUE)``, so ``n = Integer.MAX_VALUE`` yields the hashes themselves: one kernel
    pass per key, after which owners under any member count are a numpy modulo."""
    from shoal.kernels import ownership

    return np.asarray(ownership.owner_indices(keys, JAVA_INT_MAX), dtype=np.int64)


def join_position_map(members: Sequence[str], joiner: str) -> tuple[list[str], I64]:
    """(new sorted member list, map from new position to old position; the joiner maps to -1)."""
    old = sorted(members)
    if joiner in old:
        raise ValueError(f"{joiner} is already a member")
    new = sorted([*old, joiner])
    index = {m: i for i, m in enumerate(old)}
    return new, np.array([index.get(m, -1) for m in new], dtype=np.int64)


def leave_position_map(members: Sequence[str], leaver: str) -> tuple[list[str], I64]:
    """(new sorted member list without ``leaver``, map from new position to old position)."""
    old = sorted(members)
    if leaver not in old:
        raise ValueError(f"{leaver} is not a member")
    new = [m for m in old if m != leaver]
    index = {m: i for i, m in enumerate(old)}
    return new, np.array([index[m] for m in new], dtype=np.int64)


class Ring:
    """A consistent-hash ring over ``members`` (owner indices refer to ``members`` as given)."""

    def __init__(self, members: Sequence[str], vnodes: int = DEFAULT_VNODES) -> None:
        if not members:
            raise ValueError("a ring needs at least one member")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.members = list(members)
        self.vnodes = vnodes
        pos = positions([f"{m}#{i}" for m in self.members for i in range(vnodes)])
        owner = np.repeat(np.arange(len(self.members), dtype=np.int64), vnodes)
        # sort by position, ties by member index, so the layout is fully deterministic
        order = np.lexsort((owner, pos))
        self._pos: U64 = pos[order]
        self._owner: I64 = owner[order]

    def owners(self, key_positions: U64) -> I64:
        """Index (into ``members``) of the owner of every key position."""
        idx = np.searchsorted(self._pos, key_positions, side="left")
        idx[idx == len(self._pos)] = 0
        return self._owner[idx]
