"""Shape checks of cluster request bodies, run by :class:`~shoal.distro.protocol.DistroProtocol`
before a concern's handler sees the bytes.

The cluster port takes bodies from peers; a peer with a bug (or a caller that got past the
member check) must get an answer, not a traceback: the SDK port answers a body that is not a
JSON object with 502 (``BadRequestBody``), and the cluster port now does the same for each body
that does not have its request type's shape. A check parses only what it must: the JSON part
(header or whole body) and the field types the handler relies on. The handler checks the rest
(the verify wire version, value ranges, the binary parts' lengths, a sync batch) with a
ValueError (``SyncDecodeError``, ...), which the cluster server answers 500 without a
traceback, as Nacos answers a distro request that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal import jsonfast
from shoal.errors import BadRequestBody

__all__ = ["BodyCheck", "binary", "detail_request", "digest_request", "header_line", "json_object",
           "report_request", "snapshot_request", "sub_digest_request"]

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
    """DistroSnapshotRequest: empty, or ``{"session": str|int, "offset": int >= 0, "stream": bool}`` (all
    optional)."""
    if not body:
        return
    request = json_object(body, "DistroSnapshotRequest body")
    session = request.get("session")
    if session is not None and (isinstance(session, bool) or not isinstance(session, str | int)):
        raise BadRequestBody("DistroSnapshotRequest body: 'session' must be a string")
    _int_field(request, "offset", "DistroSnapshotRequest body")
    if not isinstance(request.get("stream", False), bool):
        raise BadRequestBody("DistroSnapshotRequest body: 'stream' must be a boolean")


def header_line(body: bytes, what: str) -> tuple[dict[str, Any], bytes]:
    """A body made of a JSON object on the first line and binary after it: (header, rest)."""
    head, sep, rest = body.partition(b"\n")
    if not sep:
        raise BadRequestBody(f"{what} has no header line")
    return json_object(head, f"{what} header"), rest


def _int_list(obj: dict[str, Any], key: str, what: str) -> None:
    value = obj.get(key)
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise BadRequestBody(f"{what}: '{key}' must be a list of integers")


def digest_request(body: bytes) -> None:
    """DistroVerifyRequest: a JSON header line with ``buckets`` (int >= 1), then 8 bytes per bucket."""
    what = "DistroVerifyRequest"
    header, packed = header_line(body, what)
    _int_field(header, "buckets", f"{what} header", low=1, required=True)
    if len(packed) != 8 * header["buckets"]:
        raise BadRequestBody(f"{what}: {len(packed)} bytes of digests for {header['buckets']} buckets")


def sub_digest_request(body: bytes) -> None:
    """DistroVerifySubDigestRequest: a JSON header line ``{"buckets", "k", "salt", "list": [bucket...]}``,
    then packed sub-digests (their count is checked by the handler)."""
    what = "DistroVerifySubDigestRequest header"
    header, _packed = header_line(body, "DistroVerifySubDigestRequest")
    _int_field(header, "buckets", what, low=1, required=True)
    _int_field(header, "k", what, low=1, required=True)
    _int_field(header, "salt", what, required=True)
    _int_list(header, "list", what)


def detail_request(body: bytes) -> None:
    """DistroVerifyDetailRequest: a JSON header line ``{"buckets", "k", "salt", "subs", "counts"}``,
    then the packed sub-buckets, counts and keys (their lengths are checked by the handler)."""
    what = "DistroVerifyDetailRequest header"
    header, _packed = header_line(body, "DistroVerifyDetailRequest")
    _int_field(header, "buckets", what, low=1, required=True)
    _int_field(header, "k", what, low=1, required=True)
    _int_field(header, "salt", what, required=True)
    _int_field(header, "subs", what, required=True)
    if not isinstance(header.get("counts"), str):
        raise BadRequestBody(f"{what}: 'counts' must be a string")
