"""shoal.jsonfast: orjson and the standard library give the same results (the module's rules).

Each test runs on the standard-library backend, and on orjson where it is installed.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

import shoal.jsonfast


@pytest.fixture(params=["json", "orjson"])
def jsonfast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    module = importlib.import_module("shoal.jsonfast")
    if request.param == "orjson":
        monkeypatch.setattr(module, "orjson", pytest.importorskip("orjson"))
    else:
        monkeypatch.setattr(module, "orjson", None)
    yield module


REGISTER = {
    "headers": {"app": "order-service"},
    "requestId": "1042",
    "namespace": "public",
    "serviceName": "order-service",
    "groupName": "DEFAULT_GROUP",
    "type": "registerInstance",
    "instance": {
        "instanceId": None,
        "ip": "10.0.0.1",
        "port": 8080,
        "weight": 1.5,
        "healthy": True,
        "enabled": False,
        "metadata": {"zone": 'ä😀\u2028\x00\x1f/\\"', "big": str(2**70)},
        "instanceHeartBeatInterval": 2**63 - 1,
        "lastBeat": -(2**63),
    },
    "list": [1, -0.0, 1e-300, 1.7976931348623157e308, [], {}],
}


def test_backend_names_the_library() -> None:
    assert shoal.jsonfast.BACKEND in ("json", "orjson")


def test_round_trip_of_a_request_body(jsonfast: ModuleType) -> None:
    data = jsonfast.dumps(REGISTER)
    assert isinstance(data, bytes)
    assert json.loads(data) == REGISTER
    assert jsonfast.loads(data) == REGISTER
    assert jsonfast.loads(data.decode()) == REGISTER
    assert jsonfast.loads(bytearray(data)) == REGISTER


def test_dumps_is_compact_utf8_like_the_grpc_codec(jsonfast: ModuleType) -> None:
    value = {"a": [1, "é", None, True], "b": {"c": 0.5}}
    assert jsonfast.dumps(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert jsonfast.dumps(("x", 1)) == b'["x",1]'


@pytest.mark.parametrize(
    "value", [float("nan"), {"w": float("inf")}, [1, -math.inf]], ids=["nan", "inf-in-object", "-inf-in-array"]
)
def test_dumps_rejects_non_finite_floats(jsonfast: ModuleType, value: Any) -> None:
    with pytest.raises(ValueError):
        jsonfast.dumps(value)


@pytest.mark.parametrize(
    "value",
    [{1: "a"}, {"a": {None: 1}}, 2**64, [-(2**63) - 1], "\ud800", {"k": b"bytes"}, {"k": object()}],
    ids=["int-key", "none-key", "2**64", "below-int64", "surrogate", "bytes", "object"],
)
def test_dumps_rejects_what_json_cannot_hold(jsonfast: ModuleType, value: Any) -> None:
    with pytest.raises(TypeError):
        jsonfast.dumps(value)


@pytest.mark.parametrize(
    "data",
    [b"NaN", b'{"a":Infinity}', b"[-Infinity]", b"\xff", b'{"a":"\xc0\x80"}', b"", b"{", b"[1,]", b"{} {}"],
)
def test_loads_rejects_like_the_grpc_codec(jsonfast: ModuleType, data: bytes) -> None:
    with pytest.raises(ValueError):
        jsonfast.loads(data)


@pytest.mark.parametrize(("data", "expected"), [(b'"\\ud800"', "\ud800"), (b"[1e400]", [math.inf])])
def test_loads_accepts_what_the_standard_library_accepts(jsonfast: ModuleType, data: bytes, expected: Any) -> None:
    assert jsonfast.loads(data) == expected


@pytest.mark.parametrize("depth", [1_025, 50_000])
def test_hostile_nesting_is_a_value_error_on_both_backends(jsonfast: ModuleType, depth: int) -> None:
    # orjson stops at 1,024 levels; the standard library at the recursion limit (a RecursionError,
    # which is no ValueError): both must be the ValueError every caller already handles.
    for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        with pytest.raises(ValueError):
            jsonfast.loads(text.encode())


def test_nesting_within_the_limit_still_parses(jsonfast: ModuleType) -> None:
    value: Any = jsonfast.loads(b"[" * 500 + b"]" * 500)
    for _ in range(499):
        value = value[0]
    assert value == []
