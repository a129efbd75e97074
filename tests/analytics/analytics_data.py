"""Plain-Python references for the analytics tests: small generated snapshots and independent
re-computations of each job's answer (no Spark, no numpy, and no shoal code beyond the writer)."""

from __future__ import annotations

import bisect
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shoal.export.writer import write_snapshot

NODES = ["10.0.0.1:8848", "10.0.0.2:8848", "10.0.0.3:8848"]
MASK64 = (1 << 64) - 1


# -- hashing, written out independently of src/ ----------------------------------------------------


def java_hash(s: str) -> int:
    h = 0
    for unit in s.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def distro_hash(s: str) -> int:
    # Java: Math.abs(hashCode % Integer.MAX_VALUE), where % keeps the dividend's sign
    return abs(java_hash(s)) % 2147483647


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def ring_positions(strings: Sequence[str]) -> list[int]:
    import numpy as np
    from pandas.util import hash_array

    return [int(x) for x in hash_array(np.array(list(strings), dtype=object), encoding="utf8",
                                       hash_key="0123456789123456", categorize=False)]


class PyRing:
    """Consistent-hash ring: members' "<member>#<i>" points; a key goes to the first point >= it."""

    def __init__(self, members: Sequence[str], vnodes: int) -> None:
        points = []
        for idx, m in enumerate(members):
            labels = [f"{m}#{i}" for i in range(vnodes)]
            points += [(p, idx) for p in ring_positions(labels)]
        points.sort()
        self.members = list(members)
        self.pos = [p for p, _ in points]
        self.owner = [o for _, o in points]

    def owner_of(self, key_pos: int) -> str:
        i = bisect.bisect_left(self.pos, key_pos)
        return self.members[self.owner[i % len(self.pos)]]


# -- instance snapshots for consistency ------------------------------------------------------------


def instance_row(ident: tuple[Any, ...], value: tuple[Any, ...], owner: str | None, rev: int, cid: str) -> tuple:
    ns, group, service, cluster, ip, port = ident
    weight, healthy, enabled, md = value
    return (ns, group, service, cluster, ip, port, weight, healthy, enabled, True, dict(md), None, cid, owner,
            rev, None, None)


def make_consistency_snapshots(root: Path, seed: int = 7) -> dict[str, list[tuple]]:
    """Three nodes' instances with random missing/extra/different copies and duplicate rows."""
    rng = random.Random(seed)
    owners = [*NODES, "10.0.0.9:8848", None]  # an owner that was not snapshotted, and unknown
    per_node: dict[str, list[tuple]] = {n: [] for n in NODES}
    for i in range(90):
        ident = (rng.choice(["public", "dev"]), "DEFAULT_GROUP", f"svc-{i % 6}", rng.choice(["DEFAULT", "c2"]),
                 f"10.1.{i // 250}.{i % 250}", 8000 + i % 3)
        base = (1.0, True, True, (("app", f"a{i % 4}"),))
        owner = rng.choice(owners)
        for node in NODES:
            r = rng.random()
            if r < 0.12:
                continue  # missing on this node
            value = base
            if r < 0.18:
                value = (2.0, True, True, base[3])
            elif r < 0.22:
                value = (1.0, False, True, base[3])
            elif r < 0.26:
                value = (1.0, True, True, (("app", "zz"), ("v", "2")))
            node_owner = owner if rng.random() > 0.05 else rng.choice(NODES)
            per_node[node].append(instance_row(ident, value, node_owner, 1, f"{ident[4]}:{ident[5]}#true"))
            if i % 17 == 0:  # a second client publishing the same identity, older revision
                stale = (5.0, False, False, ())
                per_node[node].append(instance_row(ident, stale, node_owner, 0, f"old-{i}"))
    for t, node in enumerate(NODES):
        rng.shuffle(per_node[node])
        write_snapshot(root, node, 1_700_000_000_000 + t * 300, instances=per_node[node], batch_rows=16)
    return per_node


