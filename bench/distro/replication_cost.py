"""Where a write's replication CPU goes, per stage, on real code in one process (issue 21).

Two Distro members of a :class:`shoal.testing.SimCluster` (real ``ModelStack`` and
``DistroProtocol`` each, in-memory network, manual clock). Member A plays the worker that takes
the writes; B its sibling. The load is ``bench/load/scaling.py``'s shape: ``--connections``
connection clients, each registering one instance into every one of ``--services`` services in
turn, ``--ops-per-record`` registrations per client per sync delay (so a client's record grows
to ``--services`` publications, as in the real run). Each tick, A's due clients are taken from
its sync queue to B and each stage is run and timed by hand on the real functions:

* ``handle``: A's ``register_instance`` (the local write and its model events);
* ``build``: the sync engine's build callback (``DistroProtocol._record_of``) per due client;
* ``encode``: ``records.encode`` of the batch;
* ``decode``: ``records.split`` on B (what its sync receiver does; the changed services are decoded in ``apply``);
* ``apply``: B's ``_apply_sync`` (the processor's apply, the model's events, the digests).

Then the same for deregistration. The peer transport is left out (``bench.distro.peer_client``
measures it). Prints per-op µs per stage (median of ``--repeat`` rounds) as JSON on stdout::

    .venv/bin/python -m bench.distro.replication_cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from shoal.distro import records
from shoal.kernels import implementation
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import SimCluster

STAGES = ("handle", "build", "encode", "decode", "apply")
#: the metadata of bench/load's instances (bench/load/worker.py INSTANCE_METADATA)
METADATA = {"version": "1.4.2", "zone": "zone-a", "protocol": "http", "preserved.register.source": "SPRING_CLOUD"}


def _round(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    engine = a.distro.engine
    target = b.address
    services = [ServiceKey("public", "DEFAULT_GROUP", f"svc-{k}") for k in range(args.services)]
    conns = [f"conn-{g}" for g in range(args.connections)]
    for cid in conns:
        a.connect(cid)
    out: dict[str, dict[str, float]] = {}
    for phase in ("register", "deregister"):
        spent = dict.fromkeys(STAGES, 0.0)
        ops = records_sent = batches = 0
        for start in range(0, args.services, args.ops_per_record):
            t0 = time.perf_counter()
            for g, cid in enumerate(conns):
                for j in range(start, min(start + args.ops_per_record, args.services)):
                    service = services[(g * args.services + j) % args.services]
                    if phase == "register":
                        a.naming.ephemeral.register_instance(cid, service, InstanceInfo(
                            f"10.{g // 250}.{g % 250}.1", 8080, metadata=dict(METADATA)))
                    else:
                        a.naming.ephemeral.deregister_instance(cid, service)
                    ops += 1
            t1 = time.perf_counter()
            spent["handle"] += t1 - t0
            queue = engine.queues[target]
            due = list(queue.pending)
            queue.pending.clear()
            for first in range(0, len(due), args.batch_max):
                t0 = time.perf_counter()
                batch = [r for r in (engine.build(cid, op) for cid, op in
                                     ((c, records.OP_CHANGE) for c in due[first:first + args.batch_max]))
                         if r is not None]
                t1 = time.perf_counter()
                body = records.encode(batch)
                t2 = time.perf_counter()
                decoded = records.split(body)
                t3 = time.perf_counter()
                b.distro._apply_sync(a.address, decoded)
                t4 = time.perf_counter()
                spent["build"] += t1 - t0
                spent["encode"] += t2 - t1
                spent["decode"] += t3 - t2
                spent["apply"] += t4 - t3
                records_sent += len(batch)
                batches += 1
        out[phase] = {**{f"{k}_us_per_op": v / ops * 1e6 for k, v in spent.items()},
                      "ops": ops, "records": records_sent, "ops_per_record": ops / max(records_sent, 1),
                      "records_per_batch": records_sent / max(batches, 1)}
        expect = args.connections if phase == "register" else 0
        held = sum(len(s) for s in (b.storage.view(k).instances for k in services))
        assert held == expect * args.services, (phase, held)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=50, help="connection clients on A (default 50)")
    p.add_argument("--services", type=int, default=100, help="services each client registers into (default 100)")
    p.add_argument("--ops-per-record", type=int, default=5,
                   help="registrations per client per sync delay (default 5)")
    p.add_argument("--batch-max", type=int, default=1000, help="records per batch at most (default 1000)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; medians reported (default 3)")
    args = p.parse_args(argv)
    rounds = [_round(args) for _ in range(args.repeat)]
    report: dict[str, Any] = {"kernels": implementation(), "args": vars(args), "phases": {}}
    for phase in ("register", "deregister"):
        keys = rounds[0][phase].keys()
        report["phases"][phase] = {k: round(statistics.median(r[phase][k] for r in rounds), 2) for k in keys}
        row = report["phases"][phase]
        row["replication_us_per_op"] = round(sum(row[f"{s}_us_per_op"] for s in STAGES[1:]), 2)
    for phase, row in report["phases"].items():
        print(f"{phase:10} " + " ".join(f"{s} {row[f'{s}_us_per_op']:6.2f}" for s in STAGES)
              + f" | replication {row['replication_us_per_op']:6.2f} µs/op, {row['ops_per_record']:.1f} ops/record",
              file=sys.stderr)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
