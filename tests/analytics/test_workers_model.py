"""The workers model's formulas against cases computed by hand, and its inputs file.

Hand case (``HAND``): query 40 µs, register 30 µs, sync send 10 µs and apply 20 µs per record
(30 per record and peer), an idle worker of 50 MiB and 2,000 bytes per instance.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shoal.analytics import workers_model as wm

HAND = wm.Inputs(query_us=40.0, register_us=30.0, sync_send_us=10.0, sync_apply_us=20.0,
                 idle_rss_bytes=50 * 2**20, bytes_per_instance=2000.0, measured_instances=100_000)


def test_members_per_scheme() -> None:
    assert wm.members(3, 8) == 24  # every worker a member
    assert wm.members(3, 8, "node") == 3  # one replica per node
    assert wm.members(3, 8, "node-single-writer") == 3
    assert wm.members(1, 1) == 1
    with pytest.raises(ValueError, match="unknown replica scheme"):
        wm.members(3, 8, "shard")


def test_a_write_costs_its_handling_and_a_send_and_apply_per_other_member() -> None:
    assert wm.write_cpu_us(HAND, 1) == 30.0  # alone: nothing to sync
    assert wm.write_cpu_us(HAND, 3) == 30.0 + 2 * 30.0
    assert wm.write_cpu_us(HAND, 24) == 30.0 + 23 * 30.0  # 3 nodes x 8 workers = 720
    assert wm.op_cpu_us(HAND, 24, 0.25) == pytest.approx(0.75 * 40 + 0.25 * 720)  # 210


def test_node_rates_for_three_nodes_of_eight_workers() -> None:
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 0.0) == pytest.approx(8e6 / 40)  # queries: 200,000
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 1.0) == pytest.approx(8e6 / 720)  # registrations: 11,111
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 0.25) == pytest.approx(8e6 / 210)  # mixed: 38,095
    # one replica per node: a write is synced to the 2 other nodes only
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 1.0, scheme="node") == pytest.approx(8e6 / 90)
    # half a core per core
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 0.0, efficiency=0.5) == pytest.approx(100_000)


def test_one_writer_per_node_caps_a_node_at_what_it_can_apply() -> None:
    # the writer applies the cluster's writes, 3 x X x f, at 20 µs each
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 1.0, scheme="node-single-writer") == pytest.approx(1e6 / 60)
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 0.25, scheme="node-single-writer") == pytest.approx(1e6 / 15)
    # below the cap it is the node scheme: 8e6 / (0.99 x 40 + 0.01 x 90)
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 0.01, scheme="node-single-writer") == pytest.approx(8e6 / 40.5)
    assert wm.node_ops_per_s(HAND, 3, 8, 8, 0.0, scheme="node-single-writer") == pytest.approx(8e6 / 40)
    assert wm.node_rss_bytes(HAND, 8, 100_000, "node-single-writer") == 8 * 50 * 2**20 + 200_000_000


def test_workers_beyond_the_cores_add_replication_but_no_capacity() -> None:
    assert wm.node_ops_per_s(HAND, 3, 8, 16, 0.0) == pytest.approx(8e6 / 40)
    assert wm.node_ops_per_s(HAND, 3, 8, 16, 1.0) == pytest.approx(8e6 / (30 + 47 * 30))


def test_replication_share() -> None:
    assert wm.replication_share(HAND, 24, 1.0) == pytest.approx(690 / 720)
    assert wm.replication_share(HAND, 24, 0.25) == pytest.approx(0.25 * 690 / 210)
    assert wm.replication_share(HAND, 24, 0.0) == 0.0
    assert wm.replication_share(HAND, 1, 1.0) == 0.0


def test_write_ceiling_is_the_limit_as_workers_grow() -> None:
    assert wm.write_ceiling_per_node(HAND, 3) == pytest.approx(1e6 / 90)
    huge = 100_000
    assert wm.node_ops_per_s(HAND, 3, huge, huge, 1.0) == pytest.approx(1e6 / 90, rel=1e-4)
    # with handling == send + apply (30 == 30) the ceiling is reached at once: workers change nothing
    rates = [wm.node_ops_per_s(HAND, 3, 8, w, 1.0) for w in range(1, 9)]
    assert rates == pytest.approx([1e6 / 90] * 8)
    assert wm.knee(rates) == 1
    free = wm.Inputs(query_us=40, register_us=30, sync_send_us=0, sync_apply_us=0, idle_rss_bytes=0,
                     bytes_per_instance=0)
    assert wm.write_ceiling_per_node(free, 3) == float("inf")


def test_knee() -> None:
    assert wm.knee([100, 200, 300, 400]) is None  # every worker pays in full
    assert wm.knee([10, 20, 24, 25]) == 2  # the third adds 4 < 10 / 2
    assert wm.knee([10, 9]) == 1  # the second one costs more than it brings
    assert wm.knee([10]) is None
    assert wm.knee([]) is None
    query_rates = [wm.node_ops_per_s(HAND, 3, 8, w, 0.0) for w in range(1, 9)]
    assert wm.knee(query_rates) is None


def test_memory_per_worker_and_node() -> None:
    idle = 50 * 2**20
    assert wm.worker_rss_bytes(HAND, 100_000) == idle + 200_000_000
    assert wm.worker_rss_bytes(HAND, 1_000_000) == idle + 2_000_000_000
    assert wm.node_rss_bytes(HAND, 8, 100_000) == 8 * (idle + 200_000_000)
    assert wm.node_rss_bytes(HAND, 8, 100_000, "node") == 8 * idle + 200_000_000
    # 16 GiB / (50 MiB + 2 GB) = 8.37
    assert wm.workers_that_fit(HAND, 1_000_000, 16 * 2**30) == 8
    assert wm.workers_that_fit(HAND, 1_000_000, 2**30) == 0


def test_grid_and_evaluate_agree_with_the_formulas() -> None:
    p = wm.WorkersParams(nodes=3, cores=(2,), write_fraction=0.33)
    configs = wm.grid(p)
    # 3 schemes x node counts {1, 3} x workers 1..2 x (23 fractions + 0.33)
    assert len(configs) == 3 * 2 * 2 * 24
    assert len(set(configs)) == len(configs)
    batch = wm.evaluate(HAND, configs, 1.0).to_pylist()
    for cfg, row in zip(configs, batch, strict=True):
        scheme, k, c, w, f = cfg
        assert (row["scheme"], row["nodes"], row["cores"], row["workers"], row["write_fraction"]) == cfg
        x = wm.node_ops_per_s(HAND, k, c, w, f, scheme=scheme)
        assert row["node_ops_per_s"] == pytest.approx(x)
        assert row["node_queries_per_s"] + row["node_writes_per_s"] == pytest.approx(x)
    assert len(wm.grid(wm.WorkersParams(cores=(4,), workers=6))) == 3 * 2 * 6 * 23  # workers 1..6


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (wm.WorkersParams(nodes=0), "--nodes"),
        (wm.WorkersParams(cores=()), "--cores"),
        (wm.WorkersParams(cores=(0, 8)), "--cores"),
        (wm.WorkersParams(workers=0), "--workers-per-node"),
        (wm.WorkersParams(write_fraction=1.5), "--write-fraction"),
        (wm.WorkersParams(efficiency=0.0), "--efficiency"),
        (wm.WorkersParams(instances=(-1,)), "--instances"),
        (wm.WorkersParams(node_memory_gib=0), "--node-memory-gib"),
    ],
)
def test_bad_parameters_are_refused(params: wm.WorkersParams, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params.validate()


def test_the_shipped_inputs_load_and_name_their_sources() -> None:
    inputs = wm.Inputs.load()
    for name in ("query_us", "register_us", "sync_send_us", "sync_apply_us", "idle_rss_bytes", "bytes_per_instance"):
        assert getattr(inputs, name) > 0
        assert "bench" in inputs.sources[name] and "load average" in inputs.sources[name]
    assert inputs.measured_instances >= 100_000


def test_inputs_files_round_trip_and_bad_ones_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(HAND.to_json()))
    assert dataclasses.replace(wm.Inputs.load(good), sources={}) == HAND
    with pytest.raises(ValueError, match=r"(?i)no such file"):
        wm.Inputs.load(tmp_path / "missing.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(ValueError, match=r"text\.json"):
        wm.Inputs.load(tmp_path / "text.json")
    doc = HAND.to_json()
    del doc["inputs"]["sync_apply_us"]
    (tmp_path / "short.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="sync_apply_us"):
        wm.Inputs.load(tmp_path / "short.json")
    doc = HAND.to_json()
    doc["inputs"]["query_us"]["value"] = -1
    (tmp_path / "negative.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="query_us"):
        wm.Inputs.load(tmp_path / "negative.json")
