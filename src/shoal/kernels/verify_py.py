"""Distro verify digests: pure-Python twin (the specification) of ``ext/verify.pyx``.

Nacos' Distro verify task sends every owned client id with its revision to each peer, which then
asks for the clients it is missing or holds stale. Shoal first compares one digest per bucket of
client ids and goes into detail only for the buckets whose digests differ (see the last paragraph).

Wire-level contract between Shoal nodes (changing any of it breaks mixed-version clusters):

* **Client id hash** -- FNV-1a 64-bit over the UTF-8 bytes of the id: start from the offset basis
  ``0xcbf29ce484222325``; for each byte ``h = (h ^ byte) * 0x100000001b3 mod 2**64``.
* **Bucket** of an id -- ``fnv(id) % n_buckets``.
* **Bucket digest** -- the sum mod ``2**64`` over the bucket's clients of
  ``splitmix64(fnv(id) ^ (revision * 0x9E3779B97F4A7C15 mod 2**64))``, where ``splitmix64(z)`` is the
  SplitMix64 finaliser (all mod ``2**64``)::

      z += 0x9E3779B97F4A7C15
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
      z = (z ^ (z >> 27)) * 0x94D049BB133111EB
      return z ^ (z >> 31)

  A sum makes the digest independent of the order in which clients are visited. An empty bucket's
  digest is 0.

Ids must be ``str`` (``TypeError`` otherwise; a lone surrogate raises ``UnicodeEncodeError``),
revisions ints in ``[0, 2**63 - 1]`` (``ValueError`` otherwise), bucket counts at least 1.

The detail phase of verify (mismatched buckets only) compares sorted arrays of 64-bit keys with
:func:`diff_sorted`; :func:`salted32` turns per-client digest terms into the 32-bit values those
keys carry, salted per round so that a chance collision never hides the same difference twice.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

__all__ = [
    "bucket_digests", "bucket_of", "diff_sorted", "fnv1a64", "salted32", "splitmix64", "sub_keys",
]

_MASK64 = 0xFFFFFFFFFFFFFFFF
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
GOLDEN = 0x9E3779B97F4A7C15
_REVISION_MAX = (1 << 63) - 1


def fnv1a64(client_id: str) -> int:
    """FNV-1a 64-bit hash of the UTF-8 bytes of ``client_id``."""
    if not isinstance(client_id, str):
        raise TypeError(f"client ids must be str, got {type(client_id).__name__}")
    h = FNV_OFFSET
    for byte in client_id.encode("utf-8"):
        h = ((h ^ byte) * FNV_PRIME) & _MASK64
    return h


def splitmix64(z: int) -> int:
    """SplitMix64 finaliser of ``z`` (taken mod ``2**64``)."""
    z = (z + GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _check_buckets(n_buckets: int) -> int:
    n_buckets = operator.index(n_buckets)
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be at least 1, got {n_buckets}")
    return n_buckets


def bucket_of(client_ids: Sequence[str], n_buckets: int) -> list[int]:
    """``fnv1a64(id) % n_buckets`` for every id."""
    n_buckets = _check_buckets(n_buckets)
    return [fnv1a64(cid) % n_buckets for cid in client_ids]


def bucket_digests(client_ids: Sequence[str], revisions: Sequence[int], n_buckets: int) -> list[int]:
    """One unsigned 64-bit digest per bucket (see the module docstring), as a list of ``n_buckets``."""
    n_buckets = _check_buckets(n_buckets)
    if len(client_ids) != len(revisions):
        raise ValueError(f"client_ids and revisions differ in length: {len(client_ids)} != {len(revisions)}")
    digests = [0] * n_buckets
    for cid, revision in zip(client_ids, revisions, strict=True):
        revision = operator.index(revision)
        if not 0 <= revision <= _REVISION_MAX:
            raise ValueError(f"revision out of range [0, 2**63 - 1]: {revision}")
        h = fnv1a64(cid)
        bucket = h % n_buckets
        digests[bucket] = (digests[bucket] + splitmix64(h ^ ((revision * GOLDEN) & _MASK64))) & _MASK64
    return digests


def _sorted_u64(values: Iterable[int], name: str) -> list[int]:
    out: list[int] = []
    prev = 0
    for i, value in enumerate(values):
        value = operator.index(value)
        if not 0 <= value <= _MASK64:
            raise ValueError(f"{name}[{i}] out of range [0, 2**64 - 1]: {value}")
        if value < prev:
            raise ValueError(f"{name} is not sorted at position {i}")
        out.append(value)
        prev = value
    return out


def diff_sorted(a: Iterable[int], b: Iterable[int]) -> tuple[list[int], list[int]]:
    """``(only_a, only_b)``: the multiset differences of two non-decreasing arrays of uint64.

    Every value of ``a`` and ``b`` must be an int in ``[0, 2**64 - 1]`` and each array sorted
    ascending (``ValueError`` otherwise; ``a`` is checked completely before ``b``). Equal values
    pair off one for one; both results are sorted. ``array('Q')`` inputs take the compiled fast path.
    """
    xs = _sorted_u64(a, "a")
    ys = _sorted_u64(b, "b")
    only_a: list[int] = []
    only_b: list[int] = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        x, y = xs[i], ys[j]
        if x == y:
            i += 1
            j += 1
        elif x < y:
            only_a.append(x)
            i += 1
        else:
            only_b.append(y)
            j += 1
    only_a.extend(xs[i:])
    only_b.extend(ys[j:])
    return only_a, only_b


def salted32(values: Iterable[int], salt: int) -> list[int]:
    """``splitmix64(value ^ salt) >> 32`` for every value (ints in ``[0, 2**64 - 1]``, ``ValueError``
    otherwise; only ``salt mod 2**64`` matters)."""
    salt = operator.index(salt) & _MASK64
    out: list[int] = []
    for value in values:
        value = operator.index(value)
        if not 0 <= value <= _MASK64:
            raise ValueError(f"value out of range [0, 2**64 - 1]: {value}")
        out.append(splitmix64(value ^ salt) >> 32)
    return out


def sub_keys(fnvs: Sequence[int], terms: Sequence[int], n_buckets: int, k: int, salt: int) -> list[int]:
    """``sub << 32 | salted32(term)`` per client, where ``sub = (fnv % n) * k + (fnv // n) % k``.

    ``fnvs`` and ``terms`` are parallel (``ValueError`` when their lengths differ), ints in
    ``[0, 2**64 - 1]`` (``ValueError`` otherwise, every fnv checked before any term);
    ``n_buckets`` and ``k`` at least 1 with ``n_buckets * k < 2**32``.
    """
    if len(fnvs) != len(terms):
        raise ValueError(f"fnvs and terms differ in length: {len(fnvs)} != {len(terms)}")
    n_buckets = _check_buckets(n_buckets)
    k = _check_buckets(k)
    if n_buckets * k > 0xFFFFFFFF:
        raise ValueError(f"n_buckets * k must be below 2**32, got {n_buckets * k}")
    checked = []
    for name, values in (("fnvs", fnvs), ("terms", terms)):
        out = []
        for i, value in enumerate(values):
            value = operator.index(value)
            if not 0 <= value <= _MASK64:
                raise ValueError(f"{name}[{i}] out of range [0, 2**64 - 1]: {value}")
            out.append(value)
        checked.append(out)
    salt = operator.index(salt) & _MASK64
    return [((f % n_buckets) * k + (f // n_buckets) % k) << 32 | splitmix64(t ^ salt) >> 32
            for f, t in zip(checked[0], checked[1], strict=True)]
