"""Kernel micro-benchmarks: each kernel, compiled and pure Python, on realistic batch sizes.

Run with ``bash ci/bench.sh`` (or ``make bench``); each group holds the "cython" and "py" runs
of one workload so ``bench/report_ratios.py`` can print the speed-up. Both sides use
``benchmark.pedantic`` with one call per round: 30 rounds compiled, 3 for the slow pure-Python
runs to keep the whole run short. ``extra_info["items"]``
is the number of items one call processes (for items/s in the report).
"""

from __future__ import annotations

import importlib
import random
from array import array
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

IMPLS = ["cython", "py"]
PY_ROUNDS = 3
CYTHON_ROUNDS = 30


def load(name: str, impl: str) -> ModuleType:
    return importlib.import_module(f"shoal._ext.{name}" if impl == "cython" else f"shoal.kernels.{name}_py")


def run(benchmark: Any, impl: str, group: str, items: int, fn: Callable[..., Any], *args: Any) -> Any:
    benchmark.group = group
    benchmark.extra_info["items"] = items
    # One call per round on both sides, so freeing a round's result is never inside the timing
    # (in calibrated mode pytest-benchmark drops results inside its timed loop).
    if impl == "py":
        return benchmark.pedantic(fn, args=args, rounds=PY_ROUNDS, iterations=1, warmup_rounds=0)
    return benchmark.pedantic(fn, args=args, rounds=CYTHON_ROUNDS, iterations=1, warmup_rounds=1)


# -- data (module-scoped: built once, shared by both implementations) ----------------------------

NOW = 1_700_000_000_000


@pytest.fixture(scope="module")
def connections() -> array[int]:
    # 1,000,000 keep-alive slots: 5% empty, the rest active within the last 20.5 s (so ~2.5%
    # are past a 20 s idle limit, like a scan that finds a handful of dead connections).
    rnd = random.Random(11)
    return array("q", (-1 if rnd.random() < 0.05 else NOW - rnd.randrange(20_500) for _ in range(1_000_000)))


@pytest.fixture(scope="module")
def beats() -> tuple[array[int], array[int], array[int], array[int]]:
    # 1,000,000 ip:port instances: beats every 5 s, a few percent overdue; Nacos defaults of
    # 15 s (unhealthy) and 30 s (delete), some instances with removal disabled.
    rnd = random.Random(12)
    n = 1_000_000
    last = array(
        "q", (NOW - (rnd.randrange(5_000) if rnd.random() < 0.97 else rnd.randrange(60_000)) for _ in range(n))
    )
    unhealthy = array("q", [15_000]) * n
    remove = array("q", (30_000 if rnd.random() < 0.9 else -1 for _ in range(n)))
    healthy = array("B", (1 if rnd.random() < 0.99 else 0 for _ in range(n)))
    return last, unhealthy, remove, healthy


@pytest.fixture(scope="module")
def distro_keys() -> list[str]:
    # Nacos client ids: half ip:port ephemeral clients, half gRPC connection ids.
    rnd = random.Random(13)
    keys = []
    for i in range(1_000_000):
        ip = f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(256)}"
        keys.append(f"{ip}:{rnd.randrange(1024, 65536)}#true" if i % 2 else f"{NOW + i}_{ip}_{rnd.randrange(65536)}")
    return keys


MEMBERS = [f"10.1.0.{i}:8848" for i in range(1, 101)]


@pytest.fixture(scope="module")
def clients() -> tuple[list[str], list[int]]:
    rnd = random.Random(14)
    ids = [f"{NOW + i}_10.0.{rnd.randrange(256)}.{rnd.randrange(256)}_{rnd.randrange(65536)}" for i in range(100_000)]
    return ids, [rnd.randrange(2**40) for _ in ids]


def make_batch(n_clients: int) -> list[Any]:
    # Each client: 2 services x 1-3 instances with a few metadata keys (a Spring Cloud-like app).
    rnd = random.Random(16)
    batch = []
    for c in range(n_clients):
        services = []
        for s in range(2):
            service = f"svc-{c % 500}-{s}"
            instances = []
            for k in range(rnd.randint(1, 3)):
                ip = f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(256)}"
                port = 8080 + k
                metadata = {
                    "version": "1.4.2",
                    "zone": f"az-{rnd.randrange(3)}",
                    "preserved.register.source": "SPRING_CLOUD",
                }
                instances.append(
                    (
                        ip,
                        port,
                        1.0,
                        True,
                        True,
                        "DEFAULT",
                        f"{ip}#{port}#DEFAULT#DEFAULT_GROUP@@{service}",
                        metadata,
                        NOW + rnd.randrange(5_000),
                    )
                )
            services.append(("public", "DEFAULT_GROUP", service, False, instances))
        batch.append((0, f"10.0.{c // 256 % 256}.{c % 256}:{50000 + c % 10000}#true", rnd.randrange(2**40), services))
    return batch


