"""Shape checks of cluster request bodies, run by :class:`~shoal.distro.protocol.DistroProtocol`
before a concern's handler sees the bytes.

The cluster port takes bodies from peers; a peer with a bug (or a caller that got past the
member check) must get an answer, not a traceback: the SDK port answers a body that is not a
JSON object with 502 (``BadRequestBody``), and the cluster port now does the same for each body
that does not have its request type's shape. A check parses only what it must: the JSON part
(header or whole body) and the field types the handler relies on. Binary parts (sync batches,
digests) are checked by their decoders, whose ``ValueError`` (``SyncDecodeError``, ...) the
cluster server answers 500 without a traceback, as Nacos answers a distro request that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal import jsonfast
from shoal.errors import BadRequestBody

__all__ = ["BodyCheck", "binary", "detail_request", "digest_request", "header_line", "json_object",
           "report_request", "snapshot_request"]

#: Checks one request body; raises BadRequestBody when it does not have the expected shape.
BodyCheck = Callable[[bytes], None]


def json_object(data: bytes, what: str) -> dict[str, Any]:
    """``data`` parsed as a JSON object (depth-limited); BadRequestBody otherwise."""
    try:
        value = jsonfast.loads(data)
    except ValueError as exc:  # not UTF-8, not JSON, or nested too deeply
        raise BadRequestBody(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequestBody(f"{what} must be a JSON object, not a JSON {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _int_field(obj: dict[str, Any], key: str, what: str, low: int = 0, required: bool = False) -> None:
    value = obj.get(key)
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequestBody(f"{what}: '{key}' must be an integer >= {low}")


def binary(body: bytes) -> None:
    """A binary body (a sync batch): its decoder is the check."""


def report_request(body: bytes) -> None:
    """MemberReportRequest: the body is not read (the sender header names the member)."""


def snapshot_request(body: bytes) -> None:
    """DistroSnapshotRequest: empty, or ``{"session": str|int, "offset": int >= 0}`` (both optional)."""
    if not body:
        return
    request = json_object(body, "DistroSnapshotRequest body")
    session = request.get("session")
    if session is not None and (isinstance(session, bool) or not isinstance(session, str | int)):
        raise BadRequestBody("DistroSnapshotRequest body: 'session' must be a string")
    _int_field(request, "offset", "DistroSnapshotRequest body")


def header_line(body: bytes, what: str) -> tuple[dict[str, Any], bytes]:
    """A body made of a JSON object on the first line and binary after it: (header, rest)."""
    head, sep, rest = body.partition(b"\n")
    if not sep:
        raise BadRequestBody(f"{what} has no header line")
    return json_object(head, f"{what} header"), rest


def digest_request(body: bytes) -> None:
    """DistroVerifyRequest: a JSON header line with ``buckets`` (int >= 1), then 8 bytes per bucket."""
    what = "DistroVerifyRequest"
    header, packed = header_line(body, what)
    _int_field(header, "buckets", f"{what} header", low=1, required=True)
    if len(packed) != 8 * header["buckets"]:
        raise BadRequestBody(f"{what}: {len(packed)} bytes of digests for {header['buckets']} buckets")


def detail_request(body: bytes) -> None:
    """DistroVerifyDetailRequest: ``{"buckets": int >= 1, "clients": {"<bucket>": [[id, revision], ...]}}``."""
    what = "DistroVerifyDetailRequest body"
    request = json_object(body, what)
    _int_field(request, "buckets", what, low=1, required=True)
    clients = request.get("clients")
    if not isinstance(clients, dict):
        raise BadRequestBody(f"{what}: 'clients' must be an object of buckets")
    for bucket, pairs in clients.items():
        if not (bucket.isascii() and bucket.isdigit()) or not isinstance(pairs, list):
            raise BadRequestBody(f"{what}: 'clients' maps bucket numbers to lists of [id, revision]")
        for pair in pairs:
            if (not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str)
                    or isinstance(pair[1], bool) or not isinstance(pair[1], int)):
                raise BadRequestBody(f"{what}: each client is [id, revision]")
