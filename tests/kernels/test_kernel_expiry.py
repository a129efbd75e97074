"""expiry kernel: idle_slots (connection keep-alive) and beat_deadlines (ip:port heartbeats)."""

from __future__ import annotations

import ctypes
import random
from array import array
from types import ModuleType

import pytest

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def q(*values: int) -> array[int]:
    return array("q", values)


# -- idle_slots ---------------------------------------------------------------------------------


def test_idle_slots_empty(expiry: ModuleType) -> None:
    assert expiry.idle_slots(array("q"), 1000, 10) == []


def test_idle_slots_threshold_is_inclusive(expiry: ModuleType) -> None:
    now, idle = 10_000, 3_000
    stamps = q(now - idle - 1, now - idle, now - idle + 1, now, now + 5)
    assert expiry.idle_slots(stamps, now, idle) == [0, 1]


def test_idle_slots_skips_empty_slots_but_not_zero(expiry: ModuleType) -> None:
    stamps = q(-1, 0, INT64_MIN, 5, -7, 100)
    assert expiry.idle_slots(stamps, 100, 0) == [1, 3, 5]
    assert expiry.idle_slots(stamps, 100, 95) == [1, 3]


def test_idle_slots_ascending_for_unordered_stamps(expiry: ModuleType) -> None:
    stamps = q(50, 10, 90, 20, -1, 0)
    assert expiry.idle_slots(stamps, 100, 60) == [1, 3, 5]


def test_idle_slots_zero_and_negative_idle(expiry: ModuleType) -> None:
    stamps = q(99, 100, 101, 110, 111)
    assert expiry.idle_slots(stamps, 100, 0) == [0, 1]
    # A negative idle time reaches into the future: now - stamp >= -10  <=>  stamp <= 110.
    assert expiry.idle_slots(stamps, 100, -10) == [0, 1, 2, 3]


def test_idle_slots_threshold_below_zero_selects_nothing(expiry: ModuleType) -> None:
    assert expiry.idle_slots(q(0, 1, 5), 5, 10) == []


def test_idle_slots_extreme_values(expiry: ModuleType) -> None:
    stamps = q(0, INT64_MAX, -1)
    assert expiry.idle_slots(stamps, INT64_MAX, INT64_MAX) == [0]
    assert expiry.idle_slots(stamps, INT64_MAX, 0) == [0, 1]
    # Thresholds beyond int64 (Python ints) select every non-empty slot.
    assert expiry.idle_slots(stamps, 2**70, 0) == [0, 1]
    assert expiry.idle_slots(stamps, 0, -(2**70)) == [0, 1]


def test_idle_slots_accepts_other_int64_buffers(expiry: ModuleType) -> None:
    raw = memoryview(q(1, -1, 7).tobytes()).cast("q")
    assert expiry.idle_slots(raw, 10, 3) == [0, 2]
    if array("l").itemsize == 8:
        assert expiry.idle_slots(array("l", [1, -1, 7]), 10, 3) == [0, 2]


def test_idle_slots_accepts_prefixed_and_strided_buffers(expiry: ModuleType) -> None:
    stamps = (ctypes.c_int64 * 3)(1, -1, 7)  # memoryview format "<q"
    assert expiry.idle_slots(stamps, 10, 3) == [0, 2]
    strided = memoryview(q(1, 100, -1, 100, 7))[::2]
    assert expiry.idle_slots(strided, 10, 3) == [0, 2]
    flags = (ctypes.c_uint8 * 2)(1, 0)  # "<B"
    assert expiry.beat_deadlines(q(0, 0), q(1, 1), q(-1, -1), flags, 5) == ([0], [])


def test_idle_slots_rejects_foreign_byte_order(expiry: ModuleType) -> None:
    with pytest.raises(ValueError):
        expiry.idle_slots((ctypes.c_int64.__ctype_be__ * 2)(1, 2), 10, 1)


@pytest.mark.parametrize(
    ("stamps", "exc"),
    [
        (array("i", [1, 2]), ValueError),
        (array("Q", [1, 2]), ValueError),
        (b"\x00" * 16, ValueError),
        ([1, 2], TypeError),
    ],
    ids=["int32", "uint64", "bytes", "list"],
)
def test_idle_slots_rejects_wrong_buffers(expiry: ModuleType, stamps: object, exc: type) -> None:
    with pytest.raises(exc):
        expiry.idle_slots(stamps, 10, 1)


def test_idle_slots_rejects_non_int_times(expiry: ModuleType) -> None:
    with pytest.raises(TypeError):
        expiry.idle_slots(q(1), 10.5, 1)
    with pytest.raises(TypeError):
        expiry.idle_slots(q(1), 10, 1.0)


def test_idle_slots_huge_batch(expiry: ModuleType) -> None:
    rnd = random.Random(1)
    now, idle = 1_700_000_000_000, 20_000
    values = [rnd.choice((-1, now - rnd.randrange(40_000))) for _ in range(200_000)]
    expected = [i for i, v in enumerate(values) if v >= 0 and now - v >= idle]
    assert 30_000 < len(expected) < 70_000
    assert expiry.idle_slots(array("q", values), now, idle) == expected


# -- beat_deadlines -----------------------------------------------------------------------------


