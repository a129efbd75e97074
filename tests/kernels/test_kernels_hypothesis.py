"""Property tests: every compiled kernel agrees with its pure-Python twin (the spec) on random input.

Skipped as a whole when SHOAL_NO_EXTENSIONS is set (there is nothing to compare against).
"""

from __future__ import annotations

import importlib
from array import array
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.kernels import NO_EXTENSIONS
from shoal.kernels.syncser_layout import SyncDecodeError

pytestmark = [
    pytest.mark.c_extension,
    pytest.mark.skipif(NO_EXTENSIONS, reason="compiled kernels disabled by SHOAL_NO_EXTENSIONS"),
]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def both(name: str) -> tuple[ModuleType, ModuleType]:
    return importlib.import_module(f"shoal.kernels.{name}_py"), importlib.import_module(f"shoal._ext.{name}")


def same_outcome(py_call: Callable[[], Any], ext_call: Callable[[], Any]) -> Any:
    """Both return equal values, or both raise the same exception class; returns the value."""
    try:
        expected = py_call()
    except Exception as exc:  # the twin's exception is the spec
        with pytest.raises(type(exc)) as info:
            ext_call()
        assert type(info.value) is type(exc)
        return None
    assert ext_call() == expected
    return expected


# Text with every kind of code point (Hypothesis excludes lone surrogates by default), with
# astral characters made common.
astral = st.characters(min_codepoint=0x10000)
texts = st.one_of(st.text(), st.text(astral), st.text(st.one_of(astral, st.characters(max_codepoint=0x7F))))
int64 = st.integers(INT64_MIN, INT64_MAX)
near = st.integers(-3, 60)

# -- expiry -------------------------------------------------------------------------------------


@SETTINGS
@given(
    stamps=st.lists(st.one_of(near, int64), max_size=300),
    now=st.one_of(near, int64, st.integers(-(2**70), 2**70)),
    idle=st.one_of(near, int64, st.integers(-(2**70), 2**70)),
)
def test_idle_slots_agree(stamps: list[int], now: int, idle: int) -> None:
    py, ext = both("expiry")
    buf = array("q", stamps)
    same_outcome(lambda: py.idle_slots(buf, now, idle), lambda: ext.idle_slots(buf, now, idle))


slot = st.tuples(st.one_of(near, int64), st.one_of(near, int64), st.one_of(near, int64), st.integers(0, 255))


@SETTINGS
@given(slots=st.lists(slot, max_size=300), now=st.one_of(near, int64, st.integers(2**63, 2**64)))
def test_beat_deadlines_agree(slots: list[tuple[int, int, int, int]], now: int) -> None:
    py, ext = both("expiry")
    columns = [array("q", [s[i] for s in slots]) for i in range(3)] + [array("B", [s[3] for s in slots])]
    same_outcome(lambda: py.beat_deadlines(*columns, now), lambda: ext.beat_deadlines(*columns, now))


@SETTINGS
@given(lengths=st.lists(st.integers(0, 4), min_size=4, max_size=4), now=near)
def test_beat_deadlines_length_checks_agree(lengths: list[int], now: int) -> None:
    py, ext = both("expiry")
    columns = [array("q", [0] * n) for n in lengths[:3]] + [array("B", [1] * lengths[3])]
    same_outcome(lambda: py.beat_deadlines(*columns, now), lambda: ext.beat_deadlines(*columns, now))


# -- ownership ----------------------------------------------------------------------------------


@SETTINGS
@given(text=texts)
def test_hashes_agree(text: str) -> None:
    py, ext = both("ownership")
    assert ext.java_hash(text) == py.java_hash(text)
    assert ext.distro_hash(text) == py.distro_hash(text)


@SETTINGS
@given(
    keys=st.lists(texts, max_size=50),
    n_members=st.one_of(st.integers(1, 200), st.integers(-5, 2**70)),
)
def test_owner_indices_agree(keys: list[str], n_members: int) -> None:
    py, ext = both("ownership")
    same_outcome(lambda: py.owner_indices(keys, n_members), lambda: ext.owner_indices(keys, n_members))


addresses = st.sampled_from([f"10.0.0.{i}:8848" for i in range(8)])


@SETTINGS
@given(
    keys=st.lists(texts, max_size=50),
    old=st.lists(addresses, max_size=6),
    new=st.lists(addresses, max_size=6),
)
def test_moved_keys_agree(keys: list[str], old: list[str], new: list[str]) -> None:
    py, ext = both("ownership")
    same_outcome(lambda: py.moved_keys(keys, old, new), lambda: ext.moved_keys(keys, old, new))


# -- verify -------------------------------------------------------------------------------------