def expected_consistency(per_node: dict[str, list[tuple]]) -> dict[str, Any]:
    nodes = sorted(per_node)
    n = len(nodes)
    copies: dict[tuple, dict[str, tuple]] = {}
    for node, rows in per_node.items():
        best: dict[tuple, tuple] = {}
        for r in rows:
            ident = r[:6]
            key = (r[14], r[12])  # client revision, client id
            value = (r[6], r[7], r[8], tuple(sorted(r[10].items())))
            if ident not in best or key > best[ident][0]:
                best[ident] = (key, value, r[13])
        for ident, (_, value, owner) in best.items():
            copies.setdefault(ident, {})[node] = (value, owner)
    diffs = set()
    per_service_node: Counter[tuple] = Counter()
    agreeing = 0
    for ident, held in copies.items():
        owner_counts = Counter(o for _, o in held.values() if o is not None)
        owner = min(owner_counts, key=lambda o: (-owner_counts[o], o)) if owner_counts else None
        value_counts = Counter(v for v, _ in held.values())
        first_node = {v: min(nd for nd, (vv, _) in held.items() if vv == v) for v in value_counts}
        majority = min(value_counts, key=lambda v: (-value_counts[v], first_node[v]))
        if owner in nodes:
            expected = owner in held
            ref = held[owner][0] if expected else None
        else:
            expected = len(held) * 2 >= n
            ref = majority
        if len(held) == n and len(value_counts) == 1:
            agreeing += 1
        for node in nodes:
            mine = held.get(node)
            status = None
            differs = ""
            if expected and mine is None:
                status = "missing"
            elif not expected and mine is not None:
                status = "extra"
            elif expected and mine is not None and mine[0] != ref:
                status = "different"
                assert ref is not None
                names = ["weight", "healthy", "enabled", "metadata"]
                differs = ",".join(nm for nm, a, b in zip(names, mine[0], ref, strict=True) if a != b)
            svc = (ident[0], ident[1], ident[2], node)
            per_service_node[(*svc, "instances")] += mine is not None
            per_service_node[(*svc, "expected")] += expected
            if status:
                per_service_node[(*svc, status)] += 1
                diffs.add((*ident, node, status, differs))
    return {"diffs": diffs, "per_service_node": per_service_node, "agreeing": agreeing,
            "identities": len(copies), "nodes": nodes}


# -- events for churn ---------------------------------------------------------------------------------

EVENT_KINDS = ["register", "deregister", "health_flip", "sync_applied", "client_connected",
               "client_disconnected", "client_expired"]


def make_events(seed: int, count: int, t0: int) -> list[tuple]:
    rng = random.Random(seed)
    events = []
    for k in range(count):
        kind = rng.choices(EVENT_KINDS, weights=[3, 2, 4, 3, 1, 1, 1])[0]
        ts = t0 + k * 7_000 + rng.randrange(5_000)
        if kind.startswith("client_"):
            events.append((ts, kind, None, None, None, f"c{rng.randrange(5)}", None, None, None, "conn"))
            continue
        svc = f"svc-{rng.randrange(4)}"
        ip, port = f"10.2.0.{rng.randrange(6)}", 9000 + rng.randrange(2)
        healthy = rng.random() < 0.5 if kind == "health_flip" else None
        events.append((ts, kind, "public", "DEFAULT_GROUP", svc, f"{ip}:{port}#true", ip, port, healthy, None))
    return events


