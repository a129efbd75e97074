"""The shape of Distro verify on the wire: constants and sizing rules shared by the nodes
(:mod:`shoal.distro.verify`) and the cluster simulator (:mod:`shoal.analytics.simulate`), so the
simulator charges the bytes the nodes actually send.

The digest arithmetic is in :mod:`shoal.kernels.verify_py`; the messages are described in
docs/protocol.md §6.5 and §6.8. Like every kernel module this one is a leaf: no I/O, no Shoal import
outside ``shoal.kernels``.
"""

from __future__ import annotations

import json
import math
from typing import Final

#: Wire version of every verify message; all nodes of a cluster run the same one. Version 3 names
#: the copies a peer holds that the owner's keys do not match, and lets the owner remove them.
VERSION: Final = 3
#: The owner aims at this many clients per bucket.
CLIENTS_PER_BUCKET: Final = 256
#: Bucket counts are powers of two up to this, so kept sums fold to any of them.
MAX_BUCKETS: Final = 4096
#: At most this many sub-buckets per mismatched bucket.
MAX_SUB_BUCKETS: Final = 256
#: The sub-digest step is skipped while the values of the mismatched buckets fit in this.
DIRECT_DETAIL_BYTES: Final = 64 * 1024
#: At most this many copies named in one detail answer (the rest are named by the next round).
MAX_EXTRA: Final = 4096

#: Bytes per item of the binary parts: a bucket digest, a sub-digest, a client's value, a
#: sub-bucket id, a position in a detail answer; a per-sub-bucket count is 2 bytes (4 past 65535).
DIGEST_BYTES: Final = 8
SUB_DIGEST_BYTES: Final = 4
VALUE_BYTES: Final = 4
SUB_ID_BYTES: Final = 4
COUNT_BYTES: Final = 2
POSITION_BYTES: Final = 4


def head(**fields: object) -> bytes:
    """The JSON header line (without its newline) of a verify message: the version, then ``fields``."""
    return json.dumps({"v": VERSION, **fields}, separators=(",", ":")).encode()


def bucket_count(n_clients: int) -> int:
    """Buckets for ``n_clients``: the power of two nearest above n / CLIENTS_PER_BUCKET, 1..MAX_BUCKETS."""
    want = -(-n_clients // CLIENTS_PER_BUCKET)
    n = 1
    while n < want and n < MAX_BUCKETS:
        n *= 2
    return n


def sub_buckets_for(mismatched: int, n: int, count: int) -> int:
    """Sub-buckets per mismatched bucket: 1 (no sub-digest step) while the direct detail is small,
    else the power of two that minimises the estimated bytes of both steps — 4 per sub-digest,
    plus 6 per named sub-bucket and 4 per client in one, with the differences per bucket
    estimated from the share of mismatched buckets (Poisson)."""
    per_bucket = count / n
    if mismatched * per_bucket * VALUE_BYTES <= DIRECT_DETAIL_BYTES:
        return 1
    share = min(mismatched, n - 0.5) / n
    differences = max(-math.log(1 - share), 1.0)  # per mismatched-ish bucket

    def cost(k: int) -> float:
        named = mismatched * k * (1 - math.exp(-differences / k))
        return 4 * mismatched * k + named * (6 + 4 * per_bucket / k) + 4 * mismatched * differences

    best, k = 1, 2
    while k <= MAX_SUB_BUCKETS:
        if cost(k) < cost(best):
            best = k
        k *= 2
    return best


# --- message sizes (what the simulator charges; the nodes' encoders produce exactly these) ---------
def digest_request_size(n: int, count: int) -> int:
    """A DistroVerifyRequest of ``n`` buckets over ``count`` clients."""
    return len(head(buckets=n, count=count)) + 1 + DIGEST_BYTES * n


def digest_answer_size(n: int) -> int:
    """A DistroVerifyResponse naming mismatched buckets among ``n`` (a bitmap)."""
    return len(head()) + 1 + (n + 7) // 8


def sub_request_size(n: int, k: int, buckets: list[int], salt: int) -> int:
    """A DistroVerifySubDigestRequest: ``k`` sub-digests for each of ``buckets``."""
    return len(head(buckets=n, k=k, salt=salt, list=buckets)) + 1 + SUB_DIGEST_BYTES * k * len(buckets)


def detail_request_size(n: int, k: int, subs: int, clients: int, salt: int) -> int:
    """A DistroVerifyDetailRequest naming ``subs`` (sub-)buckets that hold ``clients`` of the owner's."""
    width = "H" if clients <= 0xFFFF else "I"
    return (len(head(buckets=n, k=k, salt=salt, subs=subs, counts=width)) + 1
            + (SUB_ID_BYTES + (COUNT_BYTES if width == "H" else 4)) * subs + VALUE_BYTES * clients)


def detail_answer_size(lacking: int, extra: list[tuple[str, int]]) -> int:
    """A DistroVerifyDetailResponse: the positions the peer lacks, the copies it holds in excess."""
    return len(head(extra=extra)) + 1 + POSITION_BYTES * lacking


def remove_request_size(copies: list[tuple[str, int]]) -> int:
    """A DistroVerifyRemoveRequest of ``copies`` (id, revision)."""
    return len(head(copies=copies)) + 1
