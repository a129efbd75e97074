"""verify kernel: FNV-1a client-id hash, bucket digests and revision diffs (Distro verify)."""

from __future__ import annotations

import random
from types import ModuleType

import pytest

M64 = 2**64


def oracle_fnv(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) % M64
    return h


def oracle_mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) % M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M64
    return z ^ (z >> 31)


def oracle_digests(ids: list[str], revisions: list[int], n: int) -> list[int]:
    out = [0] * n
    for cid, rev in zip(ids, revisions, strict=True):
        h = oracle_fnv(cid)
        out[h % n] = (out[h % n] + oracle_mix(h ^ (rev * 0x9E3779B97F4A7C15 % M64))) % M64
    return out


IDS = ["", "a", "foobar", "1700000000000_10.0.0.1_52011", "é", "日本", "\U0001f600", "ÿ\U0010ffff"]


# Published FNV-1a 64-bit test vectors.
@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0xCBF29CE484222325), ("a", 0xAF63DC4C8601EC8C), ("foobar", 0x85944171F73967E8)],
)
def test_fnv1a64_vectors(verify: ModuleType, text: str, expected: int) -> None:
    assert verify.fnv1a64(text) == expected


@pytest.mark.parametrize("text", IDS, ids=range(len(IDS)))
def test_fnv1a64_hashes_utf8_bytes(verify: ModuleType, text: str) -> None:
    assert verify.fnv1a64(text) == oracle_fnv(text)


def test_fnv1a64_rejects_lone_surrogates_and_non_str(verify: ModuleType) -> None:
    for bad in ("\ud800", "ab\udfff", "\U0001f600\ud83d"):
        with pytest.raises(UnicodeEncodeError):
            verify.fnv1a64(bad)
    with pytest.raises(TypeError):
        verify.fnv1a64(b"abc")


def test_splitmix64(verify: ModuleType) -> None:
    # First output of the reference SplitMix64 generator seeded with 0.
    assert verify.splitmix64(0) == 0xE220A8397B1DCDAF
    for z in (1, 2**63, M64 - 1, 0x0123456789ABCDEF):
        assert verify.splitmix64(z) == oracle_mix(z)
    assert verify.splitmix64(M64 + 5) == oracle_mix(5)


def test_bucket_of(verify: ModuleType) -> None:
    assert verify.bucket_of([], 4) == []
    assert verify.bucket_of(IDS, 1) == [0] * len(IDS)
    for n in (2, 16, 1000, 2**63 - 1, M64 - 1):
        assert verify.bucket_of(IDS, n) == [oracle_fnv(i) % n for i in IDS]
    # A modulus above every hash leaves the hash itself.
    assert verify.bucket_of(IDS, M64) == [oracle_fnv(i) for i in IDS]
    assert verify.bucket_of(tuple(IDS), 7) == [oracle_fnv(i) % 7 for i in IDS]


@pytest.mark.parametrize("n", [0, -1])
def test_bucket_counts_must_be_positive(verify: ModuleType, n: int) -> None:
    with pytest.raises(ValueError):
        verify.bucket_of(["a"], n)
    with pytest.raises(ValueError):
        verify.bucket_digests(["a"], [1], n)


def test_bucket_of_type_checks(verify: ModuleType) -> None:
    with pytest.raises(TypeError):
        verify.bucket_of(["a", None], 4)
    with pytest.raises(TypeError):
        verify.bucket_of(["a"], 4.0)
    with pytest.raises(UnicodeEncodeError):
        verify.bucket_of(["\udc80"], 4)


def test_bucket_digests_empty(verify: ModuleType) -> None:
    assert verify.bucket_digests([], [], 1) == [0]
    assert verify.bucket_digests([], [], 5) == [0] * 5


def test_bucket_digests_single_item_formula(verify: ModuleType) -> None:
    h = oracle_fnv("client-1")
    expected = oracle_mix(h ^ (42 * 0x9E3779B97F4A7C15 % M64))
    digests = verify.bucket_digests(["client-1"], [42], 8)
    assert digests[h % 8] == expected
    assert sum(digests) == expected


def test_bucket_digests_match_reference_and_wrap(verify: ModuleType) -> None:
    rnd = random.Random(4)
    ids = [f"{rnd.randrange(10**12)}_10.0.0.{i % 256}_{i}" for i in range(3000)] + IDS
    revisions = [rnd.choice((0, 1, 2**63 - 1, rnd.randrange(2**63))) for _ in ids]
    for n in (1, 3, 64):
        got = verify.bucket_digests(ids, revisions, n)
        assert got == oracle_digests(ids, revisions, n)
        assert all(0 <= d < M64 for d in got)
    # With one bucket, 3000 random 64-bit terms must have wrapped: the sum is taken mod 2**64.
    assert verify.bucket_digests(ids, revisions, 1)[0] != sum(
        oracle_mix(oracle_fnv(c) ^ (r * 0x9E3779B97F4A7C15 % M64)) for c, r in zip(ids, revisions, strict=True)
    )


def test_bucket_digests_order_independent(verify: ModuleType) -> None:
    pairs = [(f"client-{i}", i * 7919) for i in range(500)]
    shuffled = pairs[:]
    random.Random(5).shuffle(shuffled)
    a = verify.bucket_digests([p[0] for p in pairs], [p[1] for p in pairs], 16)
    b = verify.bucket_digests([p[0] for p in shuffled], [p[1] for p in shuffled], 16)
    assert a == b


