"""Payload ⇄ JSON: ``metadata.type`` is the Java simple class name, the body an ``Any`` whose
``value`` is UTF-8 JSON and whose ``type_url`` stays empty (docs/protocol.md §1.3).

Bodies are UTF-8 bytes on both sides (``shoal.kernels.payload`` takes and returns the ``Any.value``
bytes), parsed and written by :mod:`shoal.jsonfast` (orjson when installed): no detour through
``str`` on the request path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal import jsonfast
from shoal.errors import BadRequestBody
from shoal.kernels.payload import encode as encode_payload
from shoal.transport.grpc._proto import Metadata, Payload

_OK_HEAD = b'{"resultCode":200,"errorCode":0,"success":true'
_OK_EMPTY = _OK_HEAD + b"}"


def encode(type_name: str, body_json: str) -> Any:
    return Payload(metadata=Metadata(type=type_name), body={"value": body_json.encode()})


def decode_body(payload: Any) -> dict[str, Any]:
    """The request body as a dict; anything else is a 502 (Nacos's answer to a bad body)."""
    return parse_body(payload.body.value)


def parse_body(raw: bytes) -> dict[str, Any]:
    """``body.value`` bytes as a dict; anything else is a 502 (BadRequestBody)."""
    if not raw:
        return {}
    try:
        body = jsonfast.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise BadRequestBody(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # hostile nesting, not a server fault
        raise BadRequestBody("request body is not valid JSON: nested too deeply") from None
    if type(body) is not dict:
        raise BadRequestBody("request body must be a JSON object")
    return body


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of ``value``."""
    return jsonfast.dumps(value)


def ok(fields: Mapping[str, Any] | None = None, raw: Mapping[str, str | bytes] | None = None) -> bytes:
    """A successful response body; ``raw`` values are already-encoded JSON (e.g. serviceInfo)."""
    if not fields and not raw:
        return _OK_EMPTY
    parts = [_OK_HEAD]
    if fields:
        parts.append(b"," + jsonfast.dumps(fields)[1:-1])
    if raw:
        for key, value in raw.items():
            parts.append(b',"%s":' % key.encode())
            parts.append(value.encode() if isinstance(value, str) else value)
    parts.append(b"}")
    return b"".join(parts)


def ok_service_info(parts: tuple[bytes, int, bytes], fields: Mapping[str, Any] | None = None) -> bytes:
    """A successful response carrying ``serviceInfo`` given as ``(prefix, lastRefTime, suffix)``
    (``NamingReads.query_parts``), written in one pass."""
    head = _OK_HEAD + b"," + jsonfast.dumps(fields)[1:-1] if fields else _OK_HEAD
    prefix, ref, suffix = parts
    return b"".join((head, b',"serviceInfo":', prefix, b"%d" % ref, suffix, b"}"))


class Encoded:
    """A whole answer Payload that its handler encoded itself: ``SdkServer.unary`` sends ``data`` as is."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class ServiceInfoAnswers:
    """Encoded ``response_type`` answers carrying a cached ServiceInfo (``NamingReads.query_parts``).

    The ServiceInfo of a service and reader is cached as ``(prefix, suffix)`` bytes around its
    lastRefTime, which every answer must advance. The whole answer Payload of one ``(prefix,
    suffix)`` is encoded once; later answers are that Payload with their own lastRefTime written over
    the old digits (same count of digits: same length, so the same length prefixes): one copy of a
    ~37 KB answer (100 hosts) instead of the body's join plus the Payload encoding's copy. The
    templates are dropped all at once when they pass ``max_bytes`` (a changed service's old template
    lingers until then)."""

    def __init__(self, response_type: str, max_bytes: int = 16 << 20) -> None:
        self.response_type = response_type
        self.max_bytes = max_bytes
        self._templates: dict[tuple[bytes, bytes], tuple[memoryview, int, int]] = {}
        self._bytes = 0

    def answer(self, parts: tuple[bytes, int, bytes]) -> Encoded:
        prefix, ref, suffix = parts
        digits = b"%d" % ref
        key = (prefix, suffix)
        template = self._templates.get(key)
        if template is not None:
            data, at, width = template
            if width == len(digits):
                return Encoded(b"".join((data[:at], digits, data[at + width:])))
        encoded = encode_payload(self.response_type, ok_service_info(parts))
        at = len(encoded) - len(suffix) - 1 - len(digits)  # the body is the Payload's last field
        if len(encoded) <= self.max_bytes and encoded[at:at + len(digits)] == digits and \
                encoded.endswith(suffix + b"}"):
            if self._bytes + len(encoded) > self.max_bytes:
                self._templates.clear()
                self._bytes = 0
            self._templates[key] = (memoryview(encoded), at, len(digits))
            self._bytes += len(encoded)
        return Encoded(encoded)


def error(result_code: int, error_code: int, message: str, fields: Mapping[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"resultCode": result_code, "errorCode": error_code, "message": message, "success": False}
    if fields:
        body.update(fields)
    return jsonfast.dumps(body)


def server_request(fields: Mapping[str, Any], request_id: str, raw: Mapping[str, str | bytes] | None = None) -> bytes:
    """A server→client request body: always ``headers:{}`` and the request id (docs/protocol.md §2.4)."""
    text = jsonfast.dumps({"headers": {}, "requestId": request_id, **fields})
    if not raw:
        return text
    parts = [text[:-1]]
    for key, value in raw.items():
        parts.append(b',"%s":' % key.encode())
        parts.append(value.encode() if isinstance(value, str) else value)
    parts.append(b"}")
    return b"".join(parts)
