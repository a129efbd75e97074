"""Answer shapes of the Open API generations, and typed errors → wire (docs/protocol.md §5.1).

* v1: success is plain text ``ok`` or a JSON object; an error is the HTTP status of its code
  with a plain-text message.
* v2: ``{"code":0,"message":"success","data":...}``; an error uses the HTTP status of its code
  and ``{"code":<ErrorCode>,"message":<its text>,"data":<the detail message>}``.
* core (cluster endpoints, user administration): RestResult ``{"code":200,"message":...,"data":...}``.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from aiohttp import web

from shoal.errors import V2_TEXT, Code, HttpStatus, NacosError, V2Code


class Api(Enum):
    """The Open API generation a route belongs to: it picks the answer and error shapes."""

    V1 = "v1"
    V2 = "v2"
    CORE = "core"


JSON = "application/json"
_V2_OK_HEAD = f'{{"code":{V2Code.SUCCESS},"message":"{V2_TEXT[V2Code.SUCCESS]}","data":'


def dumps(obj: Any) -> str:
    """Compact JSON that keeps non-ASCII text as is (as Jackson writes it)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def ok_text(text: str = "ok") -> web.Response:
    """A v1 success as plain text."""
    return web.Response(text=text)


def json_text(body: str, status: int = HttpStatus.OK, headers: dict[str, str] | None = None) -> web.Response:
    """An already-encoded JSON body."""
    return web.Response(text=body, status=status, content_type=JSON, headers=headers)


def v2_ok(data_json: str) -> web.Response:
    """A v2 success envelope around already-encoded JSON ``data``."""
    return web.Response(text=f"{_V2_OK_HEAD}{data_json}}}", content_type=JSON)


def core_ok(data: Any = None, message: str | None = None) -> web.Response:
    """A core RestResult success."""
    return json_text(dumps({"code": Code.SUCCESS, "message": message, "data": data}))


def error_response(api: Api, exc: NacosError) -> web.Response:
    """The error shape of ``api`` for ``exc``, read from its class attributes."""
    status = exc.http_status
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    if api is Api.V1:
        return web.Response(status=status, text=exc.message, headers=headers)
    if api is Api.V2:
        return json_text(dumps({"code": exc.v2_code, "message": exc.v2_text, "data": exc.message}), status, headers)
    return json_text(dumps({"code": status, "message": exc.message, "data": None}), status, headers)
