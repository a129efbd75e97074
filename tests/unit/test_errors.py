"""The one error vocabulary: each class's wire codes, and no raw codes in the transports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shoal.transport
from shoal import errors
from shoal.auth.service import AdminExists, TooManyLogins
from shoal.errors import (
    BadRequestBody,
    BadVerifyMessage,
    ClientDisconnected,
    Conflict,
    CpUnavailable,
    Forbidden,
    ForwardFailed,
    FunctionDisabled,
    FuzzyWatchMatchOverLimit,
    FuzzyWatchPatternOverLimit,
    IllegalNamespace,
    InvalidParam,
    MissingParam,
    NacosError,
    NamespaceAlreadyExist,
    NamespaceNotExist,
    NoHandler,
    NotFound,
    OverThreshold,
    ParamCheckFailed,
    PayloadTooLarge,
    ServerStarting,
    ServiceAlreadyExists,
    ServiceNotEmpty,
    ServiceNotFound,
    TooManyRequests,
    UnknownService,
    Unregistered,
    WeightError,
)

# class → (Nacos code, HTTP status, v2 ErrorCode, v2 message): the wire answers the tests and
# Nacos clients rely on. A new error class must be added here.
TABLE: dict[type[NacosError], tuple[int, int, int, str]] = {
    NacosError: (500, 500, 30000, "server error"),
    InvalidParam: (400, 400, 20002, "parameter validate error"),
    MissingParam: (400, 400, 10000, "parameter missing"),
    WeightError: (400, 400, 21001, "weight error"),
    ServiceAlreadyExists: (400, 400, 21007, "service already exist"),
    UnknownService: (400, 400, 21008, "service not exist"),
    ServiceNotEmpty: (400, 400, 21009, "service delete failure"),
    ParamCheckFailed: (400, 400, 20002, "parameter validate error"),
    PayloadTooLarge: (400, 413, 20002, "parameter validate error"),
    ClientDisconnected: (-401, 500, 30000, "server error"),
    Unregistered: (301, 500, 30000, "server error"),
    NoHandler: (302, 500, 30000, "server error"),
    ServerStarting: (300, 500, 30000, "server error"),
    BadRequestBody: (502, 502, 30000, "server error"),
    BadVerifyMessage: (502, 502, 30000, "server error"),
    ForwardFailed: (502, 502, 30000, "server error"),
    Forbidden: (403, 403, 10001, "access denied"),
    NotFound: (404, 404, 20004, "resource not found"),
    ServiceNotFound: (404, 404, 21008, "service not exist"),
    Conflict: (409, 409, 20005, "resource conflict"),
    TooManyRequests: (429, 429, 30000, "server error"),
    OverThreshold: (503, 503, 30000, "server error"),
    CpUnavailable: (503, 503, 30000, "server error"),
    FunctionDisabled: (501, 501, 40001, "API function disabled."),
    FuzzyWatchPatternOverLimit: (50310, 503, 50310, "fuzzy watch pattern over limit"),
    FuzzyWatchMatchOverLimit: (50311, 503, 50311, "fuzzy watch pattern matched count over limit"),
    IllegalNamespace: (400, 400, 22000, "illegal namespace"),
    NamespaceNotExist: (404, 404, 22001, "namespace not exist"),
    NamespaceAlreadyExist: (409, 500, 22002, "namespace already exist"),
}


def _instance(cls: type[NacosError]) -> NacosError:
    if cls in (MissingParam, ParamCheckFailed):
        return cls("x")  # type: ignore[call-arg]
    return cls()


@pytest.mark.parametrize("cls", list(TABLE), ids=lambda c: c.__name__)
def test_each_error_class_carries_its_wire_codes(cls: type[NacosError]) -> None:
    exc = _instance(cls)
    assert (exc.code, exc.http_status, exc.v2_code, exc.v2_text) == TABLE[cls]
    assert (cls.code, cls.http_status, cls.v2_code) == TABLE[cls][:3]  # class attributes, not per instance


def test_every_error_class_is_in_the_table() -> None:
    def walk(cls: type[NacosError]) -> set[type[NacosError]]:
        found = {cls}
        for sub in cls.__subclasses__():
            found |= walk(sub)
        return found

    declared = {c for c in walk(NacosError) if c.__module__ == errors.__name__}
    assert declared == set(TABLE)


def test_default_messages_and_retry_after() -> None:
    assert Unregistered().message == "Connection is unregistered."
    assert NoHandler().message == "RequestHandler Not Found"
    assert ServerStarting().message == "Server is starting,please try later."
    assert WeightError().message == "instance format invalid: The weights range from 0.0 to 10000.0"
    assert TooManyRequests().retry_after_s == 60 and NacosError().retry_after_s is None
    assert MissingParam("serviceName").message == "Param 'serviceName' is required."


def test_domain_errors_outside_errors_py_inherit_their_codes() -> None:
    assert (TooManyLogins.code, TooManyLogins.http_status, TooManyLogins.retry_after_s) == (429, 429, 60)
    assert (AdminExists.code, AdminExists.http_status, AdminExists.v2_code) == (409, 409, 20005)


# --- no raw status / code numbers in the transports ----------------------------------------
_KEYWORDS = frozenset({"status", "code", "result_code", "error_code"})


def _int_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def raw_codes(source: str, filename: str) -> list[str]:
    """``name=<int literal>`` for a status/code keyword, and int literals given to ``*.Response``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg in _KEYWORDS and _int_literal(kw.value) and ast.literal_eval(kw.value) != 200:
                found.append(f"{filename}:{node.lineno} {kw.arg}={ast.unparse(kw.value)}")
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name.endswith("Response"):
            found.extend(f"{filename}:{node.lineno} {name}({ast.unparse(arg)})"
                         for arg in node.args if _int_literal(arg))
        if name == "error" and any(_int_literal(arg) for arg in node.args):  # codec.error(result, code, ...)
            found.append(f"{filename}:{node.lineno} {ast.unparse(node)[:60]}")
    return found


def test_the_scan_catches_raw_codes() -> None:
    bad = ("web.Response(status=429, text='x')\nraise_it(code=-401)\ncodec.error(500, 400, 'm')\n"
           "json_text(body, status=HttpStatus.OK)\nweb.Response(status=200)\n")
    assert [hit.split(" ", 1)[1] for hit in raw_codes(bad, "x.py")] == [
        "status=429", "code=-401", "codec.error(500, 400, 'm')"]


def test_transports_use_no_raw_status_or_code_numbers() -> None:
    root = Path(shoal.transport.__file__).parent
    hits: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if "_proto" in path.parts:
            continue
        hits.extend(raw_codes(path.read_text(encoding="utf-8"), str(path.relative_to(root))))
    assert hits == []
