"""Build the workers model's inputs (``src/shoal/analytics/workers_inputs.json``) from three bench runs.

The model (``shoal simulate workers``, :mod:`shoal.analytics.workers_model`) reads per-operation
server CPU costs and memory figures; each comes from a real node on this machine:

* ``query_us`` and ``register_us``: ``bench/load/run.py --generator native --phases
  register,query,deregister --repeat 3`` (one standalone node, the C generator), 10⁶ / the
  median ``ops_per_server_cpu_s`` of the phase;
* ``sync_send_us`` and ``sync_apply_us``: ``python -m bench.distro.sync_throughput --transports
  native`` (three nodes, a load on A, the standalone baseline of the same load). Send, per record
  and peer: (A's CPU − the standalone CPU per op × A's ops) / the records A's peers received.
  Apply: each peer's CPU per record received (the mean of B and C). The median over the rounds
  of every report given;
* ``idle_rss_bytes``, ``bytes_per_instance``: ``python -m bench.workers.memory`` (one node,
  100,000 ip:port instances over the HTTP API), the idle RSS and the slope over the steps.

    .venv/bin/python -m bench.workers.inputs --load L.json --sync S.json [S2.json ...] --memory M.json [--out FILE]

Prints the document and writes it to ``--out`` (default: the file the model ships with).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from shoal.analytics.workers_model import DEFAULT_INPUTS, Inputs


def _phase(load: dict[str, Any], name: str) -> float:
    phase = load["phases"]["rates"][name]
    value = phase.get("median_ops_per_server_cpu_s", phase.get("ops_per_server_cpu_s"))
    if not value:
        raise ValueError(f"the load report has no ops_per_server_cpu_s for {name}")
    return float(value)


def sync_costs(syncs: list[dict[str, Any]]) -> tuple[float, float, list[dict[str, float]]]:
    """(send µs per record and peer, apply µs per record, the per-round figures) of the rounds of
    one or more sync_throughput reports."""
    rounds = []
    for r in (r for sync in syncs for r in sync["rounds"]["native"]):
        peers = r["peers"].values()
        records = sum(p["records_total"] for p in peers)
        baseline = r["standalone"]["cpu_us_per_op"]
        send = (r["a_cpu_s"] * 1e6 - baseline * r["a_ops_acked"]) / records
        apply = statistics.mean(p["cpu_us_per_record_received"] for p in peers)
        rounds.append({"send_us": round(send, 1), "apply_us": round(apply, 1),
                       "records_per_batch": statistics.mean(p["records_per_batch_mean"] for p in peers),
                       "ops_per_record": r["a_ops_acked"] * len(peers) / records,
                       "loadavg_1m": r["loadavg"][0]})
    return (statistics.median(x["send_us"] for x in rounds), statistics.median(x["apply_us"] for x in rounds), rounds)


def build(load: dict[str, Any], syncs: list[dict[str, Any]], memory: dict[str, Any], names: dict[str, str]
          ) -> dict[str, Any]:
    q, r = _phase(load, "query"), _phase(load, "register")
    send, apply, rounds = sync_costs(syncs)
    mem = memory["result"]
    load_la = f"load average {load['host'].get('loadavg_at_start')} -> {load['host'].get('loadavg_at_end')}"
    sync_la = "load average " + ", ".join(f"{s['host']['loadavg_at_start']} -> {s['host']['loadavg_at_end']}"
                                          for s in syncs)
    mem_la = f"load average {memory['loadavg_at_start']} -> {memory['loadavg_at_end']}"
    per_round = "; ".join(f"{x['send_us']}/{x['apply_us']} µs at {x['records_per_batch']:.0f} records/batch, "
                          f"{x['ops_per_record']:.1f} ops/record" for x in rounds)
    doc = {
        "about": "Measured inputs of shoal simulate workers (docs/workers-model.md). Rebuild with "
                 "python -m bench.workers.inputs; every value names its run.",
        "cpus": syncs[0]["host"].get("cpus"),
        "measured_instances": mem["instances"],
        "inputs": {
            "query_us": {"value": round(1e6 / q, 1), "source":
                         f"{names['load']}: 1e6 / median query ops per server CPU-s {q:,.0f} (native generator, "
                         f"standalone node; {load_la})"},
            "register_us": {"value": round(1e6 / r, 1), "source":
                            f"{names['load']}: 1e6 / median register ops per server CPU-s {r:,.0f} (native "
                            f"generator, standalone node; {load_la})"},
            "sync_send_us": {"value": round(send, 1), "source":
                             f"{names['sync']}: median over {len(rounds)} rounds of (A CPU - standalone CPU/op x "
                             f"ops) / records received by B and C (send/apply per round: {per_round}; {sync_la})"},
            "sync_apply_us": {"value": round(apply, 1), "source":
                              f"{names['sync']}: median over {len(rounds)} rounds of B's and C's CPU per record "
                              f"received ({sync_la})"},
            "idle_rss_bytes": {"value": mem["idle_rss_bytes"], "source":
                               f"{names['memory']}: VmRSS of an idle single-process node ({mem_la})"},
            "bytes_per_instance": {"value": mem["bytes_per_instance_slope"], "source":
                                   f"{names['memory']}: VmRSS slope over {len(mem['steps']) - 1} steps to "
                                   f"{mem['instances']:,} ip:port instances (one client each) over "
                                   f"{mem['services']:,} services ({mem_la})"},
        },
    }
    Inputs.load_doc(doc)  # refuses a document the model cannot read
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", type=Path, required=True, help="bench/load/run.py --generator native JSON")
    p.add_argument("--sync", type=Path, nargs="+", required=True,
                   help="bench.distro.sync_throughput --transports native JSON (several: their rounds pooled)")
    p.add_argument("--memory", type=Path, required=True, help="bench.workers.memory JSON")
    p.add_argument("--label", default=None, help="appended to each run's name in the sources, e.g. ' (2026-11-27)'")
    p.add_argument("--out", type=Path, default=DEFAULT_INPUTS, help=f"where to write (default {DEFAULT_INPUTS})")
    args = p.parse_args(argv)
    docs = {k: json.loads(getattr(args, k).read_text()) for k in ("load", "memory")}
    syncs = [json.loads(path.read_text()) for path in args.sync]
    label = args.label or ""
    names = {"load": f"bench/load/run.py{label}", "sync": f"bench.distro.sync_throughput{label}",
             "memory": f"bench.workers.memory{label}"}
    doc = build(docs["load"], syncs, docs["memory"], names)
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    print(text)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