def test_bucket_digests_accept_sized_iterables(verify: ModuleType) -> None:
    revisions = {f"client-{i}": i for i in range(50)}
    expected = oracle_digests(list(revisions), list(revisions.values()), 8)
    assert verify.bucket_digests(revisions.keys(), revisions.values(), 8) == expected
    assert verify.bucket_digests(tuple(revisions), tuple(revisions.values()), 8) == expected


def test_bucket_digests_detect_a_revision_change(verify: ModuleType) -> None:
    ids = [f"client-{i}" for i in range(100)]
    revs = list(range(100))
    before = verify.bucket_digests(ids, revs, 16)
    revs[37] += 1
    after = verify.bucket_digests(ids, revs, 16)
    changed = [i for i in range(16) if before[i] != after[i]]
    assert changed == [oracle_fnv("client-37") % 16]


@pytest.mark.parametrize("revision", [-1, 2**63, -(2**70)])
def test_bucket_digests_revision_range(verify: ModuleType, revision: int) -> None:
    with pytest.raises(ValueError):
        verify.bucket_digests(["a", "b"], [1, revision], 4)


def test_bucket_digests_argument_checks(verify: ModuleType) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        verify.bucket_digests(["a", "b"], [1], 4)
    with pytest.raises(TypeError):
        verify.bucket_digests(["a"], [1.0], 4)
    with pytest.raises(TypeError):
        verify.bucket_digests([7], [1], 4)


def test_bucket_digests_huge_batch(verify: ModuleType) -> None:
    ids = [f"{i}_10.1.{i // 256 % 256}.{i % 256}_{i % 65536}" for i in range(200_000)]
    revisions = list(range(200_000))
    digests = verify.bucket_digests(ids, revisions, 256)
    assert len(digests) == 256 and all(digests)
    per_bucket = verify.bucket_of(ids, 256)
    assert len(per_bucket) == len(ids) and set(per_bucket) == set(range(256))
    for i in range(0, len(ids), 4999):
        assert per_bucket[i] == oracle_fnv(ids[i]) % 256


# --- diff_sorted / salted32: the detail phase of verify ------------------------------------------
def oracle_diff_sorted(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    return sorted((ca - cb).elements()), sorted((cb - ca).elements())


def test_diff_sorted_is_the_multiset_difference(verify: ModuleType) -> None:
    from array import array

    rng = random.Random(11)
    for _ in range(50):
        a = sorted(rng.choice([0, 1, 2, M64 - 1, rng.getrandbits(64)]) for _ in range(rng.randrange(30)))
        b = sorted(rng.choice([0, 1, 2, M64 - 1, rng.getrandbits(64)]) for _ in range(rng.randrange(30)))
        expected = oracle_diff_sorted(a, b)
        assert verify.diff_sorted(a, b) == expected
        assert verify.diff_sorted(array("Q", a), array("Q", b)) == expected
        assert verify.diff_sorted(tuple(a), iter(b)) == expected


def test_diff_sorted_refuses_unsorted_out_of_range_and_non_int(verify: ModuleType) -> None:
    from array import array

    for bad in ([2, 1], [-1], [M64], array("Q", [5, 4])):
        with pytest.raises(ValueError):
            verify.diff_sorted(bad, [])
        with pytest.raises(ValueError):
            verify.diff_sorted([], bad)
    with pytest.raises(TypeError):
        verify.diff_sorted(["1"], [])
    assert verify.diff_sorted([], []) == ([], [])


def test_salted32_is_the_top_half_of_the_mixed_value(verify: ModuleType) -> None:
    values = [0, 1, 12345, M64 - 1]
    for salt in (0, 7, M64 - 1, -1, M64 + 7):
        assert verify.salted32(values, salt) == [oracle_mix(v ^ (salt % M64)) >> 32 for v in values]
    with pytest.raises(ValueError):
        verify.salted32([M64], 0)
    with pytest.raises(ValueError):
        verify.salted32([-1], 0)
    with pytest.raises(TypeError):
        verify.salted32([1.5], 0)


def test_sub_keys_pack_the_sub_bucket_over_the_salted_value(verify: ModuleType) -> None:
    from array import array

    rng = random.Random(5)
    fnvs = [rng.getrandbits(64) for _ in range(40)] + [0, M64 - 1]
    terms = [rng.getrandbits(64) for _ in range(42)]
    for n, k, salt in ((1, 1, 0), (4096, 16, 99), (7, 3, -5)):
        expected = [(((f % n) * k + (f // n) % k) << 32) | (oracle_mix(t ^ (salt % M64)) >> 32)
                    for f, t in zip(fnvs, terms, strict=True)]
        assert verify.sub_keys(fnvs, terms, n, k, salt) == expected
        assert verify.sub_keys(array("Q", fnvs), array("Q", terms), n, k, salt) == expected
    for bad in (([1], [1, 2], 1, 1), ([M64], [1], 1, 1), ([1], [-1], 1, 1), ([1], [1], 0, 1),
                ([1], [1], 1, 0), ([1], [1], 2**16, 2**16)):
        with pytest.raises(ValueError):
            verify.sub_keys(*bad, 0)
