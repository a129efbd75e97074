"""Time (and optionally cProfile) the in-process request path per request type.

    PYTHONPATH=src:. python bench/requests/profile_path.py [--n 20000] [--profile register|query|...]

Prints µs per request for each type (best of ``--repeat`` runs); with ``--profile TYPE`` also the
cProfile of that type's run, sorted by own time. A quiet box gives stable figures; on a loaded one
compare runs taken back to back.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

from bench.requests.path import (
    RequestPath,
    deregister_body,
    ips,
    populate,
    query_body,
    register_body,
    subscribe_body,
)

SERVICES = 10
HOSTS = 100


def workloads(path: RequestPath, n: int) -> dict[str, Callable[[], None]]:
    """One callable per request type doing ``n`` requests (the state is left as it found it)."""
    for s in range(SERVICES):
        populate(path, f"q{s}", HOSTS)
    peers = [path.connect() for _ in range(100)]
    addrs = list(ips(len(peers)))
    query = [path.request("ServiceQueryRequest", query_body(f"q{i % SERVICES}")) for i in range(64)]
    reg = [path.request("InstanceRequest", register_body(f"r{i % 50}", addrs[i % len(peers)])) for i in range(500)]
    dereg = [path.request("InstanceRequest", deregister_body(f"r{i % 50}", addrs[i % len(peers)]))
             for i in range(500)]
    health = path.request("HealthCheckRequest", {"headers": {}, "module": "internal"})
    sub = path.request("SubscribeServiceRequest", subscribe_body("q0"))
    call = path.call

    def do_query() -> None:
        for i in range(n):
            call(query[i & 63], peers[i % 100])

    def do_register() -> None:  # 100 connections × 50 services: register then deregister, half each
        half = n // 2
        for i in range(half):
            j = i % 500
            call(reg[j], peers[j % 100])
            call(dereg[j], peers[j % 100])

    def do_health() -> None:
        for i in range(n):
            call(health, peers[i % 100])

    def do_subscribe() -> None:
        for i in range(n):
            call(sub, peers[i % 100])

    return {"query": do_query, "register+deregister": do_register, "health": do_health,
            "subscribe": do_subscribe}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", default="")
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args()
    path = RequestPath()
    try:
        runs = workloads(path, args.n)
        for name, fn in runs.items():
            fn()  # warm
            best = min(_timed(fn) for _ in range(args.repeat))
            print(f"{name:22s} {best / args.n * 1e6:8.2f} µs/request  ({args.n / best:9.0f} per CPU-s)")
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(runs[args.profile])
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    finally:
        path.close()


def _timed(fn: Callable[[], None]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


if __name__ == "__main__":
    main()
