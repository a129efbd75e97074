"""JSON bodies as UTF-8 bytes, with orjson when it is installed (a dependency) and the standard
library otherwise.

Meant for the gRPC transport, whose bodies are bytes on both sides (``shoal.kernels.payload``
returns and takes the ``Any.value`` bytes): ``loads(body)`` parses without a detour through
``str``, ``dumps(value)`` writes compact UTF-8 (no ASCII escaping), as ``transport/grpc/codec.py``
writes today.

Both backends agree on every body a Nacos SDK sends: objects, arrays, strings (any Unicode),
64-bit integers, finite floats, booleans, null. Where they do not, the rule is the standard
library's, checked after orjson declines:

* ``loads`` rejects ``NaN``/``Infinity`` literals, bytes that are not UTF-8 and hostile nesting
  (deeper than :data:`MAX_DEPTH`, or the recursion limit) with a ``ValueError`` (as
  ``codec.decode_body``'s decoder does); input orjson rejects that the standard library accepts
  (a lone-surrogate escape such as ``"\\ud800"``, a float past the double range such as
  ``1e400``) is parsed by the standard library. An integer past 64 bits comes back as a
  float under orjson and as an int otherwise: no Nacos field holds one.
* ``dumps`` raises ``ValueError`` for a non-finite float and ``TypeError`` for a non-str key,
  an int past 64 bits, a str with a lone surrogate or a type JSON has no form for, on both
  backends.
"""

from __future__ import annotations

import json
import math
from typing import Any

try:
    import orjson  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # not installed yet in this environment: same results, slower
    orjson = None  # type: ignore[assignment,unused-ignore]

__all__ = ["BACKEND", "MAX_DEPTH", "dumps", "loads"]

#: The deepest nesting ``loads`` accepts: orjson's fixed limit. Deeper input is a ValueError on both
#: backends (the standard library stops at the interpreter's recursion limit, about as deep).
MAX_DEPTH = 1024

#: "orjson" or "json": which library does the work in this process.
BACKEND: str = "json" if orjson is None else "orjson"


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


_decode = json.JSONDecoder(parse_constant=_reject_constant).decode
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _loads_json(data: bytes | bytearray | memoryview | str) -> Any:
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        return _decode(text)
    except RecursionError:  # hostile nesting: the parser hit the interpreter's recursion limit
        raise ValueError("JSON nested too deeply") from None


def _dumps_json(value: Any) -> bytes:
    _check_keys(value)
    try:
        return _encode(value).encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: orjson's TypeError
        raise TypeError(f"str is not valid UTF-8: {exc.reason}") from None


def _check_keys(value: Any) -> None:
    """orjson's rules for what the standard library would convert silently."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be str, got {type(key).__name__}")
            _check_keys(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_keys(item)
    elif isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        raise TypeError("integer exceeds the 64-bit range")


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(item) for item in value)
    return False


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse one JSON document; ``ValueError`` if it is not valid JSON (or not UTF-8)."""
    if orjson is None:
        return _loads_json(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # a ValueError; the standard library has the last word
        return _loads_json(data)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of ``value`` (dicts with str keys, lists, tuples, str, int, float, bool, None)."""
    if orjson is None:
        return _dumps_json(value)
    try:
        data: bytes = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # a TypeError
        raise TypeError(str(exc)) from None
    if b"null" in data and _has_non_finite(value):  # orjson writes NaN and ±Infinity as null
        raise ValueError("non-finite float is not valid JSON")
    return data