@SETTINGS
@given(ids=st.lists(texts, max_size=50), n_buckets=st.one_of(st.integers(1, 64), st.integers(-2, 2**70)))
def test_bucket_of_agrees(ids: list[str], n_buckets: int) -> None:
    py, ext = both("verify")
    same_outcome(lambda: py.bucket_of(ids, n_buckets), lambda: ext.bucket_of(ids, n_buckets))


@SETTINGS
@given(
    pairs=st.lists(st.tuples(texts, st.integers(0, 2**63 - 1)), max_size=50),
    n_buckets=st.integers(1, 64),
)
def test_bucket_digests_agree(pairs: list[tuple[str, int]], n_buckets: int) -> None:
    py, ext = both("verify")
    ids = [p[0] for p in pairs]
    revisions = [p[1] for p in pairs]
    expected = py.bucket_digests(ids, revisions, n_buckets)
    assert ext.bucket_digests(ids, revisions, n_buckets) == expected
    assert ext.bucket_digests(ids[::-1], revisions[::-1], n_buckets) == expected


@SETTINGS
@given(
    ids=st.lists(texts, max_size=10),
    revisions=st.lists(st.integers(-(2**64), 2**64), max_size=10),
    n_buckets=st.integers(-1, 8),
)
def test_bucket_digest_errors_agree(ids: list[str], revisions: list[int], n_buckets: int) -> None:
    py, ext = both("verify")
    same_outcome(
        lambda: py.bucket_digests(ids, revisions, n_buckets),
        lambda: ext.bucket_digests(ids, revisions, n_buckets),
    )


@SETTINGS
@given(z=st.integers(-(2**70), 2**70), text=texts)
def test_mixers_agree(z: int, text: str) -> None:
    py, ext = both("verify")
    assert ext.splitmix64(z) == py.splitmix64(z)
    assert ext.fnv1a64(text) == py.fnv1a64(text)


u64 = st.integers(0, 2**64 - 1)
u64_lists = st.lists(st.one_of(u64, st.sampled_from([0, 1, 2**63, 2**64 - 1])), max_size=40)


@SETTINGS
@given(a=u64_lists, b=u64_lists, typed=st.booleans())
def test_diff_sorted_agrees(a: list[int], b: list[int], typed: bool) -> None:
    py, ext = both("verify")
    a.sort()
    b.sort()
    args: tuple[Any, Any] = (array("Q", a), array("Q", b)) if typed else (a, b)
    only_a, only_b = same_outcome(lambda: py.diff_sorted(*args), lambda: ext.diff_sorted(*args))
    assert len(a) - len(only_a) == len(b) - len(only_b)  # what pairs off is the same on both sides


@SETTINGS
@given(a=st.lists(st.integers(-(2**65), 2**65), max_size=8), b=st.lists(st.integers(-(2**65), 2**65), max_size=8))
def test_diff_sorted_errors_agree(a: list[int], b: list[int]) -> None:
    py, ext = both("verify")
    same_outcome(lambda: py.diff_sorted(a, b), lambda: ext.diff_sorted(a, b))


@SETTINGS
@given(values=st.lists(st.integers(-(2**65), 2**65), max_size=20), salt=st.integers(-(2**70), 2**70))
def test_salted32_agrees(values: list[int], salt: int) -> None:
    py, ext = both("verify")
    same_outcome(lambda: py.salted32(values, salt), lambda: ext.salted32(values, salt))


@SETTINGS
@given(
    pairs=st.lists(st.tuples(st.integers(-1, 2**64), st.integers(-1, 2**64)), max_size=20),
    n_buckets=st.integers(0, 5000),
    k=st.integers(0, 300),
    salt=st.integers(-(2**70), 2**70),
    typed=st.booleans(),
)
def test_sub_keys_agree(pairs: list[tuple[int, int]], n_buckets: int, k: int, salt: int, typed: bool) -> None:
    py, ext = both("verify")
    fnvs: Any = [p[0] for p in pairs]
    terms: Any = [p[1] for p in pairs]
    if typed and all(0 <= v < 2**64 for v in fnvs + terms):
        fnvs, terms = array("Q", fnvs), array("Q", terms)
    same_outcome(lambda: py.sub_keys(fnvs, terms, n_buckets, k, salt),
                 lambda: ext.sub_keys(fnvs, terms, n_buckets, k, salt))


# -- syncser ------------------------------------------------------------------------------------

short_text = st.text(max_size=10) | st.text(astral, max_size=3) | st.sampled_from(["", "DEFAULT", "public"])


def records(weights: st.SearchStrategy[float]) -> st.SearchStrategy[list[Any]]:
    instance = st.tuples(
        short_text,
        st.integers(0, 65535),
        weights,
        st.booleans(),
        st.booleans(),
        short_text,
        short_text,
        st.dictionaries(short_text, short_text, max_size=3),
        int64,
    )
    service = st.tuples(short_text, short_text, short_text, st.booleans(), st.lists(instance, max_size=3))
    client = st.tuples(st.integers(0, 255), short_text, st.integers(0, 2**63 - 1), st.lists(service, max_size=3))
    return st.lists(client, max_size=4)


