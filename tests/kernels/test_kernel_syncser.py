"""syncser kernel: client sync batch encoding (bytes out) and decoding (bytes in)."""

from __future__ import annotations

import math
import re
from types import ModuleType
from typing import Any

import pytest

from shoal.kernels import NO_EXTENSIONS
from shoal.kernels.syncser_layout import SyncDecodeError


def uv(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def s(text: str) -> bytes:
    data = text.encode()
    return uv(len(data)) + data


HEADER = b"SHSY\x01"

INSTANCE = ("1.2.3.4", 8080, 1.5, True, False, "DEFAULT", "id", {"k": "v"}, -3)
SERVICE = ("public", "G", "svc", True, [INSTANCE])
RECORD = (3, "c1", 300, [SERVICE])

# The wire format of RECORD, written out by hand: it pins the format both implementations share.
GOLDEN = (
    b"SHSY\x01"  # magic, version
    b"\x01"  # one client
    b"\x03"  # op 3
    b"\x02c1"  # client id
    b"\xac\x02"  # revision 300 as a varint
    b"\x01"  # one service
    b"\x06public"  # namespace
    b"\x01G"  # group
    b"\x03svc"  # service
    b"\x01"  # is_batch
    b"\x01"  # one instance
    b"\x071.2.3.4"  # ip
    b"\x90\x1f"  # port 8080 (u16 little-endian)
    b"\x00\x00\x00\x00\x00\x00\xf8\x3f"  # weight 1.5 (binary64 little-endian)
    b"\x01"  # flags: healthy, not enabled
    b"\x07DEFAULT"  # cluster
    b"\x02id"  # instance id
    b"\x01"  # one metadata pair
    b"\x01k\x01v"  # "k" -> "v"
    b"\x05"  # last beat -3, zigzag-mapped
)


def test_golden_encoding(syncser: ModuleType) -> None:
    assert syncser.encode_batch([RECORD]) == GOLDEN
    assert syncser.decode_batch(GOLDEN) == [RECORD]


def test_empty_batch(syncser: ModuleType) -> None:
    assert syncser.encode_batch([]) == HEADER + b"\x00"
    assert syncser.encode_batch(()) == HEADER + b"\x00"
    assert syncser.decode_batch(HEADER + b"\x00") == []


EDGE_RECORDS: list[Any] = [
    (0, "", 0, []),
    (255, "x" * 300, 2**63 - 1, [("", "", "", False, [])]),
    (
        1,
        "ü\U0001f600\x00日",
        1,
        [
            (
                "ns\U0010ffff",
                "DEFAULT_GROUP",
                "s" * 200,
                False,
                [
                    ("::1", 0, 0.0, False, False, "", "", {}, 0),
                    ("h", 65535, -0.0, True, True, "c", "i", {"": "", "é": "\U0001f600"}, -(2**63)),
                    ("h", 1, math.inf, False, True, "c", "i", {"a" * 200: "b" * 5000}, 2**63 - 1),
                    ("h", 2, 5e-324, True, False, "c", "i", {"k": "v"}, -1),
                ],
            ),
            ("public", "G", "other", True, []),
        ],
    ),
]


def test_roundtrip_edge_values(syncser: ModuleType) -> None:
    data = syncser.encode_batch(EDGE_RECORDS)
    decoded = syncser.decode_batch(data)
    assert decoded == EDGE_RECORDS
    weights = [inst[2] for inst in decoded[2][3][0][4]]
    assert math.copysign(1.0, weights[1]) == -1.0  # -0.0 survives
    assert syncser.encode_batch(decoded) == data


def test_decoded_types(syncser: ModuleType) -> None:
    (record,) = syncser.decode_batch(GOLDEN)
    assert type(record) is tuple and type(record[3]) is list
    service = record[3][0]
    assert type(service) is tuple and type(service[3]) is bool and type(service[4]) is list
    instance = service[4][0]
    assert [type(v) for v in instance] == [str, int, float, bool, bool, str, str, dict, int]


def test_tuples_accepted_for_list_fields_and_ints_for_weight(syncser: ModuleType) -> None:
    as_tuples = ((3, "c1", 300, ((SERVICE[0], SERVICE[1], SERVICE[2], True, (INSTANCE,)),)),)
    assert syncser.encode_batch(as_tuples) == GOLDEN
    instance = ("1.2.3.4", 8080, 2, True, False, "DEFAULT", "id", {}, 0)
    (record,) = syncser.decode_batch(syncser.encode_batch([(0, "c", 0, [("n", "g", "s", False, [instance])])]))
    weight = record[3][0][4][0][2]
    assert weight == 2.0 and type(weight) is float


def test_decode_accepts_bytes_like(syncser: ModuleType) -> None:
    assert syncser.decode_batch(bytearray(GOLDEN)) == [RECORD]
    assert syncser.decode_batch(memoryview(GOLDEN)) == [RECORD]
    assert syncser.decode_batch(memoryview(b"xx" + GOLDEN)[2:]) == [RECORD]


def test_decode_rejects_non_bytes(syncser: ModuleType) -> None:
    with pytest.raises(TypeError):
        syncser.decode_batch("SHSY")
    with pytest.raises(TypeError):
        syncser.decode_batch(None)


def test_decode_error_is_the_twins_class(syncser: ModuleType) -> None:
    assert syncser.SyncDecodeError is SyncDecodeError
    assert issubclass(SyncDecodeError, ValueError)
    with pytest.raises(SyncDecodeError):
        syncser.decode_batch(b"nope")


@pytest.mark.skipif(NO_EXTENSIONS, reason="compiled kernels disabled by SHOAL_NO_EXTENSIONS")
def test_compiled_module_raises_the_twins_class() -> None:
    import shoal._ext.syncser as ext

    assert ext.SyncDecodeError is SyncDecodeError


def client(body: bytes, op: int = 0, cid: str = "c", revision: bytes = b"\x00") -> bytes:
    return bytes([op]) + s(cid) + revision + body


def one_instance(instance: bytes) -> bytes:
    return HEADER + b"\x01" + client(b"\x01" + s("n") + s("g") + s("s") + b"\x00" + b"\x01" + instance)


def instance_bytes(flags: bytes = b"\x01", meta: bytes = b"\x00", beat: bytes = b"\x00", ip: bytes = b"\x01h") -> bytes:
    return ip + b"\x50\x00" + b"\x00" * 6 + b"\xf0\x3f" + flags + s("c") + s("i") + meta + beat


VALID_INSTANCE = one_instance(instance_bytes())

MALFORMED: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "bad magic"),
    "short-magic": (b"SHS", "bad magic"),
    "magic-only": (b"SHSY", "bad magic"),
    "bad-magic": (b"SHSX\x01\x00", "bad magic"),
    "bad-version": (b"SHSY\x02\x00", "version 2"),
    "version-zero": (b"SHSY\x00\x00", "version 0"),
    "no-count": (HEADER, "truncated"),
    "trailing-byte": (HEADER + b"\x00\x00", "trailing"),
    "non-minimal-count": (HEADER + b"\x80\x00", "non-minimal"),
    "varint-11-bytes": (HEADER + b"\xff" * 10 + b"\x01", "exceeds 64 bits"),
    "varint-over-64-bits": (HEADER + b"\x80" * 9 + b"\x02", "exceeds 64 bits"),
    "absurd-client-count": (HEADER + uv(2**62) + b"\x00" * 64, "client count"),
    "max-client-count": (HEADER + uv(2**64 - 1) + b"\x00" * 64, "client count"),
    "count-one-too-many": (HEADER + b"\x02" + client(b"\x00") + b"\x00\x00\x00", "truncated"),
    "revision-2**63": (HEADER + b"\x01" + client(b"\x00", revision=uv(2**63)), "revision"),
    "bad-utf8": (HEADER + b"\x01" + b"\x00\x02\xff\xfe\x00\x00", "UTF-8"),
    "utf8-surrogate": (HEADER + b"\x01" + b"\x00\x03\xed\xa0\x80\x00\x00", "UTF-8"),
    "overlong-utf8": (HEADER + b"\x01" + b"\x00\x02\xc0\xaf\x00\x00", "UTF-8"),
    "string-past-end": (HEADER + b"\x01" + b"\x00\x09abc\x00\x00", "truncated"),
    "string-len-huge": (HEADER + b"\x01" + b"\x00" + uv(2**63) + b"abc", "truncated"),
    "absurd-service-count": (HEADER + b"\x01" + client(uv(2**40) + b"\x00" * 30), "service count"),
    "is-batch-2": (HEADER + b"\x01" + client(b"\x01" + s("n") + s("g") + s("s") + b"\x02\x00"), "is_batch"),
    "absurd-instance-count": (
        HEADER + b"\x01" + client(b"\x01" + s("n") + s("g") + s("s") + b"\x00\x05"),
        "instance count",
    ),
    "flags-bit-2": (one_instance(instance_bytes(flags=b"\x04")), "flag bits"),
    "flags-high-bit": (one_instance(instance_bytes(flags=b"\x81")), "flag bits"),
    "absurd-metadata-count": (one_instance(instance_bytes(meta=uv(10**6))), "metadata count"),
    "duplicate-metadata-key": (
        one_instance(instance_bytes(meta=b"\x02" + s("k") + s("a") + s("k") + s("b"))),
        "duplicate",
    ),
    "bad-utf8-metadata": (one_instance(instance_bytes(meta=b"\x01" + s("k") + b"\x01\x80")), "UTF-8"),
    "beat-non-minimal": (one_instance(instance_bytes(beat=b"\x81\x00")), "non-minimal"),
    "beat-over-64-bits": (one_instance(instance_bytes(beat=b"\xff" * 9 + b"\x03")), "exceeds 64 bits"),
    "instance-count-past-end": (
        HEADER + b"\x01" + client(b"\x01" + s("n") + s("g") + s("s") + b"\x00\x01" + b"\x01h\x50\x00\x00"),
        "instance count",
    ),
}


