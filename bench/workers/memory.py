"""Resident memory per registered instance of one real single-process node: the input of the
workers model's memory figures (``shoal simulate workers``, docs/workers-model.md).

A worker of a ``--workers N`` node holds a full replica of the cluster's registry, so its memory
is this node's idle RSS plus (instances in the cluster) × (bytes per instance).

1. Starts one ``shoal server`` (open, log level warning) on free 127.0.0.1 ports, with the beat
   checker and the ip:port client expiry off (``shoal.naming.health-check-enabled=false``,
   ``nacos.naming.expireInstance=false``, a long ``nacos.naming.client.expired.time``) so no
   instance expires while the rest are registered, and reads its VmRSS once idle.
2. Registers ``--instances`` instances over the HTTP Open API (``POST /nacos/v1/ns/instance``,
   the 1.x SDK's parameters and 2 metadata keys, ``bench/load/http_load.py``'s requests and
   pipelined keep-alive client), one ip:port client per instance, spread over ``--services``
   services, in ``--steps`` equal steps; after each step, once the node's ``shoal_instances``
   gauge reads the count, reads VmRSS again.
3. Reports RSS at every step, bytes per instance as (RSS at the end − RSS idle) / instances and
   as the least-squares slope over the steps, the load average, and saves the JSON under
   ``bench/results/`` (ignored by git) unless ``--out`` names another file.

    .venv/bin/python -m bench.workers.memory                       # 100,000 instances in 4 steps
    .venv/bin/python -m bench.workers.memory --instances 20000 --steps 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.load import http_load
from shoal.testing import OPEN, ServerProcess, ServerSet, free_port_block, poll_until

RESULTS = Path(__file__).resolve().parents[1] / "results"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _rss(status: dict[str, int]) -> int:
    return int(status.get("VmRSS", 0))


def wait_for_count(node: ServerProcess, count: int) -> None:
    poll_until(lambda: node.try_gauge("instances") == count, 60, 0.2, f"the instances gauge to read {count}")


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    extra = ["--log-level", "warning",
             "-D", "shoal.naming.health-check-enabled=false",
             "-D", "nacos.naming.expireInstance=false",
             "-D", "nacos.naming.client.expired.time=86400000"]
    with ServerSet(root, auth=OPEN) as servers:
        node = servers.start(free_port_block(), extra)
        node.wait_ready(60)
        # idle: let the start's allocations settle (two equal readings 0.5 s apart, bounded)
        readings = [_rss(node.proc_status())]

        def settled() -> bool:
            readings.append(_rss(node.proc_status()))
            return abs(readings[-1] - readings[-2]) < 256 * 1024

        with contextlib.suppress(TimeoutError):
            poll_until(settled, 15, 0.5, "the idle node's RSS to settle")
        idle = readings[-1]
        log(f"node {node.addr} idle: RSS {idle / 2**20:.1f} MiB")
        steps: list[dict[str, Any]] = [{"instances": 0, "rss_bytes": idle}]
        host_header = f"127.0.0.1:{node.port}"
        cpu0 = node.cpu_s() or 0.0
        t0 = time.monotonic()
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            for step in range(1, args.steps + 1):
                lo = (step - 1) * args.instances // args.steps
                hi = step * args.instances // args.steps
                jobs = [("register", "127.0.0.1", node.port, list(range(lo + w, hi, args.workers)), args.instances,
                         args.services, args.connections, args.window, host_header, http_load.CHECKS["register"])
                        for w in range(args.workers)]
                results = pool.map(http_load._worker, jobs)
                failed = sum(r["failed"] for r in results)
                if failed:
                    raise RuntimeError(f"{failed} registrations failed in step {step}")
                wait_for_count(node, hi)
                rss = _rss(node.proc_status())
                steps.append({"instances": hi, "rss_bytes": rss})
                log(f"{hi:,} instances: RSS {rss / 2**20:.1f} MiB")
        load_s = time.monotonic() - t0
        cpu_s = (node.cpu_s() or cpu0) - cpu0
        clients = node.gauge("clients")
        status = node.proc_status()
        node.check_alive()
    n = args.instances
    xs = [s["instances"] for s in steps]
    ys = [s["rss_bytes"] for s in steps]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {
        "instances": n,
        "services": args.services,
        "clients_gauge": clients,
        "idle_rss_bytes": idle,
        "loaded_rss_bytes": ys[-1],
        "peak_rss_bytes": int(status.get("VmHWM", 0)),
        "bytes_per_instance": round((ys[-1] - idle) / n, 1),
        "bytes_per_instance_slope": round(slope, 1),
        "steps": steps,
        "register_s": round(load_s, 2),
        "register_server_cpu_s": round(cpu_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=100_000, help="instances registered (default 100000)")
    p.add_argument("--services", type=int, default=1_000, help="services they are spread over (default 1000)")
    p.add_argument("--steps", type=int, default=4, help="RSS readings along the way (default 4)")
    p.add_argument("--workers", type=int, default=1, help="generator processes (default 1: 2-core box)")
    p.add_argument("--connections", type=int, default=8, help="keep-alive connections per generator (default 8)")
    p.add_argument("--window", type=int, default=16, help="pipelined requests per connection (default 16)")
    p.add_argument("--out", help="write the JSON here (default bench/results/workers_memory.json)")
    args = p.parse_args(argv)
    if not (1 <= args.steps <= 20 and 1_000 <= args.instances <= 2_000_000 and 1 <= args.services <= args.instances
            and 1 <= args.workers <= 8 and args.connections >= 1 and args.window >= 1):
        p.error("--steps 1..20, --instances 1000..2000000, --services 1..instances, --workers 1..8, "
                "--connections and --window >= 1")
    report: dict[str, Any] = {"benchmark": "workers-memory", "cpus": os.cpu_count(),
                              "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="shoal-workers-memory-") as tmp:
        report["result"] = measure(args, Path(tmp))
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    out = Path(args.out) if args.out else RESULTS / "workers_memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    log(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
