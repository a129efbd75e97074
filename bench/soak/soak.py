"""The soak (issue 22): 3 real nodes, hours of mixed load compressed into ``--minutes``, with a
fault every ``--fault-every`` seconds, always cleaned up.

Load (one asyncio loop, real clients):

* live clients that must never be lost: ``--http`` ip:port instances beating every 5 s and
  ``--sdk`` nacos-sdk-python 3.x gRPC clients owning one instance each;
* connection churn: ``--churners`` loops that open a real SDK client on some node, register one
  instance or a batch of three (``batch_register_instances``), keep it a few seconds and shut it
  down (its instances must then disappear everywhere: those left over are ghosts);
* ``--writers`` closed-loop HTTP register/deregister writers;
* subscribers (SDK ``subscribe`` on the live and churned services) and console reads
  (``catalog/services``, ``catalog/instances``) on every node.

Faults, in turn, each on the next node: ``kill9`` (SIGKILL, restarted after 5 s), ``sigstop``
(SIGSTOP for ``--pause`` s, then SIGCONT), ``partition`` (iptables blackhole of the node's address
for ``--pause`` s, healed; skipped and reported where iptables is unavailable) and ``garbage``
(random bytes to its HTTP, gRPC and cluster ports for ``--pause`` s). After each fault the nodes
are polled for up to ``--window`` s until every live instance is listed everywhere and no ghost is:
the time that took, and the lost instances and ghosts left at the window's end, are reported.

Report (``--json`` and a printed table): RSS per node over time and its growth over the last half
(flat: ≤ 10 %), lost instances, ghosts after each fault's window, tracebacks in the node logs, push
p99 over time (from the nodes' ``shoal_push_latency_seconds`` histograms). Exit code 1 when a goal
is missed.

    PYTHONPATH=src .venv/bin/python -m bench.soak.soak --minutes 20 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.faults.load import (
    Churn,
    HttpInstances,
    SdkInstances,
    expirations,
    listed,
    percentile,
    quiet_client_noise,
    three_nodes,
)
from shoal.testing import FaultCluster, metric_values
from shoal.testing.faults import Partition, PartitionUnavailable, freeze, kill9, rss_kb, thaw, tracebacks

HTTP_SVC, SDK_SVC, CONN_SVC, BATCH_SVC = "soak-http", "soak-grpc", "soak-conn", "soak-batch"
FAULTS = ("kill9", "sigstop", "partition", "garbage")
PUSH_METRIC = "shoal_push_latency_seconds_bucket"


class Soak:
    def __init__(self, cluster: FaultCluster, args: argparse.Namespace, tmp: Path) -> None:
        self.cluster, self.args, self.tmp = cluster, args, tmp
        self.t0 = time.monotonic()
        self.stop = asyncio.Event()
        self.open: set[tuple[str, int]] = set()  #: instances of churn clients still open
        self.closed: dict[tuple[str, int], float] = {}  #: instance → when its client shut down
        self.churned = 0
        self.churn_errors = 0
        self.churn_error_kinds: dict[str, int] = {}
        self.pushes = 0
        self.console_reads = 0
        self.console_errors = 0
        self.timeline: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.current_fault = ""
        self.push_prev: dict[int, dict[float, float]] = {}
        self.partition: Partition | None = None
        self.partition_note = ""
        self.noise: dict[str, int] = {}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    @property
    def up(self) -> list[int]:
        return self.http.up

    def set_up(self, up: list[int]) -> None:
        for part in (self.http, self.writes):
            part.up = up

    # --- load --------------------------------------------------------------------------------
    async def churner(self, c: int) -> None:
        from v2.nacos import BatchRegisterInstanceParam, RegisterInstanceParam

        n = 0
        rnd = random.Random(c)
        while not self.stop.is_set():
            n += 1
            base = c * 15_000 + n % 15_000  # each churner its own addresses
            batch = n % 3 == 0
            mine = [(f"10.80.{base // 250}.{base % 250 + 1}", 9200 + k) for k in range(3 if batch else 1)]
            client = None
            try:
                client = await asyncio.wait_for(self.sdk.client(c + n), 20)
                if batch:
                    ok = await client.batch_register_instances(BatchRegisterInstanceParam(
                        service_name=BATCH_SVC,
                        instances=[RegisterInstanceParam(service_name=BATCH_SVC, ip=ip, port=port)
                                   for ip, port in mine]))
                else:
                    ok = await client.register_instance(RegisterInstanceParam(service_name=CONN_SVC, ip=mine[0][0],
                                                                              port=mine[0][1]))
                if ok:
                    self.open.update(mine)
                    self.churned += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), rnd.uniform(2, 10))
            except Exception:
                self.churn_errors += 1
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.shutdown(), 10)
                closed_at = time.monotonic()
                for key in mine:
                    if key in self.open:
                        self.open.discard(key)
                        self.closed[key] = closed_at

    async def subscribers(self) -> list[Any]:
        from v2.nacos import SubscribeServiceParam

        async def count(_instances: list[Any]) -> None:
            self.pushes += 1

        made = []
        for n, service in enumerate((HTTP_SVC, SDK_SVC, CONN_SVC, BATCH_SVC)):
            client = await self.sdk.client(n)
            await client.subscribe(SubscribeServiceParam(service_name=service, subscribe_callback=count))
            made.append(client)
        return made

    async def console(self, session: aiohttp.ClientSession) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            up = self.up
            node = up[n % len(up)]
            for path, params in (("/nacos/v1/ns/catalog/services", {"pageNo": 1, "pageSize": 50}),
                                 ("/nacos/v1/ns/catalog/instances", {"serviceName": BATCH_SVC, "pageNo": 1,
                                                                     "pageSize": 100})):
                try:
                    async with session.get(self.cluster.nodes[node].url(path), params=params,
                                           timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        await resp.read()
                        self.console_reads += 1
                        self.console_errors += resp.status != 200
                except (TimeoutError, aiohttp.ClientError):
                    self.console_errors += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 1.0)

    # --- views -------------------------------------------------------------------------------
    async def listed(self, session: aiohttp.ClientSession, i: int, service: str) -> set[tuple[str, int]] | None:
        return await listed(session, self.cluster.nodes[i].url("/nacos/v1/ns/instance/list"), service)

    async def check(self, session: aiohttp.ClientSession, since: float) -> tuple[int, int, dict[str, Any]]:
        """(lost, ghosts, detail) over every node: live instances missing, and instances of
        clients that shut down before ``since`` still listed."""
        lost, ghosts, detail = 0, 0, {}
        for i in sorted(self.cluster.nodes):
            missing: set[tuple[str, int]] = set()
            for service, live in ((HTTP_SVC, self.http.live), (SDK_SVC, self.sdk.live)):
                seen = await self.listed(session, i, service)
                missing |= set(live) - (seen or set())
            extra: set[tuple[str, int]] = set()
            for service in (CONN_SVC, BATCH_SVC):
                seen = await self.listed(session, i, service) or set()
                extra |= {k for k in seen if k not in self.open and self.closed.get(k, since) < since}
            lost += len(missing)
            ghosts += len(extra)
            if missing or extra:
                detail[str(i)] = {"lost": sorted(f"{a}:{p}" for a, p in missing)[:5],
                                  "ghosts": sorted(f"{a}:{p}" for a, p in extra)[:5]}
        return lost, ghosts, detail

    # --- samples -----------------------------------------------------------------------------
    async def push_p99(self, session: aiohttp.ClientSession) -> float | None:
        """p99 of the pushes acknowledged since the last sample (upper bound of the bucket), over all nodes."""
        delta: dict[float, float] = {}
        for i in sorted(self.cluster.nodes):
            try:
                async with session.get(self.cluster.nodes[i].url("/nacos/actuator/prometheus"),
                                       timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    text = await resp.text()
            except (TimeoutError, aiohttp.ClientError):
                continue
            now: dict[float, float] = {}
            for labels, value in metric_values(text, PUSH_METRIC):
                le = float(labels.get("le", "inf").replace("+Inf", "inf"))
                now[le] = now.get(le, 0.0) + value
            prev = self.push_prev.get(i, {})
            reset = sum(now.values()) < sum(prev.values())  # restarted: counters from zero
            for le, value in now.items():
                delta[le] = delta.get(le, 0.0) + (value if reset else value - prev.get(le, 0.0))
            self.push_prev[i] = now
        if not delta:
            return None
        bounds = sorted(delta)
        total = delta[bounds[-1]]
        if total <= 0:
            return None
        for le in bounds:
            if delta[le] >= 0.99 * total:
                return le * 1000
        return None

    async def sampler(self, session: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            row: dict[str, Any] = {"t_s": self.now(), "fault": self.current_fault,
                                   "push_p99_ms": await self.push_p99(session)}
            for i in sorted(self.cluster.nodes):
                server = self.cluster.nodes[i]
                row[f"rss_mb_{i}"] = round(rss_kb(server.pid) / 1024, 1) if server.alive() else 0.0
                row[f"pid_{i}"] = server.pid
            self.timeline.append(row)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.args.sample)

    # --- faults ------------------------------------------------------------------------------
    async def garbage(self, i: int, seconds: float) -> int:
        server = self.cluster.nodes[i]
        host = self.cluster.hosts[i]
        ports = [server.port, server.port + 1000, server.port + 1001]
        sent = 0
        end = time.monotonic() + seconds
        rnd = random.Random(i)
        while time.monotonic() < end:
            port = ports[sent % len(ports)]
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
                size = rnd.choice((64, 4096, 65536, 1 << 20))
                writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(size) if sent % 2 else os.urandom(size))
                with contextlib.suppress(OSError, asyncio.TimeoutError):
                    await asyncio.wait_for(writer.drain(), 2)
                writer.close()
            sent += 1
            await asyncio.sleep(0.02)
        return sent

    async def fault(self, kind: str, i: int, session: aiohttp.ClientSession) -> dict[str, Any]:
        server = self.cluster.nodes[i]
        record: dict[str, Any] = {"kind": kind, "node": i, "t_s": self.now()}
        others = [n for n in sorted(self.cluster.nodes) if n != i]
        self.current_fault = f"{kind}@{i}"
        if kind == "partition" and self.partition is None:
            record["skipped"] = self.partition_note
            self.current_fault = ""
            return record
        self.set_up(others)
        try:
            if kind == "kill9":
                kill9(server)
                await asyncio.sleep(5)  # the node is down this long (the fault's point)
                await asyncio.to_thread(self.cluster.start, i)
            elif kind == "sigstop":
                freeze(server)
                try:
                    await asyncio.sleep(self.args.pause)
                finally:
                    thaw(server)
            elif kind == "partition":
                assert self.partition is not None
                self.partition.blackhole(self.cluster.hosts[i], self.cluster.ports_of(i))
                try:
                    await asyncio.sleep(self.args.pause)
                finally:
                    self.partition.heal()
            elif kind == "garbage":
                record["garbage_connections"] = await self.garbage(i, self.args.pause)
        finally:
            self.set_up(sorted(self.cluster.nodes))
            self.current_fault = f"{kind}@{i} (window)"
        ended = time.monotonic()
        record["agreed_after_s"] = None
        lost = ghosts = -1
        detail: dict[str, Any] = {}
        while time.monotonic() - ended < self.args.window:
            lost, ghosts, detail = await self.check(session, ended)
            # apart as well: ghosts are the registry's to clear; a live SDK instance that is missing
            # may be waiting for its client's redo (nacos-sdk-python re-registers on a 30 s timer)
            since = round(time.monotonic() - ended, 1)
            if ghosts == 0:
                record.setdefault("no_ghosts_after_s", since)
            if lost == 0:
                record.setdefault("none_lost_after_s", since)
            if lost == 0 and ghosts == 0:
                record["agreed_after_s"] = since
                break
            await asyncio.sleep(1.0)
        record.update(lost=lost, ghosts=ghosts)
        if detail:
            record["detail"] = detail
        self.current_fault = ""
        return record

    async def faulter(self, session: aiohttp.ClientSession) -> None:
        n = 0
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.args.fault_every)
            if self.stop.is_set() or time.monotonic() - self.t0 > self.args.minutes * 60 - self.args.window:
                return
            kind = FAULTS[n % len(FAULTS)]
            record = await self.fault(kind, n % len(self.cluster.nodes), session)
            self.faults.append(record)
            skipped = f" ({record['skipped']})" if "skipped" in record else ""
            print(f"[{record['t_s']:7.1f} s] {kind} node {record['node']}: agreed after "
                  f"{record.get('agreed_after_s')} s, lost {record.get('lost')}, "
                  f"ghosts {record.get('ghosts')}{skipped}",
                  flush=True)
            n += 1

    async def run(self) -> dict[str, Any]:
        args = self.args
        try:
            self.partition = Partition().open()
        except PartitionUnavailable as exc:
            self.partition_note = str(exc)
        quiet_client_noise(asyncio.get_running_loop(), self.noise)
        connector = aiohttp.TCPConnector(limit=128)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                self.http = HttpInstances(self.cluster, session, HTTP_SVC, args.http)
                self.sdk = SdkInstances(self.cluster, SDK_SVC, args.sdk, self.tmp)
                self.writes = Churn(self.cluster, session, args.writers, prefix="soak-write")
                await self.sdk.start()
                subscribers = await self.subscribers()
                self.t0 = time.monotonic()
                tasks = [*self.http.tasks(self.stop), *self.writes.tasks(self.stop),
                         *[asyncio.create_task(self.churner(c)) for c in range(args.churners)],
                         asyncio.create_task(self.console(session)), asyncio.create_task(self.sampler(session))]
                faulter = asyncio.create_task(self.faulter(session))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(faulter), args.minutes * 60)
                await faulter  # a fault under way ends with its window
                final = await self.check(session, time.monotonic() - 5)
                self.stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                for client in subscribers:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.shutdown(), 10)
                await self.sdk.close()
                seconds = time.monotonic() - self.t0
        finally:
            if self.partition is not None:
                self.partition.close()
        return {"seconds": round(seconds, 1), "final": {"lost": final[0], "ghosts": final[1], "detail": final[2]},
                "load": {"writes": self.writes.stats.summary(seconds), "beats": self.http.stats.summary(seconds),
                         "churned_clients": self.churned, "churn_errors": self.churn_errors,
                         "churn_error_kinds": self.churn_error_kinds, "pushes": self.pushes,
                         "console_reads": self.console_reads, "console_errors": self.console_errors,
                         "client_loop_errors": self.noise.get("client_loop_errors", 0),
                         "live_http": len(self.http.live), "live_sdk": len(self.sdk.live)},
                "faults": self.faults, "timeline": self.timeline,
                "partition_unavailable": self.partition_note or None}


def rss_growth(timeline: list[dict[str, Any]], node: int) -> dict[str, Any]:
    """Growth of node's RSS over the last half of the run, on its last process (a node restarted
    in the last half is measured from its restart plus a warm-up of a quarter of what is left)."""
    half = [r for r in timeline[len(timeline) // 2:] if r.get(f"rss_mb_{node}")]
    if not half:
        return {"growth_pct": None}
    pid = half[-1][f"pid_{node}"]
    same = [r[f"rss_mb_{node}"] for r in half if r[f"pid_{node}"] == pid]
    restarted = len(same) < len(half)
    if restarted:
        same = same[len(same) // 4:]
    if len(same) < 2:
        return {"growth_pct": None, "restarted_in_last_half": restarted}
    head = sorted(same[:3])[len(same[:3]) // 2]
    tail = sorted(same[-3:])[len(same[-3:]) // 2]
    return {"from_mb": head, "to_mb": tail, "growth_pct": round((tail / head - 1) * 100, 1),
            "restarted_in_last_half": restarted}


def print_report(report: dict[str, Any]) -> None:
    nodes = sorted(int(k) for k in report["rss"])
    print(f"\n{'t (s)':>7} | " + " | ".join(f"RSS {i} (MB)" for i in nodes) + " | push p99 (ms) | fault")
    step = max(1, len(report["timeline"]) // 40)
    for row in report["timeline"][::step]:
        p99 = row["push_p99_ms"]
        print(f"{row['t_s']:7.0f} | " + " | ".join(f"{row[f'rss_mb_{i}']:10.1f}" for i in nodes)
              + f" | {p99 if p99 is not None else '-':>13} | {row['fault']}")
    print(f"\n{'fault':<10} {'node':>4} {'at (s)':>7} {'agreed (s)':>10} {'no ghosts (s)':>13} {'none lost (s)':>13}"
          f" {'lost':>5} {'ghosts':>6}")
    for f in report["faults"]:
        print(f"{f['kind']:<10} {f['node']:>4} {f['t_s']:7.0f} {f.get('agreed_after_s', f.get('skipped'))!s:>10}"
              f" {f.get('no_ghosts_after_s', '-')!s:>13} {f.get('none_lost_after_s', '-')!s:>13}"
              f" {f.get('lost', '-'):>5} {f.get('ghosts', '-'):>6}")
    v = report["verdict"]
    print(f"\nRSS growth over the last half: {report['rss']}")
    print(f"lost at the end {report['final']['lost']}, ghosts at the end {report['final']['ghosts']}, "
          f"ghosts after fault windows {v['ghosts_after_faults']}, lost after fault windows {v['lost_after_faults']}, "
          f"tracebacks {v['tracebacks']}, push p99 max {v['push_p99_max_ms']} ms")
    load = report["load"]
    print(f"load: writes {load['writes']['per_s']}/s, beats {load['beats']['per_s']}/s, "
          f"{load['churned_clients']} churned SDK clients ({load['churn_errors']} errors), {load['pushes']} pushes, "
          f"{load['console_reads']} console reads ({load['console_errors']} errors)")
    print("verdict:", "OK" if v["ok"] else "FAILED", v["missed"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the run (2 hours compressed)")
    parser.add_argument("--fault-every", type=float, default=120.0, help="seconds between faults")
    parser.add_argument("--pause", type=float, default=20.0, help="SIGSTOP, partition and garbage last this long")
    parser.add_argument("--window", type=float, default=60.0, help="after a fault: time allowed to agree")
    parser.add_argument("--sample", type=float, default=10.0, help="RSS and push p99 sample period")
    parser.add_argument("--http", type=int, default=100, help="live ip:port instances beating every 5 s")
    parser.add_argument("--sdk", type=int, default=10, help="live nacos-sdk-python gRPC clients")
    parser.add_argument("--churners", type=int, default=4, help="SDK clients opened and closed in a loop")
    parser.add_argument("--writers", type=int, default=4, help="closed-loop HTTP register/deregister writers")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with three_nodes("shoal-soak-") as (cluster, tmp):  # a partition's chain is removed on the way out too
        report = asyncio.run(Soak(cluster, args, tmp).run())
        report["expirations"] = expirations(cluster, [HTTP_SVC, SDK_SVC])
        logs = {i: cluster.nodes[i].log() for i in sorted(cluster.nodes)}
    report["rss"] = {str(i): rss_growth(report["timeline"], i) for i in range(3)}
    p99s = [r["push_p99_ms"] for r in report["timeline"] if r["push_p99_ms"] is not None]
    done = [f for f in report["faults"] if "skipped" not in f]
    verdict: dict[str, Any] = {
        "tracebacks": sum(tracebacks(text) for text in logs.values()),
        "lost_after_faults": sum(max(f["lost"], 0) for f in done),
        "ghosts_after_faults": sum(max(f["ghosts"], 0) for f in done),
        "push_p99_max_ms": max(p99s, default=None), "push_p99_median_ms": percentile(p99s, 0.5),
    }
    growth = [g["growth_pct"] for g in report["rss"].values() if g.get("growth_pct") is not None]
    missed = []
    if any(g > 10 for g in growth):
        missed.append("RSS grew more than 10 % over the last half")
    if verdict["lost_after_faults"] or report["final"]["lost"]:
        missed.append("live instances lost")
    if verdict["ghosts_after_faults"] or report["final"]["ghosts"]:
        missed.append("ghosts after a fault's window")
    if verdict["tracebacks"]:
        missed.append("tracebacks in node logs")
    verdict.update(missed=missed, ok=not missed)
    report["verdict"] = verdict
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
