"""ownership kernel: Java String.hashCode, Nacos distro hash, owner and moved-key batches."""

from __future__ import annotations

import random
from types import ModuleType

import pytest


def oracle_java_hash(s: str) -> int:
    """Independent reference: hash the UTF-16 code units Python's codec produces."""
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i : i + 2], "big")) % 2**32
    return h - 2**32 if h >= 2**31 else h


def oracle_distro(s: str) -> int:
    return abs(oracle_java_hash(s)) % 2147483647


KNOWN = [
    ("", 0),
    ("a", 97),
    ("abc", 96354),
    ("Aa", 2112),
    ("BB", 2112),
    ("hello", 99162322),
    ("polygenelubricants", -2147483648),
    # U+1F600 is the surrogate pair D83D DE00 in Java: 0xD83D * 31 + 0xDE00.
    ("\U0001f600", 0xD83D * 31 + 0xDE00),
]

SAMPLES = [
    "é",  # latin-1, non-ASCII (1-byte kind)
    "DEFAULT_GROUP@@nacos.test.service",
    "日本語のサービス",  # BMP (2-byte kind)
    "\U0001f600",  # astral only (4-byte kind)
    "a\U0001f600b日\U00010000",  # mixed 4-byte kind with BMP and ASCII characters
    "\U0010ffff",  # highest code point: DBFF DFFF
    "\ud800",  # lone surrogate: one UTF-16 unit, as in Java
    "x\udfffy",
    "10.0.0.1:8848#true" * 40,  # long: many wrap-arounds
]


@pytest.mark.parametrize(("text", "expected"), KNOWN, ids=[repr(t) for t, _ in KNOWN])
def test_java_hash_known_values(ownership: ModuleType, text: str, expected: int) -> None:
    assert ownership.java_hash(text) == expected


@pytest.mark.parametrize("text", SAMPLES, ids=range(len(SAMPLES)))
def test_java_hash_matches_utf16_reference(ownership: ModuleType, text: str) -> None:
    assert ownership.java_hash(text) == oracle_java_hash(text)
    assert ownership.distro_hash(text) == oracle_distro(text)


def test_java_hash_is_signed_32_bit(ownership: ModuleType) -> None:
    values = [ownership.java_hash(f"service-{i}-\U0001f600-group") for i in range(2000)]
    assert all(-(2**31) <= v < 2**31 for v in values)
    assert any(v < 0 for v in values) and any(v > 0 for v in values)


def test_distro_hash_of_int_min_is_one(ownership: ModuleType) -> None:
    assert ownership.distro_hash("polygenelubricants") == 1


def test_distro_hash_of_negative_hash(ownership: ModuleType) -> None:
    key = next(k for k in (f"client-key-{i}" for i in range(10_000)) if oracle_java_hash(k) < 0)
    assert ownership.distro_hash(key) == -oracle_java_hash(key) % 2147483647
    assert ownership.distro_hash("hello") == 99162322


@pytest.mark.parametrize("bad", [b"abc", 5, None])
def test_hashes_reject_non_str(ownership: ModuleType, bad: object) -> None:
    with pytest.raises(TypeError):
        ownership.java_hash(bad)
    with pytest.raises(TypeError):
        ownership.distro_hash(bad)
    with pytest.raises(TypeError):
        ownership.owner_indices(["ok", bad], 3)


def test_owner_indices_empty_and_single_member(ownership: ModuleType) -> None:
    assert ownership.owner_indices([], 3) == []
    assert ownership.owner_indices(SAMPLES, 1) == [0] * len(SAMPLES)


def test_owner_indices_match_reference(ownership: ModuleType) -> None:
    keys = [*SAMPLES, *(s for s, _ in KNOWN)]
    for n in (2, 3, 7, 100):
        assert ownership.owner_indices(keys, n) == [oracle_distro(k) % n for k in keys]
    assert ownership.owner_indices(tuple(keys), 3) == [oracle_distro(k) % 3 for k in keys]


def test_owner_indices_large_member_count(ownership: ModuleType) -> None:
    keys = ["hello", "polygenelubricants", "\U0001f600"]
    expected = [oracle_distro(k) for k in keys]
    assert ownership.owner_indices(keys, 2**31 - 1) == [h % (2**31 - 1) for h in expected]
    assert ownership.owner_indices(keys, 2**31) == expected
    assert ownership.owner_indices(keys, 2**70) == expected