@SETTINGS
@given(batch=records(st.floats(allow_nan=False)))
def test_encode_decode_agree(batch: list[Any]) -> None:
    py, ext = both("syncser")
    data = py.encode_batch(batch)
    assert ext.encode_batch(batch) == data
    assert py.decode_batch(data) == batch
    assert ext.decode_batch(data) == batch


@SETTINGS
@given(batch=records(st.floats()))
def test_encoding_is_canonical_even_with_nan(batch: list[Any]) -> None:
    py, ext = both("syncser")
    data = ext.encode_batch(batch)
    assert py.encode_batch(batch) == data
    assert py.encode_batch(ext.decode_batch(data)) == data
    assert ext.encode_batch(py.decode_batch(data)) == data


def decode_or_none(module: ModuleType, data: bytes) -> Any:
    """The decoded batch, or None on SyncDecodeError; any other exception fails the test."""
    try:
        return module.decode_batch(data)
    except SyncDecodeError:
        return None


def split_decode_or_none(module: ModuleType, data: bytes) -> Any:
    """split_batch, then each service decoded in a batch of its own (as Distro's receiver does),
    or None on SyncDecodeError."""
    head = b"SHSY\x01\x01\x00\x00\x00\x01"  # one record ("" id, revision 0) of one service
    try:
        return [(op, cid, rev, [module.decode_batch(head + service)[0][3][0] for service in services])
                for op, cid, rev, services in module.split_batch(data)]
    except SyncDecodeError:
        return None


def assert_decoders_agree(data: bytes) -> None:
    py, ext = both("syncser")
    from_py = decode_or_none(py, data)
    from_ext = decode_or_none(ext, data)
    assert (from_py is None) == (from_ext is None)
    if from_py is not None:
        # Compare through the canonical re-encoding (robust to NaN weights).
        assert py.encode_batch(from_py) == data
        assert ext.encode_batch(from_ext) == data
    # Splitting, then decoding each service, accepts exactly the same bytes, into the same records.
    for module in (py, ext):
        split = split_decode_or_none(module, data)
        assert (split is None) == (from_py is None)
        if split is not None:
            assert py.encode_batch(split) == data
    split_py = same_outcome(lambda: py.split_batch(data), lambda: ext.split_batch(data))
    if split_py is not None:
        assert all(type(service) is bytes for *_, services in split_py for service in services)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200) | st.binary(max_size=200).map(lambda b: b"SHSY\x01" + b))
def test_random_bytes_fail_alike(data: bytes) -> None:
    assert_decoders_agree(data)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(records(st.floats()).map(lambda b: both("syncser")[0].encode_batch(b))))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "set"]))
        at = draw(st.integers(0, len(data)))
        if kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data.insert(at, draw(st.integers(0, 255)))
        elif at < len(data):
            if kind == "flip":
                data[at] ^= 1 << draw(st.integers(0, 7))
            elif kind == "delete":
                del data[at]
            else:
                data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated())
def test_mutated_encodings_fail_alike(data: bytes) -> None:
    assert_decoders_agree(data)


@SETTINGS
@given(batch=records(st.floats(allow_nan=False)), cut=st.integers(0, 10**6))
def test_truncations_always_fail(batch: list[Any], cut: int) -> None:
    py, ext = both("syncser")
    data = py.encode_batch(batch)
    prefix = data[: cut % len(data)]
    for module in (py, ext):
        with pytest.raises(SyncDecodeError):
            module.decode_batch(prefix)


def paths(node: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position in a record tree (tuple/list items and whole metadata dicts)."""
    out = [prefix]
    if isinstance(node, (tuple, list)):
        for i, child in enumerate(node):
            out.extend(paths(child, (*prefix, i)))
    return out


def replace(node: Any, path: tuple[int, ...], value: object) -> Any:
    if not path:
        return value
    items = list(node)
    items[path[0]] = replace(items[path[0]], path[1:], value)
    return tuple(items) if isinstance(node, tuple) else items


wrong_values = st.sampled_from(
    [None, 0, -1, 256, 65536, 2**63, -(2**63) - 1, 10**400, 1.5, True, "s", "\ud800", b"b", [], (), {}, {1: 2}]
)


@SETTINGS
@given(batch=records(st.floats(allow_nan=False)), data=st.data())
def test_encode_errors_agree(batch: list[Any], data: st.DataObject) -> None:
    py, ext = both("syncser")
    path = data.draw(st.sampled_from(paths(batch)))
    broken = replace(batch, path, data.draw(wrong_values))
    try:
        expected = py.encode_batch(broken)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)) as info:
            ext.encode_batch(broken)
        assert type(info.value) is type(exc)
    else:
        assert ext.encode_batch(broken) == expected
