"""The verify messages' encoders produce exactly the sizes the shared layout states, which is what
the cluster simulator charges (shoal.kernels.verify_layout, shoal.analytics.simulate)."""

from __future__ import annotations

import pytest

from shoal.distro.verify import wire
from shoal.kernels import verify_layout as layout


@pytest.mark.parametrize("count", [0, 1, 255, 257, 100_000, 2_000_000])
def test_digest_messages_have_the_layouts_sizes(count: int) -> None:
    n = layout.bucket_count(count)
    assert n & (n - 1) == 0 and 1 <= n <= layout.MAX_BUCKETS and (n == layout.MAX_BUCKETS or n * 256 >= count)
    assert len(wire.digest_body([7] * n, count)) == layout.digest_request_size(n, count)
    assert len(wire.digest_answer([0, n - 1], n)) == layout.digest_answer_size(n)


@pytest.mark.parametrize(("clients", "salt"), [(0, 0), (3, 2**63), (70_000, 12345)])
def test_detail_sub_and_remove_messages_have_the_layouts_sizes(clients: int, salt: int) -> None:
    n, k = 64, 8
    sub = wire.SubRequest(n, k, salt, [1, 63], tuple(range(2 * k)))
    assert len(sub.encode()) == layout.sub_request_size(n, k, [1, 63], salt)
    detail = wire.DetailRequest(n, k, salt, (9,), (clients,), tuple(range(clients)))
    assert len(detail.encode()) == layout.detail_request_size(n, k, 1, clients, salt)
    extra = [("client-1", 4), ("10.0.0.1:80#true", 2**40)]
    assert len(wire.detail_answer([0, 5], extra)) == layout.detail_answer_size(2, extra)
    assert len(wire.remove_request(extra)) == layout.remove_request_size(extra)


async def test_the_simulator_charges_what_a_verify_round_with_one_lost_change_sends() -> None:
    from shoal.analytics.simulate import ENVELOPE, digest_round_bytes, repair_cost
    from shoal.distro import records
    from shoal.testing import SimCluster

    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    owned = 5000
    for i in range(owned):
        a.register(f"c{i}", 1 + i)
    await cluster.flush()
    op, cid, revision, services = records.client_record(b.clients.get("c7"))  # type: ignore[arg-type]
    b.distro._apply(cluster.addresses[0], [(op, cid, revision - 1, services)])  # a lost change
    await a.distro.verify_round()
    sent = a.distro.verify_stats.last_round[cluster.addresses[1]]
    requests, repair = repair_cost(owned)
    assert sent["requests"] == 1 + requests and sent["resynced"] == 1
    charged = digest_round_bytes(owned) + repair - 4 * ENVELOPE  # SimCluster has no gRPC envelope
    # the same messages; only the bucket's actual client count and the salt's digits differ
    assert abs(sent["bytes"] + sent["answer_bytes"] - charged) <= 0.1 * charged
