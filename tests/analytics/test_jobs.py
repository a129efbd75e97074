"""The Spark jobs on small generated data, each checked against a plain-Python computation."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from analytics_data import (
    NODES,
    PyRing,
    distro_hash,
    expected_balance,
    expected_churn,
    expected_consistency,
    make_balance_snapshots,
    make_consistency_snapshots,
    make_events,
    ring_positions,
    splitmix64,
)

from shoal.analytics import balance, churn, consistency, simulate
from shoal.export.writer import write_snapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_consistency_matches_plain_python(spark: SparkSession, tmp_path: Path) -> None:
    per_node = make_consistency_snapshots(tmp_path / "in")
    want = expected_consistency(per_node)
    res = consistency.run(spark, [tmp_path / "in"], tmp_path / "out", first=5, show_progress=False)

    assert res.nodes == want["nodes"]
    assert (res.identities, res.agreeing) == (want["identities"], want["agreeing"])
    assert 0 < res.agreeing < res.identities  # the generator produced both agreement and differences
    diffs = pq.read_table(res.outputs["diffs"]).to_pylist()
    got = {(d["namespace"], d["group"], d["service"], d["cluster"], d["ip"], d["port"], d["node"], d["status"],
            d["differs"]) for d in diffs}
    assert got == want["diffs"]
    assert len(diffs) == len(got)
    assert {s for *_, s, _ in got} == {"missing", "extra", "different"}
    assert res.counts == dict(Counter(d["status"] for d in diffs))

    psn = pq.read_table(res.outputs["per_service_node"]).to_pylist()
    got_counts = Counter()
    for r in psn:
        for col in ("instances", "expected", "missing", "extra", "different"):
            if r[col]:
                got_counts[(r["namespace"], r["group"], r["service"], r["node"], col)] = r[col]
    assert got_counts == +want["per_service_node"]
    services = pq.read_table(res.outputs["services"]).to_pylist()
    assert sum(s["identities"] for s in services) == want["identities"]
    assert sum(s["agreeing"] for s in services) == want["agreeing"]

    summary = res.outputs["summary"].read_text()
    assert f"agreement ratio {want['agreeing'] / want['identities']:.6f}" in summary
    first = min(want["diffs"], key=lambda d: (d[0], d[1], d[2], d[4], d[5], d[3], d[6]))
    assert f"{first[2]} cluster {first[3]} {first[4]}:{first[5]} on node {first[6]}: {first[7]}" in summary
    assert res.outputs["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "out" / "_staging").exists()


def test_churn_matches_plain_python(spark: SparkSession, tmp_path: Path) -> None:
    t0 = 1_700_000_000_000
    node_a = make_events(1, 120, t0)
    node_b = make_events(2, 80, t0 + 3_000)
    # two overlapping snapshots of node A: the overlap must be counted once
    write_snapshot(tmp_path / "in", NODES[0], t0 + 1, events=node_a[:80])
    write_snapshot(tmp_path / "in", NODES[0], t0 + 2, events=node_a[40:])
    write_snapshot(tmp_path / "in", NODES[1], t0 + 3, events=node_b)
    want = expected_churn({NODES[0]: node_a, NODES[1]: node_b}, 120_000)
    res = churn.run(spark, [tmp_path / "in"], tmp_path / "out", bucket_s=120, top=5, show_progress=False)

    assert res.events == want["events"] == 200
    got: Counter[tuple[Any, ...]] = Counter()
    for r in pq.read_table(res.outputs["service_buckets"]).to_pylist():
        for col in ("registrations", "deregistrations", "health_flips"):
            if r[col]:
                got[(r["namespace"], r["group"], r["service"], _epoch_ms(r["bucket_start"]), col)] = r[col]
    assert got == want["buckets"]
    flapping_rows = pq.read_table(res.outputs["flapping"]).to_pylist()
    flapping = [(r["namespace"], r["group"], r["service"], r["ip"], r["port"], r["flaps"], r["health_flips"],
                 r["registrations"], r["deregistrations"], r["nodes"]) for r in flapping_rows]
    assert flapping == want["flapping"]
    # first and last churn event of each flapping instance, as points in time
    churn_ts: dict[tuple[Any, ...], list[int]] = {}
    for e in {*node_a, *node_b}:
        if e[1] in churn.CHURN_KINDS and e[4] is not None and e[6] is not None and e[7] is not None:
            churn_ts.setdefault((e[2], e[3], e[4], e[6], e[7]), []).append(e[0])
    for r in flapping_rows:
        ts = churn_ts[(r["namespace"], r["group"], r["service"], r["ip"], r["port"])]
        assert (_epoch_ms(r["first_at"]), _epoch_ms(r["last_at"])) == (min(ts), max(ts))
    top = want["flapping"][0]
    assert f"{top[2]} {top[3]}:{top[4]}: {top[5]} flaps" in res.outputs["summary"].read_text()
    nodes = {(r["node"], r["kind"]): r["count"] for r in pq.read_table(res.outputs["nodes"]).to_pylist()}
    assert sum(nodes.values()) == 200 and nodes[(NODES[1], "sync_applied")] == sum(
        e[1] == "sync_applied" for e in node_b)


def test_balance_matches_plain_python(spark: SparkSession, tmp_path: Path) -> None:
    data = make_balance_snapshots(tmp_path / "in")
    res = balance.run(spark, [tmp_path / "in"], tmp_path / "out", vnodes=20, show_progress=False)
    assert res.joiner == "10.0.0.5:8848"
    want = expected_balance(data, res.joiner, vnodes=20)

    assert res.members == want["members"]
    got_nodes = {r.pop("node"): r for r in pq.read_table(res.outputs["nodes"]).to_pylist()}
    assert got_nodes == want["per_node"]
    movement = {(r["scenario"], r["member"], r["scheme"]): (r["moved"], r["must_move"])
                for r in pq.read_table(res.outputs["movement"]).to_pylist()}
    assert movement == want["movement"]
    skew = {r["metric"]: r for r in pq.read_table(res.outputs["skew"]).to_pylist()}
    clients = [v["clients"] for v in want["per_node"].values()]
    mean = sum(clients) / len(clients)
    assert math.isclose(skew["clients"]["max_over_mean"], max(clients) / mean)
    assert math.isclose(skew["clients"]["stddev"], math.sqrt(sum((c - mean) ** 2 for c in clients) / len(clients)))
    summary = res.outputs["summary"].read_text()
    assert f"join {res.joiner}: modulo moves" in summary and f"{want['keys']:,} ip:port clients" in summary


def _epoch_ms(t: datetime) -> int:
    assert t.tzinfo is not None  # a UTC timestamp, not a naive local time
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


# -- simulation ----------------------------------------------------------------------------------------


def _member(i: int) -> str:
    return f"192.168.{i // 250}.{i % 250 + 1}:8848"


def _draw(i: int, seed: int, rnd: int, stream: int) -> int:
    base = splitmix64((seed << 32) | (rnd << 8) | stream)
    return splitmix64((i + base) & ((1 << 64) - 1)) >> 11


def _b64(n: int) -> int:
    return 4 * math.ceil(n / 3)


def expected_simulation(p: simulate.SimParams) -> dict[str, Any]:
    """The simulation's answer, client by client, in plain Python."""
    members = sorted(_member(i) for i in range(p.nodes))
    joiner, leaver = _member(p.nodes), members[random.Random(p.seed).randrange(p.nodes)]
    joined, left = sorted([*members, joiner]), [m for m in members if m != leaver]
    rings = {name: PyRing(ms, p.vnodes) for name, ms in (("old", members), ("join", joined), ("leave", left))}
    keys = []
    for i in range(p.clients):
        v = (i * 2654435761 + p.seed * 40503) % 2**32
        keys.append(f"10.{v >> 16 & 255}.{v >> 8 & 255}.{v & 255}:{8000 + (v >> 24)}")
    key_pos = ring_positions(keys)
    owned: Counter[str] = Counter()
    owned_ring: Counter[str] = Counter()
    verify_b: Counter[str] = Counter()
    moved = Counter()
    must = Counter()
    rounds = [Counter() for _ in range(p.rounds)]
    t_churn, t_loss = math.floor(p.churn * 2**53), math.floor(p.loss * 2**53)
    for i, key in enumerate(keys):
        h = distro_hash(key)
        owner = members[h % len(members)]
        owned[owner] += 1
        cid_len, ip_len = len(key) + 5, len(key) - 5
        verify_b[owner] += simulate.VERIFY_FIXED + cid_len + _b64(simulate.VERIFY_BODY + cid_len)
        r_owner = {name: ring.owner_of(key_pos[i]) for name, ring in rings.items()}
        owned_ring[r_owner["old"]] += 1
        moved[("join", "modulo")] += owner != joined[h % len(joined)]
        moved[("leave", "modulo")] += owner != left[h % len(left)]
        moved[("join", "ring")] += r_owner["old"] != r_owner["join"]
        moved[("leave", "ring")] += r_owner["old"] != r_owner["leave"]
        must[("join", "modulo")] += joined[h % len(joined)] == joiner
        must[("join", "ring")] += r_owner["join"] == joiner
        sync_b = simulate.SYNC_FIXED + cid_len + _b64(simulate.SYNC_BODY + cid_len + ip_len)
        for r in range(p.rounds):
            if _draw(i, p.seed, r, 0) < t_churn:
                rounds[r]["churned"] += 1
                rounds[r]["sync_bytes"] += sync_b * (p.nodes - 1)
                if _draw(i, p.seed, r, 1) < t_loss:
                    rounds[r]["diverged"] += 1
                    rounds[r][f"diverged@{owner}"] += 1
                    rounds[r]["resync_bytes"] += sync_b
    must[("leave", "modulo")] = owned[leaver]
    must[("leave", "ring")] = owned_ring[leaver]
    return {"members": members, "joiner": joiner, "leaver": leaver, "owned": owned, "owned_ring": owned_ring,
            "verify_bytes": verify_b, "moved": moved, "must": must, "rounds": rounds}