def expected_churn(events_by_node: dict[str, list[tuple]], bucket_ms: int) -> dict[str, Any]:
    unique = {(*e, node) for node, evs in events_by_node.items() for e in evs}
    buckets: Counter[tuple] = Counter()
    inst: dict[tuple, Counter[str]] = {}
    inst_nodes: dict[tuple, set[str]] = {}
    cols = {"register": "registrations", "deregister": "deregistrations", "health_flip": "health_flips"}
    for e in unique:
        ts, kind, ns, group, svc, _cid, ip, port = e[:8]
        if kind not in cols or svc is None:
            continue
        buckets[(ns, group, svc, ts // bucket_ms * bucket_ms, cols[kind])] += 1
        if ip is not None and port is not None:
            key = (ns, group, svc, ip, port)
            inst.setdefault(key, Counter())[cols[kind]] += 1
            inst_nodes.setdefault(key, set()).add(e[-1])
    flapping = []
    for key, c in inst.items():
        flaps = c["health_flips"] + min(c["registrations"], c["deregistrations"])
        if flaps > 0:
            flapping.append((*key, flaps, c["health_flips"], c["registrations"], c["deregistrations"],
                             sorted(inst_nodes[key])))
    flapping.sort(key=lambda r: (-r[5], -r[6], *r[:5]))
    return {"buckets": buckets, "flapping": flapping, "events": len(unique)}


# -- clients for balance ------------------------------------------------------------------------------


def client_row(cid: str, kind: str, native: bool, owner: str | None) -> tuple:
    ip = cid.split(":")[0] if kind == "ip_port" else "10.9.9.9"
    return (cid, kind, native, owner, 1, ip, 1_700_000_000_000, 1_700_000_000_500, None, 1, 0)


def make_balance_snapshots(root: Path, seed: int = 3) -> dict[str, Any]:
    rng = random.Random(seed)
    members = [*NODES, "10.0.0.4:8848"]  # .4 owns clients but was not snapshotted
    clients: dict[str, list[tuple]] = {n: [] for n in NODES}
    instances: dict[str, list[tuple]] = {n: [] for n in NODES}
    for i in range(400):
        if i % 5 == 0:
            cid, kind = f"17000000{i:05d}_10.9.9.9_5{i:04d}", "connection"
            owner = rng.choice(NODES)
            holders = [owner] if rng.random() < 0.5 else NODES
        else:
            cid, kind = f"10.3.{i // 200}.{i % 200}:{7000 + i % 7}#true", "ip_port"
            owner = members[distro_hash(cid.split("#")[0]) % len(members)]
            holders = NODES
        for node in holders:
            reported = owner if rng.random() > 0.1 or node == owner else rng.choice(members)
            clients[node].append(client_row(cid, kind, node == owner, reported))
            ip, port = ("10.9.9.9", 5000 + i) if kind == "connection" else (cid.split(":")[0],
                                                                               int(cid.split(":")[1][:4]))
            ident = ("public", "DEFAULT_GROUP", f"svc-{i % 3}", "DEFAULT", ip, port)
            instances[node].append(instance_row(ident, (1.0, True, True, ()), reported, 1, cid))
    for t, node in enumerate(NODES):
        write_snapshot(root, node, 1_700_000_000_000 + t, clients=clients[node], instances=instances[node],
                       batch_rows=50)
    return {"clients": clients, "instances": instances}


def expected_balance(data: dict[str, Any], joiner: str, vnodes: int) -> dict[str, Any]:
    clients, instances = data["clients"], data["instances"]
    native: dict[str, str] = {}
    reported: dict[str, Counter[str]] = {}
    kinds: dict[str, str] = {}
    for node, rows in clients.items():
        for cid, kind, is_native, owner, *_ in rows:
            kinds[cid] = kind
            if is_native:
                native[cid] = min(native.get(cid, node), node)
            if owner is not None:
                reported.setdefault(cid, Counter())[owner] += 1
    owner_of = {}
    for cid in kinds:
        if cid in native:
            owner_of[cid] = native[cid]
        else:
            c = reported[cid]
            owner_of[cid] = min(c, key=lambda o: (-c[o], o))
    inst_owner: dict[tuple, Counter[str]] = {}
    for rows in instances.values():
        for r in rows:
            inst_owner.setdefault(r[:6], Counter())[r[13]] += 1
    members = sorted(set(clients) | set(owner_of.values())
                     | {min(c, key=lambda o: (-c[o], o)) for c in inst_owner.values()})
    per_node = {m: {"clients": 0, "connection_clients": 0, "ip_port_clients": 0, "instances": 0} for m in members}
    for cid, o in owner_of.items():
        per_node[o]["clients"] += 1
        per_node[o][f"{kinds[cid]}_clients"] += 1
    for c in inst_owner.values():
        per_node[min(c, key=lambda o: (-c[o], o))]["instances"] += 1
    keys = sorted({cid.split("#")[0] for cid, k in kinds.items() if k == "ip_port"})
    movement = {}
    n = len(members)
    key_pos = dict(zip(keys, ring_positions(keys), strict=True))
    ring = PyRing(members, vnodes)

    def modulo(ms: list[str], key: str) -> str:
        return ms[distro_hash(key) % len(ms)]

    scenarios = [("join", joiner, sorted([*members, joiner]))]
    scenarios += [("leave", m, [x for x in members if x != m]) for m in members]
    for scenario, member, new_members in scenarios:
        new_ring = PyRing(new_members, vnodes)
        for scheme in ("modulo", "ring"):
            moved = must = 0
            for k in keys:
                if scheme == "modulo":
                    a, b = modulo(members, k), modulo(new_members, k)
                else:
                    a, b = ring.owner_of(key_pos[k]), new_ring.owner_of(key_pos[k])
                moved += a != b
                must += (b == member) if scenario == "join" else (a == member)
            movement[(scenario, member, scheme)] = (moved, must)
    assert n == len(members)
    return {"members": members, "per_node": per_node, "movement": movement, "keys": len(keys)}


# -- one input for every job ---------------------------------------------------------------------------


def make_snapshots_for_every_job(root: Path, t0: int = 1_700_000_000_000) -> Path:
    """Two snapshots per node, a minute apart, holding instances (with missing, extra and different
    copies), clients and change events (the newer log overlaps the older one): input every job can
    read, for runs that compare one job's results across masters. Returns the input directory."""
    instances = make_consistency_snapshots(root / "scratch-consistency")
    clients = make_balance_snapshots(root / "scratch-balance")["clients"]
    for i, node in enumerate(NODES):
        events = make_events(i + 1, 150, t0)
        for k, (ts, log) in enumerate(((t0 + 60_000, events[:100]), (t0 + 120_000, events[50:]))):
            rows = instances[node] if k else instances[node][: len(instances[node]) * 2 // 3]
            write_snapshot(root / "in", node, ts + i, instances=rows, clients=clients[node], events=log)
    return root / "in"