@pytest.fixture(scope="module")
def sync_batch() -> tuple[list[Any], bytes]:
    batch = make_batch(10_000)
    return batch, load("syncser", "py").encode_batch(batch)


# -- benches ------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_expiry_idle_slots(benchmark: Any, impl: str, connections: array[int]) -> None:
    mod = load("expiry", impl)
    result = run(
        benchmark, impl, "expiry.idle_slots 1M connections", len(connections), mod.idle_slots, connections, NOW, 20_000
    )
    assert 10_000 < len(result) < 40_000


@pytest.mark.parametrize("impl", IMPLS)
def test_expiry_beat_deadlines(benchmark: Any, impl: str, beats: tuple[array[int], ...]) -> None:
    mod = load("expiry", impl)
    to_unhealthy, to_remove = run(
        benchmark, impl, "expiry.beat_deadlines 1M instances", len(beats[0]), mod.beat_deadlines, *beats, NOW
    )
    assert to_unhealthy and to_remove


@pytest.mark.parametrize("members", [3, 100])
@pytest.mark.parametrize("impl", IMPLS)
def test_ownership_owner_indices(benchmark: Any, impl: str, members: int, distro_keys: list[str]) -> None:
    mod = load("ownership", impl)
    result = run(
        benchmark,
        impl,
        f"ownership.owner_indices 1M keys / {members} members",
        len(distro_keys),
        mod.owner_indices,
        distro_keys,
        members,
    )
    assert len(result) == len(distro_keys)


@pytest.mark.parametrize("impl", IMPLS)
def test_ownership_moved_keys(benchmark: Any, impl: str, distro_keys: list[str]) -> None:
    mod = load("ownership", impl)
    result = run(
        benchmark,
        impl,
        "ownership.moved_keys 1M keys 3->4 members",
        len(distro_keys),
        mod.moved_keys,
        distro_keys,
        MEMBERS[:3],
        MEMBERS[:4],
    )
    assert 0.7 < len(result) / len(distro_keys) < 0.8


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_bucket_digests(benchmark: Any, impl: str, clients: tuple[list[str], list[int]]) -> None:
    mod = load("verify", impl)
    ids, revisions = clients
    result = run(
        benchmark, impl, "verify.bucket_digests 100k clients", len(ids), mod.bucket_digests, ids, revisions, 64
    )
    assert len(result) == 64


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_bucket_of(benchmark: Any, impl: str, clients: tuple[list[str], list[int]]) -> None:
    mod = load("verify", impl)
    ids, _ = clients
    result = run(benchmark, impl, "verify.bucket_of 100k clients", len(ids), mod.bucket_of, ids, 64)
    assert len(result) == len(ids)


@pytest.fixture(scope="module")
def sorted_keys() -> tuple[array[int], array[int]]:
    # The verify detail phase's diff (verify wire version 2): sorted 64-bit keys (sub-bucket << 32 |
    # salted revision hash) of 100,000 clients against a peer's with 1% different, as array('Q')
    # both sides as DistroVerifier passes them: 0.5% changed, 0.25% missing, 0.25% extra.
    rnd = random.Random(17)
    keys = sorted(set(rnd.getrandbits(64) for _ in range(100_000)))
    theirs = list(keys)
    changed = rnd.sample(range(len(keys)), 1000)
    for i in changed[:500]:
        theirs[i] ^= 1
    for i in sorted(changed[500:750], reverse=True):
        del theirs[i]
    theirs += [rnd.getrandbits(64) for _ in range(250)]
    return array("Q", sorted(theirs)), array("Q", keys)


@pytest.mark.parametrize("impl", IMPLS)
def test_verify_diff_sorted(benchmark: Any, impl: str, sorted_keys: tuple[array[int], array[int]]) -> None:
    mod = load("verify", impl)
    theirs, mine = sorted_keys
    lacking, extra = run(
        benchmark, impl, "verify.diff_sorted 100k vs 100k keys, 1% differ", len(mine), mod.diff_sorted, theirs, mine
    )
    assert (len(lacking), len(extra)) == (750, 750)


@pytest.mark.parametrize("impl", IMPLS)
def test_syncser_encode(benchmark: Any, impl: str, sync_batch: tuple[list[Any], bytes]) -> None:
    mod = load("syncser", impl)
    batch, data = sync_batch
    assert run(benchmark, impl, "syncser.encode_batch 10k clients", len(batch), mod.encode_batch, batch) == data


@pytest.mark.parametrize("impl", IMPLS)
def test_syncser_decode(benchmark: Any, impl: str, sync_batch: tuple[list[Any], bytes]) -> None:
    mod = load("syncser", impl)
    batch, data = sync_batch
    assert run(benchmark, impl, "syncser.decode_batch 10k clients", len(batch), mod.decode_batch, data) == batch
