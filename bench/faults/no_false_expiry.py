"""No false expiry under load (issue 22): a 3-node cluster at the highest write rate this box
sustains, for ``--minutes``, never removes an instance whose client is alive and renewing.

Load, all at once on one asyncio loop:

* ``--http`` ip:port instances that beat every 5 s (Nacos's default interval and timeouts) through
  the nodes in turn; a beat answered 20404 (the node had dropped it) is counted and re-registers;
* ``--sdk`` real nacos-sdk-python 3.x clients, each owning one instance over its gRPC connection;
* ``--writers`` closed-loop writers registering and deregistering short-lived instances as fast
  as the nodes answer (the write rate is what they reach).

An observer polls every node's list of the live services every second: a live instance missing from
any node is a false expiry. The nodes' own logs are counted too (``[AUTO-DELETE-IP]`` and
``[IP-DISABLED]`` lines about a live service, synced clients expired, tracebacks), so an expiry the
observer's polls missed is still seen. Exit code 1 when anything live was removed.

    PYTHONPATH=src .venv/bin/python -m bench.faults.no_false_expiry --minutes 10 --json no_false_expiry.json

On a shared box, run it alone (it starts three nodes and loads them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.faults.load import (
    Churn,
    HttpInstances,
    Observer,
    SdkInstances,
    expirations,
    quiet_client_noise,
    three_nodes,
)
from shoal.testing import FaultCluster
from shoal.testing.faults import rss_kb

HTTP_SVC, SDK_SVC = "live-http", "live-grpc"


async def drive(cluster: FaultCluster, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    noise: dict[str, int] = {}
    quiet_client_noise(asyncio.get_running_loop(), noise)
    connector = aiohttp.TCPConnector(limit=max(64, args.writers * 2))
    async with aiohttp.ClientSession(connector=connector) as session:
        stop = asyncio.Event()
        http = HttpInstances(cluster, session, HTTP_SVC, args.http)
        sdk = SdkInstances(cluster, SDK_SVC, args.sdk, tmp)
        churn = Churn(cluster, session, args.writers)
        await sdk.start()
        beats = http.tasks(stop)
        deadline = time.monotonic() + 30
        while len(http.live) < args.http and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        observer = Observer(cluster, session, {HTTP_SVC: http, SDK_SVC: sdk})
        t0 = time.monotonic()
        writers = churn.tasks(stop)
        watching = asyncio.create_task(observer.run(stop, t0))
        rss: list[dict[str, Any]] = []
        end = t0 + args.minutes * 60
        while time.monotonic() < end:
            rss.append({"t_s": round(time.monotonic() - t0, 1),
                        **{str(i): rss_kb(cluster.nodes[i].pid) // 1024 for i in sorted(cluster.nodes)}})
            await asyncio.sleep(min(10.0, max(0.0, end - time.monotonic())))
        seconds = time.monotonic() - t0
        stop.set()
        await asyncio.gather(*beats, *writers, watching, return_exceptions=True)
        await sdk.close()
    return {"seconds": round(seconds, 1), "live_http": len(http.live), "live_sdk": len(sdk.live),
            "writes": churn.stats.summary(seconds), "beats": http.stats.summary(seconds),
            "observer": {"polls": observer.polls, "errors": observer.errors,
                         "missing_polls": len(observer.missing), "missing": observer.missing[:50]},
            "rss_mb": rss, "client_loop_errors": noise.get("client_loop_errors", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--http", type=int, default=300, help="live ip:port instances beating every 5 s")
    parser.add_argument("--sdk", type=int, default=30, help="live nacos-sdk-python gRPC clients")
    parser.add_argument("--writers", type=int, default=16, help="closed-loop register/deregister writers")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with three_nodes("shoal-no-false-expiry-") as (cluster, tmp):
        report = asyncio.run(drive(cluster, args, tmp))
        report["expirations"] = expirations(cluster, [HTTP_SVC, SDK_SVC])
    falsely = (report["observer"]["missing_polls"] + len(report["expirations"]["false"])
               + report["beats"]["reregistered"])
    tracebacks = sum(n["tracebacks"] for n in report["expirations"]["per_node"].values())
    report["verdict"] = {"false_expiries": falsely, "tracebacks": tracebacks, "ok": falsely == 0 and tracebacks == 0}
    w, b = report["writes"], report["beats"]
    print(f"{report['seconds']:.0f} s, 3 nodes: writes {w['per_s']}/s (p50 {w['p50_ms']} ms, p99 {w['p99_ms']} ms, "
          f"{w['errors']} errors), beats {b['per_s']}/s ({b['errors']} errors, {b['reregistered']} answered 20404)")
    print(f"live: {report['live_http']} HTTP + {report['live_sdk']} gRPC; observer {report['observer']['polls']} "
          f"polls, {report['observer']['missing_polls']} with a live instance missing")
    for i, counts in report["expirations"]["per_node"].items():
        print(f"node {i}: {counts}")
    print("false expiries:", falsely, "| tracebacks:", tracebacks)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["verdict"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
