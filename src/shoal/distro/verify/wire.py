"""The verify messages on the wire (docs/protocol.md §6.5, §6.8): one encoder and one parser per
message, both sides.

Every message but the sub-digest answer (a bare bitmap) is a JSON header line carrying the wire
version ``v``, then a binary part. A
parser checks everything at once — the header's shape and field types, the version, the value
ranges and the binary part's length — and raises :class:`~shoal.errors.BadVerifyMessage` (502,
as any body without its type's shape) for whatever does not fit; no other exception escapes it.
The cluster port runs no separate shape check on these bodies: the handler's parse is the check.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from shoal import jsonfast
from shoal.errors import BadVerifyMessage
from shoal.kernels import verify as kernel
from shoal.kernels.verify_layout import MAX_BUCKETS, MAX_EXTRA, MAX_SUB_BUCKETS, VERSION, bucket_count, head

DIGEST_REQUEST = "DistroVerifyRequest"
DIGEST_RESPONSE = "DistroVerifyResponse"
SUB_REQUEST = "DistroVerifySubDigestRequest"
SUB_RESPONSE = "DistroVerifySubDigestResponse"
DETAIL_REQUEST = "DistroVerifyDetailRequest"
DETAIL_RESPONSE = "DistroVerifyDetailResponse"
REMOVE_REQUEST = "DistroVerifyRemoveRequest"
REMOVE_RESPONSE = "DistroVerifyRemoveResponse"
#: Every verify request type (each routed to the receiver).
REQUESTS = (DIGEST_REQUEST, SUB_REQUEST, DETAIL_REQUEST, REMOVE_REQUEST)

#: The digest answer of a peer that is still loading its snapshot.
LOADING_ANSWER = head(loading=True) + b"\n"


# --- the pieces ------------------------------------------------------------------------------
def bitmap(flags: Sequence[bool]) -> bytes:
    """Little-endian bit order: flag i is bit i % 8 of byte i // 8."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def bits_set(data: bytes, size: int, what: str) -> list[int]:
    """Positions below ``size`` whose bit is set in a :func:`bitmap`."""
    if len(data) != (size + 7) // 8:
        raise BadVerifyMessage(f"{what}: bitmap of {len(data)} bytes for {size} flags")
    return [i for i in range(size) if data[i >> 3] >> (i & 7) & 1]


def _packed(fields: dict[str, object], fmt: str, values: Collection[int]) -> bytes:
    return head(**fields) + b"\n" + struct.pack(f"<{len(values)}{fmt}", *values)


def _header(body: bytes, what: str) -> tuple[dict[str, Any], bytes]:
    line, sep, rest = body.partition(b"\n")
    if not sep:
        raise BadVerifyMessage(f"{what} has no header line")
    try:
        header = jsonfast.loads(line)
    except ValueError as exc:  # not UTF-8, not JSON, or nested too deeply
        raise BadVerifyMessage(f"{what} header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BadVerifyMessage(f"{what} header must be a JSON object")
    if header.get("v") != VERSION:
        raise BadVerifyMessage(f"{what} has verify wire version {header.get('v')!r}, this node speaks {VERSION}")
    return header, rest


def _int(header: dict[str, Any], key: str, what: str, low: int = 0, high: int | None = None) -> int:
    value = header.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"in {low}..{high}" if high is not None else f">= {low}"
        raise BadVerifyMessage(f"{what}: '{key}' must be an integer {bounds}, got {value!r}")
    return value


def _power_of_two(header: dict[str, Any], key: str, limit: int, what: str) -> int:
    n = _int(header, key, what, 1, limit)
    if n & (n - 1):
        raise BadVerifyMessage(f"{what}: '{key}' must be a power of two, got {n}")
    return n


def _unpack(fmt: str, packed: bytes, count: int, what: str) -> tuple[int, ...]:
    if len(packed) != struct.calcsize(fmt) * count:
        raise BadVerifyMessage(f"{what}: {len(packed)} bytes do not hold {count} values")
    return struct.unpack(f"<{count}{fmt}", packed)


def _copies(value: object, what: str, limit: int) -> list[tuple[str, int]]:
    """A JSON list of [client id, revision] pairs."""
    if not isinstance(value, list) or len(value) > limit:
        raise BadVerifyMessage(f"{what} must be a list of at most {limit} [client id, revision] pairs")
    out: list[tuple[str, int]] = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or isinstance(item[1], bool) or not isinstance(item[1], int) or item[1] < 0):
            raise BadVerifyMessage(f"{what} must be a list of [client id, revision] pairs")
        out.append((item[0], item[1]))
    return out


