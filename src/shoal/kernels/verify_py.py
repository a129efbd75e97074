"""Distro verify digests: pure-Python twin (the specification) of ``ext/verify.pyx``.

Nacos' Distro verify task sends every owned client id with its revision to each peer, which then
asks for the clients it is missing or holds stale. Shoal first compares one digest per bucket of
client ids and exchanges ids only for buckets whose digests differ, then diffs those ids with
:func:`diff_revisions`.

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
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

__all__ = ["bucket_digests", "bucket_of", "diff_revisions", "fnv1a64", "splitmix64"]

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


def diff_revisions(local: Mapping[str, int], remote: Mapping[str, int]) -> tuple[list[str], list[str], list[str]]:
    """``(missing, stale, extra)``, each sorted.

    ``missing``: ids in ``local`` but not in ``remote``; ``stale``: ids in both whose revisions
    differ (``!=``); ``extra``: ids in ``remote`` but not in ``local``.
    """
    missing: list[str] = []
    stale: list[str] = []
    for cid, revision in local.items():
        if cid not in remote:
            missing.append(cid)
        elif remote[cid] != revision:
            stale.append(cid)
    extra = [cid for cid in remote if cid not in local]
    missing.sort()
    stale.sort()
    extra.sort()
    return missing, stale, extra
