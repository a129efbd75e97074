"""Progress output (terminal vs log) and the consistent-hash ring arithmetic."""

from __future__ import annotations

import io

import numpy as np
import pytest
from analytics_data import PyRing, ring_positions

from shoal.analytics.progress import Progress
from shoal.analytics.ring import Ring, join_position_map, leave_position_map, positions


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("export", 1000, unit="rows", stream=out) as p:
        for _ in range(20):
            p.update(50)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "[shoal] export: started"
    # one line per 10 % step (0 % is never reported after the start line), then the closing line
    assert [line.split()[2] for line in lines[1:-1]] == [f"{p}%" for p in range(10, 101, 10)]
    assert lines[-1].startswith("[shoal] export: done in ")


def test_progress_bar_on_a_terminal() -> None:
    out = FakeTTY()
    with Progress("simulate", 4, stream=out, interval=0.0) as p:
        p.update(1)
        p.set(3, detail="(2 stages)")
    text = out.getvalue()
    assert "\r\x1b[2Ksimulate [" in text and " 75% 3/4 (2 stages)" in text
    assert text.endswith("\n") and "simulate: done in" in text.splitlines()[-1]


def test_progress_reports_failure() -> None:
    out = io.StringIO()
    with pytest.raises(KeyError), Progress("job", None, stream=out):
        raise KeyError("x")
    assert out.getvalue().splitlines()[-1].startswith("[shoal] job: failed in")


def test_ring_matches_plain_bisect_lookup() -> None:
    members = [f"10.0.0.{i}:8848" for i in range(1, 8)]
    keys = [f"10.5.{i // 256}.{i % 256}:80" for i in range(3000)]
    ring = Ring(members, vnodes=40)
    got = ring.owners(positions(keys))
    ref = PyRing(members, 40)
    want = [members.index(ref.owner_of(p)) for p in ring_positions(keys)]
    assert got.tolist() == want
    # balance is plausible for a ring: every member owns something
    assert set(got.tolist()) == set(range(len(members)))


def test_membership_position_maps() -> None:
    members = ["b:1", "d:1", "a:1"]
    new, mapping = join_position_map(members, "c:1")
    assert new == ["a:1", "b:1", "c:1", "d:1"] and mapping.tolist() == [0, 1, -1, 2]
    new, mapping = leave_position_map(members, "b:1")
    assert new == ["a:1", "d:1"] and mapping.tolist() == [0, 2]
    with pytest.raises(ValueError):
        join_position_map(members, "a:1")
    with pytest.raises(ValueError):
        leave_position_map(members, "z:1")
    assert positions([]).dtype == np.uint64