# --- DistroVerifyRequest: the owner's bucket digests ------------------------------------------
def digest_body(digests: Sequence[int], count: int) -> bytes:
    """JSON header line, then the bucket digests as little-endian uint64 (8 bytes each: at most
    32 KiB whatever the client count)."""
    return _packed({"buckets": len(digests), "count": count}, "Q", digests)


def digest_request(ids: Sequence[str], revisions: Sequence[int]) -> bytes:
    """The digest request of ``ids`` at ``revisions``, computed from scratch (tests, tools)."""
    return digest_body(kernel.bucket_digests(ids, revisions, bucket_count(len(ids))), len(ids))


def parse_digest_request(body: bytes) -> tuple[int, list[int]]:
    """(bucket count, digests) of a digest request."""
    what = DIGEST_REQUEST
    header, packed = _header(body, what)
    n = _power_of_two(header, "buckets", MAX_BUCKETS, what)
    _int(header, "count", what)
    return n, list(_unpack("Q", packed, n, what))


def digest_answer(mismatched: Collection[int], n: int) -> bytes:
    """The peer's answer: a bitmap of the mismatched buckets."""
    bad = set(mismatched)
    return head() + b"\n" + bitmap([i in bad for i in range(n)])


def parse_digest_answer(body: bytes, n: int) -> list[int] | None:
    """The mismatched buckets of a digest answer, or None when the peer is still loading."""
    header, flags = _header(body, DIGEST_RESPONSE)
    if header.get("loading") is True:
        return None
    return bits_set(flags, n, DIGEST_RESPONSE)


# --- DistroVerifySubDigestRequest: k sub-digests per mismatched bucket --------------------------
@dataclass(frozen=True, slots=True)
class SubRequest:
    """``k`` 32-bit sub-digests for each of ``buckets`` (of ``n``), salted with ``salt``."""

    n: int
    k: int
    salt: int
    buckets: list[int]
    sums: tuple[int, ...]

    def encode(self) -> bytes:
        return _packed({"buckets": self.n, "k": self.k, "salt": self.salt, "list": self.buckets}, "I", self.sums)


def parse_sub_request(body: bytes) -> SubRequest:
    what = SUB_REQUEST
    header, packed = _header(body, what)
    n = _power_of_two(header, "buckets", MAX_BUCKETS, what)
    k = _power_of_two(header, "k", MAX_SUB_BUCKETS, what)
    salt = _int(header, "salt", what)
    listed = header.get("list")
    if (not isinstance(listed, list) or len(listed) > n
            or any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < n for b in listed)):
        raise BadVerifyMessage(f"{what}: 'list' must be a list of bucket numbers below {n}")
    buckets = sorted(set(listed))
    return SubRequest(n, k, salt, buckets, _unpack("I", packed, len(buckets) * k, what))


def parse_sub_answer(body: bytes, size: int) -> list[int]:
    """Positions (bucket index * k + j) of the mismatched sub-buckets: a bare bitmap."""
    return bits_set(body, size, SUB_RESPONSE)