@pytest.mark.parametrize("n", [0, -1, -(2**70)])
def test_owner_indices_rejects_non_positive_members(ownership: ModuleType, n: int) -> None:
    with pytest.raises(ValueError):
        ownership.owner_indices(["a"], n)


def test_owner_indices_rejects_non_int_members(ownership: ModuleType) -> None:
    with pytest.raises(TypeError):
        ownership.owner_indices(["a"], 3.0)


def test_owner_indices_huge_batch(ownership: ModuleType) -> None:
    rnd = random.Random(3)
    keys = [f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(256)}:{i}" for i in range(200_000)]
    got = ownership.owner_indices(keys, 7)
    assert len(got) == len(keys)
    for i in range(0, len(keys), 997):
        assert got[i] == oracle_distro(keys[i]) % 7
    assert set(got) == set(range(7))


MEMBERS = [f"10.0.0.{i}:8848" for i in range(1, 6)]


def reference_moved(keys: list[str], old: list[str], new: list[str]) -> list[int]:
    return [i for i, k in enumerate(keys) if old[oracle_distro(k) % len(old)] != new[oracle_distro(k) % len(new)]]


def test_moved_keys_same_members_moves_nothing(ownership: ModuleType) -> None:
    keys = [f"client-{i}" for i in range(500)]
    assert ownership.moved_keys(keys, MEMBERS[:3], list(MEMBERS[:3])) == []


def test_moved_keys_scale_out(ownership: ModuleType) -> None:
    keys = [f"client-{i}" for i in range(2000)]
    expected = reference_moved(keys, MEMBERS[:3], MEMBERS[:4])
    assert 0 < len(expected) < len(keys)
    assert ownership.moved_keys(keys, MEMBERS[:3], MEMBERS[:4]) == expected


def test_moved_keys_compares_addresses_not_positions(ownership: ModuleType) -> None:
    keys = [f"client-{i}" for i in range(300)]
    # Same size, one address replaced: only keys owned by that slot move.
    new = [MEMBERS[0], MEMBERS[4], MEMBERS[2]]
    got = ownership.moved_keys(keys, MEMBERS[:3], new)
    assert got == [i for i, k in enumerate(keys) if oracle_distro(k) % 3 == 1]
    # Lists are used in the order given: a permutation moves keys.
    assert ownership.moved_keys(keys, MEMBERS[:3], MEMBERS[2::-1]) == reference_moved(keys, MEMBERS[:3], MEMBERS[2::-1])
    # Duplicated addresses are fine: owners compare by address.
    dup = [MEMBERS[0], MEMBERS[0]]
    assert ownership.moved_keys(keys, dup, [MEMBERS[0]]) == []


def test_moved_keys_empty_member_lists(ownership: ModuleType) -> None:
    keys = ["a", "b", "c"]
    assert ownership.moved_keys(keys, [], []) == []
    assert ownership.moved_keys(keys, [], MEMBERS[:2]) == [0, 1, 2]
    assert ownership.moved_keys(keys, MEMBERS[:2], []) == [0, 1, 2]
    assert ownership.moved_keys([], MEMBERS[:2], MEMBERS[:3]) == []


def test_moved_keys_type_checks(ownership: ModuleType) -> None:
    with pytest.raises(TypeError):
        ownership.moved_keys(["a", 1], MEMBERS[:2], MEMBERS[:3])
    with pytest.raises(TypeError):
        ownership.moved_keys(["a", 1], [], MEMBERS[:3])
    with pytest.raises(TypeError):
        ownership.moved_keys(["a"], [b"10.0.0.1:8848"], MEMBERS[:3])


def test_moved_keys_huge_batch(ownership: ModuleType) -> None:
    keys = [f"{i}_127.0.0.1_{i % 65536}" for i in range(200_000)]
    old, new = MEMBERS[:3], MEMBERS[:4]
    got = ownership.moved_keys(keys, old, new)
    assert got == sorted(set(got))
    # A key stays only when h % 3 == h % 4, i.e. h % 12 in {0, 1, 2}: about a quarter stay.
    assert 0.70 < len(got) / len(keys) < 0.80
    sample = range(0, len(keys), 1009)
    moved = set(got)
    assert [i for i in sample if i in moved] == [
        i for i in sample if old[oracle_distro(keys[i]) % 3] != new[oracle_distro(keys[i]) % 4]
    ]