def beats(
    last: list[int], unhealthy: list[int], remove: list[int], healthy: list[int]
) -> tuple[array[int], array[int], array[int], array[int]]:
    return array("q", last), array("q", unhealthy), array("q", remove), array("B", healthy)


def test_beat_deadlines_empty(expiry: ModuleType) -> None:
    assert expiry.beat_deadlines(*beats([], [], [], []), 1000) == ([], [])


def test_beat_deadlines_strictly_greater(expiry: ModuleType) -> None:
    now = 100_000
    args = beats(
        [now - 15_000, now - 15_001, now - 30_000, now - 30_001],
        [15_000] * 4,
        [30_000] * 4,
        [1] * 4,
    )
    # slot 0: exactly at the unhealthy timeout (not past); slot 2: exactly at the removal timeout.
    assert expiry.beat_deadlines(*args, now) == ([1, 2], [3])


def test_beat_deadlines_removal_wins_over_unhealthy(expiry: ModuleType) -> None:
    args = beats([0, 0], [10, 10], [20, 50], [1, 1])
    assert expiry.beat_deadlines(*args, 30) == ([1], [0])


def test_beat_deadlines_negative_timeout_never_fires(expiry: ModuleType) -> None:
    args = beats([0, 0, 0], [-1, 5, -1], [-1, -1, 5], [1, 1, 1])
    assert expiry.beat_deadlines(*args, INT64_MAX) == ([1], [2])


def test_beat_deadlines_only_healthy_flag_one_turns_unhealthy(expiry: ModuleType) -> None:
    args = beats([0, 0, 0, 0], [5, 5, 5, 5], [-1, -1, -1, 8], [1, 0, 2, 0])
    # Removal does not depend on the healthy flag.
    assert expiry.beat_deadlines(*args, 10) == ([0], [3])


def test_beat_deadlines_skips_empty_slots(expiry: ModuleType) -> None:
    args = beats([-1, INT64_MIN, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1])
    assert expiry.beat_deadlines(*args, INT64_MAX) == ([], [2])


def test_beat_deadlines_zero_timeouts(expiry: ModuleType) -> None:
    args = beats([10, 9, 11], [0, 0, 0], [-1, -1, -1], [1, 1, 1])
    assert expiry.beat_deadlines(*args, 10) == ([1], [])


def test_beat_deadlines_negative_now_selects_nothing(expiry: ModuleType) -> None:
    args = beats([0, 5], [0, 0], [0, 0], [1, 1])
    assert expiry.beat_deadlines(*args, -1) == ([], [])
    assert expiry.beat_deadlines(*args, INT64_MIN) == ([], [])


def test_beat_deadlines_accepts_bytes_for_flags(expiry: ModuleType) -> None:
    last, unhealthy, remove, _ = beats([0, 0], [1, 1], [-1, -1], [0, 0])
    assert expiry.beat_deadlines(last, unhealthy, remove, b"\x01\x00", 5) == ([0], [])
    assert expiry.beat_deadlines(last, unhealthy, remove, bytearray(b"\x00\x01"), 5) == ([1], [])


@pytest.mark.parametrize("short", [1, 2, 3])
def test_beat_deadlines_rejects_length_mismatch(expiry: ModuleType, short: int) -> None:
    args = list(beats([0, 0], [1, 1], [2, 2], [1, 1]))
    args[short] = args[short][:1]
    with pytest.raises(ValueError, match="differ in length"):
        expiry.beat_deadlines(*args, 10)


def test_beat_deadlines_rejects_wrong_flag_buffer(expiry: ModuleType) -> None:
    last, unhealthy, remove, _ = beats([0], [1], [2], [1])
    with pytest.raises(ValueError):
        expiry.beat_deadlines(last, unhealthy, remove, array("b", [1]), 5)
    with pytest.raises(ValueError):
        expiry.beat_deadlines(last, unhealthy, remove, array("q", [1]), 5)


def test_beat_deadlines_now_must_be_int64(expiry: ModuleType) -> None:
    args = beats([0], [1], [2], [1])
    with pytest.raises(OverflowError):
        expiry.beat_deadlines(*args, 2**63)
    with pytest.raises(TypeError):
        expiry.beat_deadlines(*args, 5.0)


def test_beat_deadlines_huge_batch(expiry: ModuleType) -> None:
    rnd = random.Random(2)
    n, now = 200_000, 1_700_000_000_000
    last = [rnd.choice((-1, now - rnd.randrange(60_000))) for _ in range(n)]
    unhealthy = [rnd.choice((-1, 15_000)) for _ in range(n)]
    remove = [rnd.choice((-1, 30_000)) for _ in range(n)]
    healthy = [rnd.randrange(2) for _ in range(n)]
    to_remove = [i for i in range(n) if last[i] >= 0 and remove[i] >= 0 and now - last[i] > remove[i]]
    removed = set(to_remove)
    to_unhealthy = [
        i
        for i in range(n)
        if i not in removed and last[i] >= 0 and healthy[i] == 1 and unhealthy[i] >= 0 and now - last[i] > unhealthy[i]
    ]
    assert to_remove and to_unhealthy
    got = expiry.beat_deadlines(*beats(last, unhealthy, remove, healthy), now)
    assert got == (to_unhealthy, to_remove)