# --- DistroVerifyDetailRequest: the owner's values in the named (sub-)buckets ---------------------
@dataclass(frozen=True, slots=True)
class DetailRequest:
    """The owner's salted 32-bit values of its clients in each named sub-bucket. ``subs`` are
    sorted sub-bucket ids (bucket * k + j), *every* mismatched one even when the owner holds no
    client there (so the peer can name the copies it holds in it); ``counts`` the owner's
    clients in each, ``values`` theirs in that order."""

    n: int
    k: int
    salt: int
    subs: tuple[int, ...]
    counts: tuple[int, ...]
    values: tuple[int, ...]

    def encode(self) -> bytes:
        width = "H" if max(self.counts, default=0) <= 0xFFFF else "I"
        fields = {"buckets": self.n, "k": self.k, "salt": self.salt, "subs": len(self.subs), "counts": width}
        return (head(**fields) + b"\n" + struct.pack(f"<{len(self.subs)}I", *self.subs)
                + struct.pack(f"<{len(self.counts)}{width}", *self.counts)
                + struct.pack(f"<{len(self.values)}I", *self.values))

    def keys(self) -> list[int]:
        """The owner's 64-bit keys ``sub << 32 | value``, in its order (sorted)."""
        out: list[int] = []
        at = 0
        for sub, held in zip(self.subs, self.counts, strict=True):
            high = sub << 32
            out.extend(high | v for v in self.values[at:at + held])
            at += held
        return out


def parse_detail_request(body: bytes) -> DetailRequest:
    what = DETAIL_REQUEST
    header, packed = _header(body, what)
    n = _power_of_two(header, "buckets", MAX_BUCKETS, what)
    k = _power_of_two(header, "k", MAX_SUB_BUCKETS, what)
    salt = _int(header, "salt", what)
    count = _int(header, "subs", what, 0, n * k)
    width = header.get("counts")
    if width not in ("H", "I"):
        raise BadVerifyMessage(f"{what}: 'counts' must be \"H\" or \"I\", got {width!r}")
    end = 4 * count + struct.calcsize(str(width)) * count
    if len(packed) < end:
        raise BadVerifyMessage(f"{what}: {len(packed)} bytes do not hold {count} sub-buckets and counts")
    subs = _unpack("I", packed[:4 * count], count, what)
    counts = _unpack(str(width), packed[4 * count:end], count, what)
    values = _unpack("I", packed[end:], sum(counts), what)
    if any(not 0 <= sub < n * k for sub in subs) or any(a >= b for a, b in itertools.pairwise(subs)):
        raise BadVerifyMessage(f"{what}: sub-buckets must be increasing and below {n * k}")
    return DetailRequest(n, k, salt, subs, counts, values)


def detail_answer(lacking: Sequence[int], extra: list[tuple[str, int]]) -> bytes:
    """The peer's answer: the copies it holds that match none of the owner's keys, (id, revision),
    in the header; the positions (in the owner's order) of the owner's keys it lacks, packed."""
    return head(extra=extra) + b"\n" + struct.pack(f"<{len(lacking)}I", *lacking)


def parse_detail_answer(body: bytes, sent: int) -> tuple[list[int], list[tuple[str, int]]]:
    """(positions the peer lacks, copies it holds in excess) of a detail answer to ``sent`` values."""
    what = DETAIL_RESPONSE
    header, packed = _header(body, what)
    positions = _unpack("I", packed, len(packed) // 4, what)
    if any(p >= sent for p in positions):
        raise BadVerifyMessage(f"{what} names a client position out of range")
    return list(positions), _copies(header.get("extra"), f"{what} 'extra'", MAX_EXTRA)


# --- DistroVerifyRemoveRequest: copies the owner confirms it no longer has ----------------------
def remove_request(copies: list[tuple[str, int]]) -> bytes:
    """The owner's list of (client id, revision) the peer named and the owner does not hold."""
    return head(copies=copies) + b"\n"


def parse_remove_request(body: bytes) -> list[tuple[str, int]]:
    header, rest = _header(body, REMOVE_REQUEST)
    if rest:
        raise BadVerifyMessage(f"{REMOVE_REQUEST} has bytes after its header line")
    return _copies(header.get("copies"), f"{REMOVE_REQUEST} 'copies'", MAX_EXTRA)


def remove_answer(removed: int) -> bytes:
    return head(removed=removed) + b"\n"


def parse_remove_answer(body: bytes) -> int:
    header, _ = _header(body, REMOVE_RESPONSE)
    return _int(header, "removed", REMOVE_RESPONSE)
