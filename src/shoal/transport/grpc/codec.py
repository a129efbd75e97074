"""Payload ⇄ JSON: ``metadata.type`` is the Java simple class name, the body an ``Any`` whose
``value`` is UTF-8 JSON and whose ``type_url`` stays empty (docs/protocol.md §1.3)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shoal.errors import BadRequestBody
from shoal.transport.grpc._proto import Metadata, Payload

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_OK_HEAD = '{"resultCode":200,"errorCode":0,"success":true'


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


_decoder = json.JSONDecoder(parse_constant=_reject_constant)


def encode(type_name: str, body_json: str) -> Any:
    return Payload(metadata=Metadata(type=type_name), body={"value": body_json.encode()})


def decode_body(payload: Any) -> dict[str, Any]:
    """The request body as a dict; anything else is a 502 (Nacos's answer to a bad body)."""
    return parse_body(payload.body.value)


def parse_body(raw: bytes) -> dict[str, Any]:
    """``body.value`` bytes as a dict; anything else is a 502 (BadRequestBody)."""
    try:
        body = _decoder.decode(raw.decode("utf-8")) if raw else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequestBody(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # hostile nesting, not a server fault
        raise BadRequestBody("request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequestBody("request body must be a JSON object")
    return body


def dumps(value: Any) -> str:
    return _dumps(value)


def ok(fields: Mapping[str, Any] | None = None, raw: Mapping[str, str] | None = None) -> str:
    """A successful response body; ``raw`` values are already-encoded JSON (e.g. serviceInfo)."""
    parts = [_OK_HEAD]
    if fields:
        parts.append("," + _dumps(fields)[1:-1])
    if raw:
        for key, value in raw.items():
            parts.append(f',"{key}":{value}')
    parts.append("}")
    return "".join(parts)


def error(result_code: int, error_code: int, message: str, fields: Mapping[str, Any] | None = None) -> str:
    body: dict[str, Any] = {"resultCode": result_code, "errorCode": error_code, "message": message, "success": False}
    if fields:
        body.update(fields)
    return _dumps(body)


def server_request(fields: Mapping[str, Any], request_id: str, raw: Mapping[str, str] | None = None) -> str:
    """A server→client request body: always ``headers:{}`` and the request id (docs/protocol.md §2.4)."""
    head = {"headers": {}, "requestId": request_id, **fields}
    text = _dumps(head)
    if not raw:
        return text
    return text[:-1] + "".join(f',"{k}":{v}' for k, v in raw.items()) + "}"
