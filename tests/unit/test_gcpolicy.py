"""The server's collector policy (shoal/gcpolicy.py) on this process's real collector.

A registry's bulk must leave the collector's generations once its growth settles: otherwise the
next young or full collection scans it while the node serves (a 124 ms generation-1 collection
while a 1,000,000-instance node served a snapshot, bench/distro/snapshot_load.py --gc-log).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from shoal.gcpolicy import THRESHOLDS, GcPolicy


@pytest.fixture
def collector() -> Iterator[None]:
    """Leaves the test process's collector as it found it (nothing frozen, same thresholds)."""
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def in_generations(obj: object) -> bool:
    """Whether ``obj`` is in one of the collector's generations (frozen objects are in none)."""
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation))


@pytest.mark.usefixtures("collector")
def test_settled_growth_is_frozen() -> None:
    policy = GcPolicy(min_growth=30_000)
    policy.install()
    frozen_before = gc.get_freeze_count()
    kept = [[i] for i in range(100_000)]  # 100,000 long-lived containers, as a loaded registry
    assert policy.growth() >= 0.9 * len(kept)  # an estimate: other objects come and go meanwhile
    assert policy.check() is False  # grown, but it grew within this interval: not settled yet
    assert in_generations(kept[-1])
    assert policy.check() is True  # nothing new since: settled, frozen
    assert gc.get_freeze_count() - frozen_before >= len(kept)
    assert not in_generations(kept[0]) and not in_generations(kept[-1])
    assert policy.freezes == 1 and policy.frozen_estimate >= 0.9 * len(kept)
    assert policy.growth() < 1000
    assert policy.check() is False  # nothing grew since the freeze


@pytest.mark.usefixtures("collector")
def test_a_settled_young_tail_is_frozen_below_the_growth_trigger() -> None:
    policy = GcPolicy(min_growth=10_000_000)
    policy.install()
    gc.collect()  # generations empty, counts 0
    frozen_before = gc.get_freeze_count()
    kept = [[i] for i in range(80_000)]  # one young collection's worth and more, still in generations 0-1
    assert policy.check() is False  # growing
    assert policy.check() is True  # settled: the tail a generation-1 collection would scan is frozen
    assert gc.get_freeze_count() - frozen_before >= len(kept)
    assert not in_generations(kept[-1])


@pytest.mark.usefixtures("collector")
def test_small_or_short_lived_growth_is_not_frozen() -> None:
    policy = GcPolicy(min_growth=200_000)
    policy.install()
    frozen_before = gc.get_freeze_count()
    kept = [[i] for i in range(20_000)]  # below the trigger and below one young collection
    for _ in range(1000):
        garbage = [[i] for i in range(1000)]  # allocated and freed: no growth
        del garbage
    assert policy.check() is False and policy.check() is False
    assert gc.get_freeze_count() == frozen_before
    assert in_generations(kept[0])


@pytest.mark.usefixtures("collector")
def test_later_freezes_wait_for_a_fraction_of_what_is_frozen() -> None:
    policy = GcPolicy(min_growth=10_000, growth_fraction=0.5)
    policy.install()
    first = [[i] for i in range(100_000)]
    policy.freeze("test")
    second = [[i] for i in range(20_000)]  # past min_growth, below half of what is frozen
    assert policy.check() is False and policy.check() is False
    assert in_generations(second[0])
    assert policy.freezes == 1
    del first


@pytest.mark.usefixtures("collector")
def test_install_sets_the_thresholds_and_startup_freezes_what_exists() -> None:
    policy = GcPolicy()
    policy.install()
    assert gc.get_threshold() == THRESHOLDS
    existing = [[i] for i in range(1000)]
    policy.freeze_startup()
    assert not in_generations(existing[0])
    # the count taken at the freeze; frozen objects that die since (another thread's, a frame's)
    # leave the permanent generation, so the count now can only be a little lower
    frozen_now = gc.get_freeze_count()
    assert 0 < frozen_now <= policy.frozen_estimate < frozen_now + 1000


@pytest.mark.usefixtures("collector")
def test_what_is_built_while_paused_is_frozen_and_the_collector_comes_back() -> None:
    policy = GcPolicy()
    policy.install()
    gc.enable()
    with policy.paused("load"):
        assert not gc.isenabled()
        built = [[i] for i in range(200_000)]  # no collection meanwhile: count 0 passes threshold 0
        assert gc.get_count()[0] >= len(built)
        assert in_generations(built[-1])
    assert gc.isenabled()
    assert not in_generations(built[0]) and not in_generations(built[-1])
    assert policy.freezes == 1 and policy.frozen_estimate >= 0.9 * len(built)


@pytest.mark.usefixtures("collector")
def test_a_failed_build_still_freezes_and_reenables() -> None:
    policy = GcPolicy()
    gc.enable()
    with pytest.raises(OSError), policy.paused("start"):
        raise OSError("port in use")
    assert gc.isenabled() and policy.freezes == 1
