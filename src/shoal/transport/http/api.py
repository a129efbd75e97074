"""Answer shapes of the Open API generations, and typed errors → wire (spec §7.1).

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

from shoal.errors import Forbidden, InvalidParam, NacosError, NotFound
from shoal.transport.http.params import DetailedInvalid, MissingParam


class Api(Enum):
    V1 = "v1"
    V2 = "v2"
    CORE = "core"


# Nacos ErrorCode (API/model/v2/ErrorCode.java) used by the v2 answers.
ERROR_TEXT = {
    10000: "parameter missing", 10001: "access denied", 20002: "parameter validate error",
    20004: "resource not found", 20005: "resource conflict", 21001: "weight error",
    21003: "instance not found", 21007: "service already exist", 21008: "service not exist",
    21009: "service delete failure", 30000: "server error",
}
PARAMETER_MISSING, ACCESS_DENIED, PARAMETER_VALIDATE_ERROR = 10000, 10001, 20002
RESOURCE_NOT_FOUND, RESOURCE_CONFLICT, SERVER_ERROR = 20004, 20005, 30000
INSTANCE_NOT_FOUND, SERVICE_ALREADY_EXIST, SERVICE_NOT_EXIST, SERVICE_DELETE_FAILURE = 21003, 21007, 21008, 21009

_PASSED_STATUS = frozenset({400, 403, 404, 409, 429, 502, 503})
JSON = "application/json"


class ApiError(NacosError):
    """An error with an explicit v2 ErrorCode (and the HTTP status in ``code``)."""

    def __init__(self, message: str, status: int, detail: int) -> None:
        super().__init__(message, status)
        self.detail = detail


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def ok_text(text: str = "ok") -> web.Response:
    return web.Response(text=text)


def json_text(body: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=body, status=status, content_type=JSON, headers=headers)


def v2_ok(data_json: str) -> web.Response:
    return web.Response(text=f'{{"code":0,"message":"success","data":{data_json}}}', content_type=JSON)


def core_ok(data: Any = None, message: str | None = None) -> web.Response:
    return json_text(dumps({"code": 200, "message": message, "data": data}))


def http_status(exc: NacosError) -> int:
    return exc.code if exc.code in _PASSED_STATUS else 500


def v2_detail(exc: NacosError) -> int:
    if isinstance(exc, ApiError):
        return exc.detail
    if isinstance(exc, MissingParam):
        return PARAMETER_MISSING
    if isinstance(exc, DetailedInvalid):
        return exc.detail
    if isinstance(exc, InvalidParam):
        return PARAMETER_VALIDATE_ERROR
    if isinstance(exc, Forbidden):
        return ACCESS_DENIED
    if isinstance(exc, NotFound):
        return RESOURCE_NOT_FOUND
    if exc.code == 409:
        return RESOURCE_CONFLICT
    return SERVER_ERROR


def error_response(api: Api, exc: NacosError) -> web.Response:
    status = http_status(exc)
    headers = {"Retry-After": "60"} if status == 429 else None
    if api is Api.V1:
        return web.Response(status=status, text=exc.message, headers=headers)
    if api is Api.V2:
        detail = v2_detail(exc)
        return json_text(dumps({"code": detail, "message": ERROR_TEXT.get(detail, "error"), "data": exc.message}),
                         status, headers)
    return json_text(dumps({"code": status, "message": exc.message, "data": None}), status, headers)