def test_simulation_matches_plain_python_and_ignores_partitioning(spark: SparkSession, tmp_path: Path) -> None:
    params = simulate.SimParams(nodes=7, clients=3000, churn=0.2, rounds=3, loss=0.3, seed=11, vnodes=20,
                                partitions=3)
    want = expected_simulation(params)
    res = simulate.run(spark, params, tmp_path / "p3", show_progress=False)
    assert (res.members, res.joiner, res.leaver) == (want["members"], want["joiner"], want["leaver"])

    own = pq.read_table(res.outputs["ownership"]).to_pylist()
    assert [r["node"] for r in own] == want["members"]
    assert {r["node"]: r["owned"] for r in own} == {m: want["owned"][m] for m in want["members"]}
    assert {r["node"]: r["owned_ring"] for r in own} == {m: want["owned_ring"][m] for m in want["members"]}
    assert {r["node"]: r["nacos_verify_bytes_per_peer"] for r in own} == {
        m: want["verify_bytes"][m] for m in want["members"]}
    movement = {(r["scenario"], r["scheme"]): (r["moved"], r["must_move"])
                for r in pq.read_table(res.outputs["movement"]).to_pylist()}
    assert movement == {k: (want["moved"][k], want["must"][k]) for k in want["moved"]}

    peers = params.nodes - 1
    rounds = pq.read_table(res.outputs["rounds"]).to_pylist()
    for r, w in zip(rounds, want["rounds"], strict=True):
        assert (r["churned"], r["diverged"], r["sync_bytes"], r["resync_bytes"]) == (
            w["churned"], w["diverged"], w["sync_bytes"], w["resync_bytes"])
        assert r["sync_messages"] == w["churned"] * peers
        assert r["nacos_verify_messages"] == params.clients * peers
        assert r["nacos_verify_bytes"] == sum(want["verify_bytes"].values()) * peers
        # the verify protocol the nodes speak, priced by the layout they encode with
        repairs = {m: simulate.repair_cost(want["owned"][m]) for m in want["members"]}
        assert r["digest_verify_messages"] == params.nodes * peers + sum(
            w[f"diverged@{m}"] * repairs[m][0] for m in want["members"])
        assert r["digest_verify_bytes"] == sum(
            simulate.digest_round_bytes(want["owned"][m]) * peers + w[f"diverged@{m}"] * repairs[m][1]
            for m in want["members"])
    assert 0 < rounds[0]["diverged"] < rounds[0]["churned"]

    summary = res.outputs["summary"].read_text()
    assert "clients/s" in summary and f"join {want['joiner']}" in summary
    assert res.outputs["chart"].read_bytes()[:4] == b"\x89PNG"

    one = simulate.run(spark, simulate.SimParams(**{**_params_dict(params), "partitions": 1}), tmp_path / "p1",
                       show_progress=False)
    for name in ("ownership", "rounds", "node_rounds", "movement"):
        assert pq.read_table(one.outputs[name]).equals(pq.read_table(res.outputs[name])), name


def _params_dict(p: simulate.SimParams) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}
