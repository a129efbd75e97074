"""Issue 23 item 4: service digests and how members' digests are compared."""

from __future__ import annotations

from shoal.model.instance import InstanceInfo
from shoal.service_layer.digests import ABSENT, compare, digest_of, parse_digests, persistent


def test_a_digest_ignores_order_and_sees_every_field() -> None:
    one = InstanceInfo("10.0.0.1", 80, metadata={"a": "1", "b": "2"})
    two = InstanceInfo("10.0.0.2", 80)
    assert digest_of([one, two]) == digest_of([two, InstanceInfo("10.0.0.1", 80, metadata={"b": "2", "a": "1"})])
    base = digest_of([one])
    for changed in (InstanceInfo("10.0.0.1", 80, weight=2.0, metadata=one.metadata),
                    InstanceInfo("10.0.0.1", 80, healthy=False, metadata=one.metadata),
                    InstanceInfo("10.0.0.1", 80, enabled=False, metadata=one.metadata),
                    InstanceInfo("10.0.0.1", 80, metadata={"a": "1"}),
                    InstanceInfo("10.0.0.1", 80, cluster="other", metadata=one.metadata)):
        assert digest_of([changed]) != base, changed
    assert base[1] == 1


def test_compare_groups_members_and_counts_the_odd_one_out() -> None:
    s1, s2 = ("aaaa", 1), ("bbbb", 2)
    result = compare({"A": {"x": s1, "y": s2}, "B": {"x": s1, "y": s2}, "C": {"x": s1}, "D": None})
    assert result.services == 2 and result.unanswered == ["D"] and not result.agree
    assert result.disagree == {"y": {s2: ["A", "B"], ABSENT: ["C"]}}
    assert result.per_member() == {"A": 0, "B": 0, "C": 1, "D": 0}
    assert compare({"A": {"x": s1}, "B": {"x": s1}}).agree


def test_only_what_two_rounds_show_is_reported() -> None:
    """A write still in flight at the first round is gone from the second: not reported."""
    s1, s2 = ("aaaa", 1), ("bbbb", 2)
    first = compare({"A": {"x": s2, "y": s2}, "B": {"x": s1, "y": s1}, "C": None})
    second = compare({"A": {"x": s2, "y": s2}, "B": {"x": s2, "y": s1}, "C": None})
    result = persistent(first, second)
    assert set(result.disagree) == {"y"} and result.unanswered == ["C"]
    assert persistent(compare({"A": {}, "B": None}), compare({"A": {}, "B": {}})).agree
    # B was paused in the first round and answers a stale list in the second: reported
    late = persistent(compare({"A": {"x": s1}, "B": None}), compare({"A": {"x": s1}, "B": {}}))
    assert late.disagree == {"x": {s1: ["A"], ABSENT: ["B"]}} and late.unanswered == []


def test_parse_digests_refuses_what_is_not_a_digest_map() -> None:
    assert parse_digests({"x": ["aaaa", 1]}) == {"x": ("aaaa", 1)}
    assert parse_digests({"x": "aaaa"}) is None
    assert parse_digests(["x"]) is None