def test_helpers_build_valid_batches(syncser: ModuleType) -> None:
    # The malformed cases below are one change away from these.
    (record,) = syncser.decode_batch(VALID_INSTANCE)
    assert record[3][0][4][0][:5] == ("h", 80, 1.0, True, False)
    assert syncser.decode_batch(HEADER + b"\x01" + client(b"\x00", revision=uv(2**63 - 1))) == [(0, "c", 2**63 - 1, [])]
    meta = b"\x02" + s("k") + s("a") + s("j") + s("b")
    (record,) = syncser.decode_batch(one_instance(instance_bytes(meta=meta, beat=uv(2**64 - 1))))
    assert record[3][0][4][0][7:] == ({"k": "a", "j": "b"}, -(2**63))


@pytest.mark.parametrize(("data", "reason"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_decode_rejects_malformed(syncser: ModuleType, data: bytes, reason: str) -> None:
    with pytest.raises(SyncDecodeError, match=re.escape(reason)):
        syncser.decode_batch(data)


def test_every_truncation_and_extension_fails(syncser: ModuleType) -> None:
    data = syncser.encode_batch(EDGE_RECORDS)
    for end in range(len(data)):
        with pytest.raises(SyncDecodeError):
            syncser.decode_batch(data[:end])
    for extra in (b"\x00", b"\xff", GOLDEN):
        with pytest.raises(SyncDecodeError):
            syncser.decode_batch(data + extra)


def base_record() -> list[Any]:
    instance = list(INSTANCE)
    service = list(SERVICE)
    record = list(RECORD)
    return [record, service, instance]


def build(level: int, index: int, value: object) -> list[Any]:
    record, service, instance = base_record()
    [record, service, instance][level][index] = value
    service[4] = [tuple(instance)]
    record[3] = [tuple(service)]
    return [tuple(record)]


BAD_ENCODE: dict[str, tuple[object, type[Exception]]] = {
    "records-none": (None, TypeError),
    "records-generator": ((r for r in [RECORD]), TypeError),
    "records-dict": ({0: RECORD}, TypeError),
    "record-list": ([list(RECORD)], TypeError),
    "record-arity": ([RECORD[:3]], ValueError),
    "op-256": (build(0, 0, 256), ValueError),
    "op-negative": (build(0, 0, -1), ValueError),
    "op-str": (build(0, 0, "1"), TypeError),
    "client-id-bytes": (build(0, 1, b"c1"), TypeError),
    "client-id-surrogate": (build(0, 1, "c\ud800"), UnicodeEncodeError),
    "revision-negative": (build(0, 2, -1), ValueError),
    "revision-2**63": (build(0, 2, 2**63), ValueError),
    "revision-float": (build(0, 2, 1.0), TypeError),
    "services-none": ([(3, "c1", 300, None)], TypeError),
    "services-str": ([(3, "c1", 300, "svc")], TypeError),
    "service-list": ([(3, "c1", 300, [list(SERVICE)])], TypeError),
    "service-arity": ([(3, "c1", 300, [SERVICE[:4]])], ValueError),
    "namespace-none": (build(1, 0, None), TypeError),
    "is-batch-int": (build(1, 3, 1), TypeError),
    "instances-dict": ([(3, "c1", 300, [("n", "g", "s", False, {})])], TypeError),
    "instance-arity": ([(3, "c1", 300, [("n", "g", "s", False, [INSTANCE[:8]])])], ValueError),
    "ip-int": (build(2, 0, 1234), TypeError),
    "port-65536": (build(2, 1, 65536), ValueError),
    "port-negative": (build(2, 1, -1), ValueError),
    "port-str": (build(2, 1, "80"), TypeError),
    "weight-str": (build(2, 2, "1.0"), TypeError),
    "weight-none": (build(2, 2, None), TypeError),
    "weight-huge-int": (build(2, 2, 10**400), ValueError),
    "healthy-int": (build(2, 3, 1), TypeError),
    "enabled-none": (build(2, 4, None), TypeError),
    "cluster-int": (build(2, 5, 5), TypeError),
    "instance-id-surrogate": (build(2, 6, "\udcff"), UnicodeEncodeError),
    "metadata-list": (build(2, 7, [("k", "v")]), TypeError),
    "metadata-key-int": (build(2, 7, {1: "v"}), TypeError),
    "metadata-value-none": (build(2, 7, {"k": None}), TypeError),
    "last-beat-2**63": (build(2, 8, 2**63), ValueError),
    "last-beat-below-int64": (build(2, 8, -(2**63) - 1), ValueError),
    "last-beat-float": (build(2, 8, 1.5), TypeError),
}


@pytest.mark.parametrize(("records", "exc"), list(BAD_ENCODE.values()), ids=list(BAD_ENCODE))
def test_encode_rejects_wrong_input(syncser: ModuleType, records: object, exc: type[Exception]) -> None:
    with pytest.raises(exc) as info:
        syncser.encode_batch(records)
    assert type(info.value) is exc
    assert isinstance(info.value, (TypeError, ValueError))


def test_base_record_is_valid(syncser: ModuleType) -> None:
    assert syncser.encode_batch(build(0, 0, 3)) == GOLDEN


def test_huge_batch(syncser: ModuleType) -> None:
    records = [(i % 3, f"10.0.{i // 256 % 256}.{i % 256}:{i}#true", i, []) for i in range(200_000)]
    records[-1] = RECORD
    data = syncser.encode_batch(records)
    assert syncser.decode_batch(data) == records


def test_named_positions_address_the_decoded_fields(syncser: ModuleType) -> None:
    """The index constants documented next to the record aliases name the fields both
    implementations decode (distro code indexes records only through them)."""
    from shoal.kernels import syncser_layout as selector

    [record] = syncser.decode_batch(GOLDEN)
    service = record[selector.CLIENT_SERVICES][0]
    instance = service[selector.SERVICE_INSTANCES][0]
    assert (record[selector.CLIENT_OP], record[selector.CLIENT_ID], record[selector.CLIENT_REVISION]) == (3, "c1", 300)
    assert (service[selector.SERVICE_NAMESPACE], service[selector.SERVICE_GROUP], service[selector.SERVICE_NAME],
            service[selector.SERVICE_IS_BATCH]) == ("public", "G", "svc", True)
    fields = ("INSTANCE_IP", "INSTANCE_PORT", "INSTANCE_WEIGHT", "INSTANCE_HEALTHY", "INSTANCE_ENABLED",
              "INSTANCE_CLUSTER", "INSTANCE_ID", "INSTANCE_METADATA", "INSTANCE_LAST_BEAT")
    assert tuple(instance[getattr(selector, name)] for name in fields) == INSTANCE


# -- split_batch: services left as their bytes --------------------------------------------------

#: What split_batch leaves to decoding: the strings' UTF-8 and unique metadata keys inside a service.
LEFT_TO_DECODING = {"duplicate-metadata-key", "bad-utf8-metadata"}
ONE_SERVICE_HEAD = HEADER + b"\x01" + client(b"\x01")  # a batch of one record of one service, less the service


def decode_service(syncser: ModuleType, data: bytes) -> Any:
    (record,) = syncser.decode_batch(ONE_SERVICE_HEAD + data)
    (service,) = record[3]
    return service


def test_split_golden(syncser: ModuleType) -> None:
    ((op, cid, revision, services),) = syncser.split_batch(GOLDEN)
    assert (op, cid, revision) == (3, "c1", 300)
    assert services == [GOLDEN[GOLDEN.index(b"\x06public"):]]
    assert type(services[0]) is bytes
    assert decode_service(syncser, services[0]) == SERVICE


def test_split_then_decode_equals_decode(syncser: ModuleType) -> None:
    data = syncser.encode_batch(EDGE_RECORDS)
    split = syncser.split_batch(data)
    assert [(op, cid, rev, [decode_service(syncser, s) for s in services]) for op, cid, rev, services in split] \
        == syncser.decode_batch(data)
    assert syncser.split_batch(HEADER + b"\x00") == []
    assert syncser.split_batch(memoryview(b"xx" + GOLDEN)[2:]) == syncser.split_batch(GOLDEN)


@pytest.mark.parametrize(("data", "reason"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_split_rejects_what_decode_does_but_the_services_contents(syncser: ModuleType, data: bytes,
                                                                 reason: str) -> None:
    if data in (MALFORMED[name][0] for name in LEFT_TO_DECODING):
        ((_, _, _, (service,)),) = syncser.split_batch(data)
        with pytest.raises(SyncDecodeError, match=re.escape(reason)):
            decode_service(syncser, service)
    else:
        with pytest.raises(SyncDecodeError, match=re.escape(reason)):
            syncser.split_batch(data)


def test_split_every_truncation_and_extension_fails(syncser: ModuleType) -> None:
    data = syncser.encode_batch(EDGE_RECORDS)
    for end in range(len(data)):
        with pytest.raises(SyncDecodeError):
            syncser.split_batch(data[:end])
    for extra in (b"\x00", b"\xff", GOLDEN):
        with pytest.raises(SyncDecodeError):
            syncser.split_batch(data + extra)
    with pytest.raises(TypeError):
        syncser.split_batch("SHSY")
