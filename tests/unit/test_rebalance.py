"""The automatic rebalancing plan: threshold, rate, floor, target, and no move while a member loads."""

from __future__ import annotations

from typing import Any

from shoal.health.rebalance import MemberLoad, ServerLoader
from shoal.testing.model import config_with

SELF, B, C = "10.0.0.1:8848", "10.0.0.2:8848", "10.0.0.3:8848"


def _loader(**overrides: Any) -> ServerLoader:
    class Table:
        by_id: dict[str, Any] = {}

        def unregister(self, connection_id: str, reason: str) -> bool:
            return True

    class Resetter:
        async def reset(self, conn: Any, redirect: str) -> None:
            return None

    return ServerLoader(config_with(**overrides), Table(), Resetter(), SELF, lambda: [SELF, B, C], None,
                        lambda: True, lambda: 0)


def _loads(mine: int, b: int, c: int, loading: str = "") -> list[MemberLoad]:
    return [MemberLoad(a, {"sdkConCount": str(n), "loading": "true" if a == loading else "false"})
            for a, n in ((SELF, mine), (B, b), (C, c))]


def test_busiest_moves_its_surplus_to_the_least_loaded_at_the_rate() -> None:
    loader = _loader(rebalance_rate=50)
    assert loader.plan(_loads(300, 0, 10)) == (50, B)
    assert _loader(rebalance_rate=500).plan(_loads(300, 0, 10)) == (104, B)  # up to the average (104)


def test_no_move_within_threshold_below_average_or_at_the_floor() -> None:
    loader = _loader(rebalance_threshold=0.1)
    assert loader.plan(_loads(105, 100, 96)) == (0, "")  # spread 9 <= 10.03
    assert loader.plan(_loads(50, 200, 50)) == (0, "")  # not above the average: others shed
    assert _loader(rebalance_floor=295).plan(_loads(300, 0, 0)) == (5, B)


def test_no_move_while_a_member_loads_or_is_missing() -> None:
    loader = _loader()
    assert loader.plan(_loads(300, 0, 0, loading=C)) == (0, "")
    assert loader.plan(_loads(300, 0, 0)[:2]) == (0, "")


def test_a_nodes_surplus_is_split_over_its_workers_by_what_each_holds() -> None:
    from shoal.health.rebalance import split_moves

    assert split_moves([3, 3], 4) == [2, 2]
    assert split_moves([6, 2], 4) == [3, 1]
    assert split_moves([1, 1, 1], 2) == [1, 1, 0]  # equal remainders: the lower index first
    assert split_moves([0, 5], 3) == [0, 3]
    assert split_moves([2, 2], 9) == [2, 2]  # never more than a worker holds
    assert split_moves([2, 2], -1) == [0, 0]


def test_rebalancing_waits_for_a_node_whose_workers_did_not_all_answer() -> None:
    loader = _loader()
    partial = {"sdkConCount": "10", "workers": "2", "workersAnswered": "1"}
    loads = [MemberLoad(SELF, {"sdkConCount": "40"}), MemberLoad(B, partial), MemberLoad(C, {"sdkConCount": "10"})]
    assert loader.plan(loads) == (0, "")
    assert loader.plan([loads[0], MemberLoad(B, {**partial, "workersAnswered": "2"}), loads[2]]) != (0, "")
    assert not loads[1].complete and loads[0].complete
