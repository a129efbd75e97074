"""payload kernel: Nacos gRPC Payload bytes ⇄ (type, headers, client ip, body).

Every test runs on both implementations (the ``payload`` fixture); the hypothesis tests at the
end check the compiled kernel against the twin on random and malformed input, and both against
the message classes the gRPC transport uses (``shoal.transport.grpc._proto``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.kernels import NO_EXTENSIONS
from shoal.kernels import payload as selected
from shoal.kernels.payload_py import PayloadDecodeError
from shoal.transport.grpc import codec
from shoal.transport.grpc._proto import Metadata, Payload


def _implementations() -> list[object]:
    params: list[object] = []
    if not NO_EXTENSIONS:
        params.append(pytest.param("shoal._ext.payload", id="cython", marks=pytest.mark.c_extension))
    params.append(pytest.param("shoal.kernels.payload_py", id="py"))
    return params


@pytest.fixture(params=_implementations())
def payload(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)


# -- wire-format helpers (written from the protobuf encoding rules, independent of both sides) --

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5


def uv(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return uv(field << 3 | wire_type)


def ld(field: int, data: bytes) -> bytes:
    return tag(field, LEN) + uv(len(data)) + data


def groups(depth: int, field: int = 5) -> bytes:
    return tag(field, SGROUP) * depth + tag(field, EGROUP) * depth


def md(*fields: bytes) -> bytes:
    return ld(2, b"".join(fields))


def body(*fields: bytes) -> bytes:
    return ld(3, b"".join(fields))


def entry(*fields: bytes) -> bytes:
    return ld(7, b"".join(fields))


def proto_values(data: bytes) -> tuple[str, dict[str, str], str, bytes]:
    message = Payload()
    message.ParseFromString(data)
    return message.metadata.type, dict(message.metadata.headers), message.metadata.clientIp, message.body.value


def same(result: tuple[str, dict[str, str], str, bytes], expected: tuple[str, dict[str, str], str, bytes]) -> None:
    """Equal values, headers in the same order too, and of exactly the declared types."""
    assert result == expected
    assert list(result[1].items()) == list(expected[1].items())
    assert [type(v) for v in result] == [str, dict, str, bytes]


# -- golden bytes ------------------------------------------------------------------------------

# A Nacos register request as the Java SDK sends it, written out by hand.
GOLDEN = (
    b"\x12\x38"  # field 2 (metadata), 56 bytes
    b"\x1a\x0fInstanceRequest"  # field 3 (type)
    b"\x3a\x11"  # field 7 (headers entry), 17 bytes
    b"\x0a\x0baccessToken"  # key
    b"\x12\x02ab"  # value
    b"\x3a\x07\x0a\x03app\x12\x00"  # entry app=""
    b"\x42\x0910.0.0.17"  # field 8 (clientIp)
    b"\x1a\x04"  # field 3 (body, Any), 4 bytes
    b"\x12\x02{}"  # Any field 2 (value); type_url empty, so absent
)
GOLDEN_VALUES = ("InstanceRequest", {"accessToken": "ab", "app": ""}, "10.0.0.17", b"{}")


def test_decode_golden(payload: ModuleType) -> None:
    same(payload.decode(GOLDEN), GOLDEN_VALUES)


def test_encode_golden(payload: ModuleType) -> None:
    type_, headers, client_ip, value = GOLDEN_VALUES
    assert payload.encode(type_, value, headers, client_ip) == GOLDEN
    assert payload.encode(type=type_, body=value, headers=headers, client_ip=client_ip) == GOLDEN


def test_encode_minimal_is_what_the_transport_sends_today(payload: ModuleType) -> None:
    # metadata and body are always present, even when empty (codec.encode sets both)
    assert payload.encode("", b"") == b"\x12\x00\x1a\x00"
    for type_, json in (("HealthCheckResponse", '{"resultCode":200}'), ("", ""), ("ServerCheckRequest", "{}")):
        assert payload.encode(type_, json.encode()) == codec.encode(type_, json).SerializeToString()


def test_selector_binds_one_of_them() -> None:
    assert selected.PayloadDecodeError is PayloadDecodeError
    assert issubclass(PayloadDecodeError, ValueError)
    same(selected.decode(GOLDEN), GOLDEN_VALUES)


# -- agreement with protobuf's own serializer ---------------------------------------------------

MESSAGES = [
    Payload(),
    Payload(metadata=Metadata(type="T")),
    Payload(body={"value": b"\x00\xff"}),
    Payload(body={"type_url": "type.googleapis.com/x", "value": b"v"}),
    Payload(metadata=Metadata(type="ÿ€😀", clientIp="::1", headers={"k": "v"}), body={"value": b"x" * 300}),
    Payload(metadata=Metadata(headers={f"key{i}": "v" * i for i in range(40)}), body={"value": b"y" * 70_000}),
]


@pytest.mark.parametrize("message", MESSAGES, ids=range(len(MESSAGES)))
def test_decode_what_protobuf_writes(payload: ModuleType, message: Any) -> None:
    for data in (message.SerializeToString(), message.SerializeToString(deterministic=True)):
        assert payload.decode(data) == proto_values(data)


@pytest.mark.parametrize(
    ("headers", "client_ip"),
    [(None, ""), ({}, "1.2.3.4"), ({"": ""}, ""), ({"k": ""}, "h"), ({"é": "😀"}, "ü")],
)
def test_encode_writes_protobufs_bytes(payload: ModuleType, headers: dict[str, str] | None, client_ip: str) -> None:
    for value in (b"", b"{}", b"z" * 200, b"z" * 20_000):
        message = Payload(metadata=Metadata(type="NotifySubscriberRequest", clientIp=client_ip), body={"value": value})
        if headers:
            message.metadata.headers.update(headers)
        data = payload.encode("NotifySubscriberRequest", value, headers, client_ip)
        assert data == message.SerializeToString()
        assert proto_values(data) == ("NotifySubscriberRequest", headers or {}, client_ip, value)


def test_encode_keeps_the_callers_header_order(payload: ModuleType) -> None:
    headers = {"b": "2", "a": "1", "ab": "3", "": "0", "é": "4"}
    data = payload.encode("T", b"", headers)
    same(payload.decode(data), ("T", headers, "", b""))
    assert proto_values(data)[1] == headers
    # In protobuf's deterministic order, the bytes are protobuf's deterministic bytes.
    reference = Payload(metadata=Metadata(type="T", headers=headers), body={})
    expected = reference.SerializeToString(deterministic=True)
    ordered = payload.decode(expected)[1]
    assert payload.encode("T", b"", ordered) == expected


def test_encode_accepts_any_mapping_and_buffer(payload: ModuleType) -> None:
    class Headers(Mapping[str, str]):
        def __getitem__(self, key: str) -> str:
            return {"x": "1"}[key]

        def __iter__(self) -> Iterator[str]:
            return iter(["x"])

        def __len__(self) -> int:
            return 1

    expected = payload.encode("T", b"abc", {"x": "1"})
    assert payload.encode("T", bytearray(b"abc"), MappingProxyType({"x": "1"})) == expected
    assert payload.encode("T", memoryview(b"abc"), Headers()) == expected


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((b"T", b""), TypeError),
        ((None, b""), TypeError),
        (("T", "body"), TypeError),
        (("T", 3), TypeError),
        (("T", b"", [("k", "v")]), TypeError),
        (("T", b"", {1: "v"}), TypeError),
        (("T", b"", {"k": b"v"}), TypeError),
        (("T", b"", {"k": None}), TypeError),
        (("T", b"", None, None), TypeError),
        (("T", b"", None, b"1.2.3.4"), TypeError),
        (("\ud800", b""), UnicodeEncodeError),
        (("T", b"", {"\udfff": "v"}), UnicodeEncodeError),
        (("T", b"", {"k": "a\ud800"}), UnicodeEncodeError),
        (("T", b"", None, "\ud800"), UnicodeEncodeError),
    ],
)
def test_encode_rejects_bad_arguments(payload: ModuleType, args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        payload.encode(*args)


# -- decoding: what is accepted -----------------------------------------------------------------


def test_decode_accepts_buffers(payload: ModuleType) -> None:
    same(payload.decode(bytearray(GOLDEN)), GOLDEN_VALUES)
    same(payload.decode(memoryview(GOLDEN)), GOLDEN_VALUES)
    same(payload.decode(memoryview(b"--" + GOLDEN)[2:]), GOLDEN_VALUES)


def test_decode_rejects_non_buffers(payload: ModuleType) -> None:
    with pytest.raises(TypeError):
        payload.decode("text")
    with pytest.raises(TypeError):
        payload.decode(None)
    with pytest.raises(BufferError):
        payload.decode(memoryview(GOLDEN)[::2])


ACCEPTED: list[tuple[str, bytes, tuple[str, dict[str, str], str, bytes]]] = [
    ("empty input: every field at its default", b"", ("", {}, "", b"")),
    ("empty submessages", md() + body(), ("", {}, "", b"")),
    (
        "unknown fields of every wire type at every level",
        tag(1, VARINT)
        + uv(2**64 - 1)
        + tag(4, I64)
        + b"12345678"
        + md(
            tag(1, I32) + b"1234",
            ld(3, b"t"),
            tag(9, VARINT) + b"\x00",
            entry(ld(1, b"k"), tag(3, VARINT) + b"\x05", ld(2, b"v"), ld(4, b"\xff")),
            groups(3, 6),
        )
        + ld(99, b"\xff\xfe")
        + body(ld(3, b"\xff"), tag(2**29 - 1, I32) + b"abcd", ld(2, b"b"))
        + groups(2),
        ("t", {"k": "v"}, "", b"b"),
    ),
    (
        "a second metadata merges into the first; a present empty string overrides",
        md(ld(3, b"a"), ld(8, b"ip"), entry(ld(1, b"x"), ld(2, b"1"))) + md(ld(3, b""), entry(ld(1, b"y"))),
        ("", {"x": "1", "y": ""}, "ip", b""),
    ),
    (
        "a repeated key keeps the last value and its first position",
        md(entry(ld(1, b"k"), ld(2, b"1")), entry(ld(1, b"j")), entry(ld(2, b"2"), ld(1, b"k"))),
        ("", {"k": "2", "j": ""}, "", b""),
    ),
    (
        "repeated fields inside an entry keep the last",
        md(entry(ld(1, b"a"), ld(1, b"b"), ld(2, b"1"), ld(2, b"2"))),
        ("", {"b": "2"}, "", b""),
    ),
    ("an entry of unknown fields only is the empty key", md(entry(tag(3, VARINT) + b"\x01")), ("", {"": ""}, "", b"")),
    ("a second body without a value keeps the first", body(ld(2, b"v")) + body(ld(1, b"u")), ("", {}, "", b"v")),
    ("the body's value is bytes, not UTF-8", body(ld(2, b"\xff\xc0")), ("", {}, "", b"\xff\xc0")),
    ("NUL and astral characters in strings", md(ld(3, "a\x00😀".encode())), ("a\x00😀", {}, "", b"")),
    (
        "non-minimal varints: tag of 5 bytes, length of 5 bytes, value of 10 bytes",
        b"\x8a\x80\x80\x80\x00" + b"\x80\x80\x80\x80\x00" + tag(1, VARINT) + b"\xff" * 9 + b"\x7f",
        ("", {}, "", b""),
    ),
    ("the largest field number", tag(2**29 - 1, SGROUP) + tag(2**29 - 1, EGROUP), ("", {}, "", b"")),
    ("groups nested 100 deep at the top", groups(100), ("", {}, "", b"")),
    ("groups nested 99 deep in metadata", md(groups(99)), ("", {}, "", b"")),
    ("groups nested 99 deep in the body", body(groups(99)), ("", {}, "", b"")),
    ("groups nested 98 deep in an entry", md(entry(groups(98))), ("", {"": ""}, "", b"")),
    ("a group holding what looks like a known field", tag(1, SGROUP) + md(b"\xff") + tag(1, EGROUP), ("", {}, "", b"")),
]


@pytest.mark.parametrize(("data", "expected"), [case[1:] for case in ACCEPTED], ids=[case[0] for case in ACCEPTED])
def test_decode_accepts(payload: ModuleType, data: bytes, expected: tuple[str, dict[str, str], str, bytes]) -> None:
    same(payload.decode(data), expected)


# -- decoding: what is rejected -----------------------------------------------------------------

WRONG_WIRE_TYPES = [
    (f"{where} field {field} as wire type {wire_type}", wrap(tag(field, wire_type) + filler))
    for where, wrap, fields in (
        ("Payload", lambda b: b, (2, 3)),
        ("Metadata", lambda b: md(b), (3, 7, 8)),
        ("entry", lambda b: md(entry(b)), (1, 2)),
        ("Any", lambda b: body(b), (1, 2)),
    )
    for field in fields
    for wire_type, filler in ((VARINT, b"\x01"), (I64, b"\x00" * 8), (I32, b"\x00" * 4), (SGROUP, tag(field, EGROUP)))
]

REJECTED: list[tuple[str, bytes]] = [
    ("truncated tag", b"\x80"),
    ("truncated varint value", tag(1, VARINT) + b"\x80"),
    ("truncated length", tag(1, LEN) + b"\x80\x80"),
    ("length past the end", ld(2, b"abc")[:-1]),
    ("length past the end of the enclosing message", md(b"\x1a\x05abc") + b"de"),
    ("huge length", tag(1, LEN) + b"\xff\xff\xff\xff\x0f"),
    ("truncated 64-bit value", tag(1, I64) + b"1234567"),
    ("truncated 32-bit value", tag(1, I32) + b"123"),
    ("tag longer than 5 bytes", b"\x88\x80\x80\x80\x80\x00" + b"\x01"),
    ("tag past 32 bits", b"\xf8\xff\xff\xff\x1f" + b"\x01"),
    ("length longer than 5 bytes", tag(1, LEN) + b"\x80\x80\x80\x80\x80\x00"),
    ("varint longer than 10 bytes", tag(1, VARINT) + b"\xff" * 10 + b"\x01"),
    ("wire type 6", tag(1, 6)),
    ("wire type 7", tag(1, 7)),
    ("field number 0", b"\x00\x00"),
    ("field number 0 in metadata", md(b"\x02\x00")),
    ("field number 0 in an entry", md(entry(b"\x00\x00"))),
    ("field number 0 in the body", body(b"\x05abcd")),
    ("field number 0 inside a group", tag(1, SGROUP) + b"\x00\x00" + tag(1, EGROUP)),
    ("field number 0 deep inside groups", tag(1, SGROUP) + groups(1, 0) + tag(1, EGROUP)),
    ("end-group outside a group", tag(1, EGROUP)),
    ("end-group in metadata", md(tag(1, EGROUP))),
    ("mismatched end-group", tag(1, SGROUP) + tag(2, EGROUP)),
    ("unterminated group", tag(1, SGROUP) + tag(1, VARINT) + b"\x00"),
    ("group running past its submessage", md(tag(1, SGROUP)) + tag(1, EGROUP)),
    ("groups nested 101 deep at the top", groups(101)),
    ("groups nested 100 deep in metadata", md(groups(100))),
    ("groups nested 100 deep in the body", body(groups(100))),
    ("groups nested 99 deep in an entry", md(entry(groups(99)))),
    ("invalid UTF-8 in type", md(ld(3, b"\xff"))),
    ("invalid UTF-8 in clientIp", md(ld(8, b"a\xc0\x80"))),
    ("invalid UTF-8 in a header name", md(entry(ld(1, b"\xed\xa0\x80")))),
    ("invalid UTF-8 in a header value", md(entry(ld(2, b"\xf4\x90\x80\x80")))),
    ("invalid UTF-8 in Any.type_url", body(ld(1, b"\x80"))),
    ("truncated UTF-8 in type", md(ld(3, "é".encode()[:1]))),
    ("a valid string, then an invalid one for the same field", md(ld(3, b"ok"), ld(3, b"\xff"))),
    *WRONG_WIRE_TYPES,
]


@pytest.mark.parametrize("data", [case[1] for case in REJECTED], ids=[case[0] for case in REJECTED])
def test_decode_rejects(payload: ModuleType, data: bytes) -> None:
    with pytest.raises(PayloadDecodeError):
        payload.decode(data)


def test_decode_rejects_every_truncation_of_a_message(payload: ModuleType) -> None:
    # Each proper prefix that ends inside a field (a tag, a length or a value) is malformed.
    ends = {0}
    pos = 0
    while pos < len(GOLDEN):
        length = GOLDEN[pos + 1]
        pos += 2 + length
        ends.add(pos)
    for cut in range(len(GOLDEN)):
        if cut in ends:
            continue
        with pytest.raises(PayloadDecodeError):
            payload.decode(GOLDEN[:cut])


# -- property tests -----------------------------------------------------------------------------

HYPOTHESIS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _modules() -> list[ModuleType]:
    names = ["shoal.kernels.payload_py"] + ([] if NO_EXTENSIONS else ["shoal._ext.payload"])
    return [importlib.import_module(name) for name in names]


def compiled_only(test: Any) -> Any:
    """Mark a differential test: it compares the compiled kernel with the twin."""
    test = pytest.mark.skipif(NO_EXTENSIONS, reason="compiled kernels disabled by SHOAL_NO_EXTENSIONS")(test)
    return pytest.mark.c_extension(test)


astral = st.characters(min_codepoint=0x10000)
texts = st.one_of(st.text(max_size=20), st.text(astral, max_size=5), st.sampled_from(["", "InstanceRequest"]))
values = st.tuples(
    texts,
    st.dictionaries(texts, texts, max_size=6),
    texts,
    st.one_of(st.binary(max_size=300), st.builds(lambda n: b"j" * n, st.integers(0, 40_000))),
)


@HYPOTHESIS
@given(value=values)
def test_round_trip_matches_protobuf(value: tuple[str, dict[str, str], str, bytes]) -> None:
    type_, headers, client_ip, data = value
    reference = Payload(metadata=Metadata(type=type_, clientIp=client_ip, headers=headers), body={"value": data})
    encodings = set()
    for module in _modules():
        encoded = module.encode(type_, data, headers, client_ip)
        encodings.add(encoded)
        same(module.decode(encoded), value)
        assert proto_values(encoded) == value
        assert module.decode(reference.SerializeToString()) == value
        if len(headers) <= 1:
            assert encoded == reference.SerializeToString()
    assert len(encodings) == 1


hashable = st.one_of(st.none(), st.integers(), st.binary(max_size=3), texts, st.just("\udc80"))
anything = st.one_of(hashable, st.just([("k", "v")]))


@compiled_only
@HYPOTHESIS
@given(
    args=st.tuples(
        st.one_of(texts, anything),
        st.one_of(st.binary(max_size=5), st.builds(bytearray, st.binary(max_size=5)), anything),
        st.one_of(
            st.none(), st.dictionaries(st.one_of(texts, hashable), st.one_of(texts, anything), max_size=3), anything
        ),
        st.one_of(texts, anything),
    )
)
def test_encode_agrees_on_any_arguments(args: tuple[Any, Any, Any, Any]) -> None:
    py, ext = _modules()
    try:
        expected = py.encode(*args)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            ext.encode(*args)
    else:
        assert ext.encode(*args) == expected


# Random protobuf-shaped bytes: fields of random numbers (the known ones made common) and wire
# types, nested messages and groups, text and garbage, to which mutations are then applied.
field_numbers = st.one_of(st.sampled_from([0, 1, 2, 3, 7, 8]), st.integers(0, 40), st.integers(0, 2**29 - 1))


def _field(number: int, wire_type: int, content: bytes) -> bytes:
    if wire_type == VARINT:
        return tag(number, VARINT) + content
    if wire_type == LEN:
        return ld(number, content)
    if wire_type == SGROUP:
        return tag(number, SGROUP) + content + tag(number, EGROUP)
    return tag(number, wire_type) + content


leaf = st.one_of(
    st.builds(lambda n, v: _field(n, VARINT, uv(v)), field_numbers, st.integers(0, 2**64 - 1)),
    st.builds(lambda n, b: _field(n, I64, b), field_numbers, st.binary(min_size=8, max_size=8)),
    st.builds(lambda n, b: _field(n, I32, b), field_numbers, st.binary(min_size=4, max_size=4)),
    st.builds(lambda n, t: _field(n, LEN, t.encode()), field_numbers, st.text(max_size=8)),
    st.builds(lambda n, b: _field(n, LEN, b), field_numbers, st.binary(max_size=8)),
    st.builds(lambda n, w: tag(n, w), field_numbers, st.integers(0, 7)),
)
wire = st.recursive(
    st.lists(leaf, max_size=4).map(b"".join),
    lambda inner: st.lists(
        st.one_of(
            leaf,
            st.builds(lambda n, b: _field(n, LEN, b), field_numbers, inner),
            st.builds(lambda n, b: _field(n, SGROUP, b), field_numbers, inner),
        ),
        max_size=4,
    ).map(b"".join),
    max_leaves=30,
)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        at = draw(st.integers(0, len(data)))
        if op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif data and at < len(data):
            if op == "flip":
                data[at] = draw(st.integers(0, 255))
            elif op == "delete":
                del data[at]
            else:
                del data[at:]
    return bytes(data)


def _outcome(module: ModuleType, data: bytes) -> Any:
    try:
        return module.decode(data)
    except PayloadDecodeError:
        return PayloadDecodeError


def _check_agree(data: bytes) -> None:
    py, *compiled = _modules()
    expected = _outcome(py, data)
    for module in compiled:
        result = _outcome(module, data)
        if expected is PayloadDecodeError:
            assert result is PayloadDecodeError
        else:
            same(result, expected)


@compiled_only
@HYPOTHESIS
@given(data=mutated(wire))
def test_decode_agrees_on_protobuf_shaped_bytes(data: bytes) -> None:
    _check_agree(data)


well_formed = st.builds(
    lambda value, extra: (
        extra
        + Payload(
            metadata=Metadata(type=value[0], headers=value[1], clientIp=value[2]), body={"value": value[3][:500]}
        ).SerializeToString()
    ),
    values,
    wire,
)


@compiled_only
@HYPOTHESIS
@given(data=mutated(well_formed))
def test_decode_agrees_on_damaged_requests(data: bytes) -> None:
    _check_agree(data)


@compiled_only
@HYPOTHESIS
@given(data=st.binary(max_size=64))
def test_decode_agrees_on_garbage(data: bytes) -> None:
    _check_agree(data)
