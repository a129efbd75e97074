"""Shape checks of cluster request bodies, run by :class:`~shoal.distro.protocol.DistroProtocol`
before a concern's handler sees the bytes.

The cluster port takes bodies from peers; a peer with a bug (or a caller that got past the
member check) must get an answer, not a traceback: the SDK port answers a body that is not a
JSON object with 502 (``BadRequestBody``), and the cluster port now does the same for each body
that does not have its request type's shape. A check parses only what it must: the JSON part
(header or whole body) and the field types the handler relies on. A binary sync batch is checked
by its decoder (``SyncDecodeError``, a ValueError, which the cluster server answers 500 without a
traceback, as Nacos answers a distro request that failed); the verify messages by their one
parser in :mod:`shoal.distro.verify.wire` (``BadVerifyMessage``, 502 like the checks here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal import jsonfast
from shoal.cp.store import Keyspace
from shoal.errors import BadRequestBody

__all__ = ["BodyCheck", "binary", "json_object", "report_request", "snapshot_request",
           "verify_message"]

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


def verify_message(body: bytes) -> None:
    """The verify requests: parsed once, by their handler (:mod:`shoal.distro.verify.wire`), whose
    parser refuses a body without its shape with BadVerifyMessage, a BadRequestBody (502)."""


def report_request(body: bytes) -> None:
    """MemberReportRequest: empty, or a JSON object whose ``node`` (the sender's Member JSON) is an
    object, ``nodeAddress`` a string and ``workers`` a list of ports, each when present (the sender
    header names the member; the body says its node and the node's workers, docs/protocol.md §6.2)."""
    if not body:
        return
    what = "MemberReportRequest body"
    report = json_object(body, what)
    if not isinstance(report.get("node", {}), dict):
        raise BadRequestBody(f"{what}: 'node' must be a JSON object")
    if not isinstance(report.get("nodeAddress", ""), str):
        raise BadRequestBody(f"{what}: 'nodeAddress' must be a string")
    workers = report.get("workers", [])
    if not isinstance(workers, list) or any(
            isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536 for p in workers):
        raise BadRequestBody(f"{what}: 'workers' must be a list of ports")


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


def cp_catch_up_request(body: bytes) -> None:
    """CpCatchUpRequest: ``{"keyspace": a CP keyspace, "revision": int >= 0}``, both required."""
    what = "CpCatchUpRequest body"
    request = json_object(body, what)
    if request.get("keyspace") not in {k.value for k in Keyspace}:
        raise BadRequestBody(f"{what}: 'keyspace' must name a CP keyspace")
    _int_field(request, "revision", what, required=True)
