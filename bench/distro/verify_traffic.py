"""Distro verify traffic per peer per round, in process (no sockets).

Builds two Distro nodes exactly as the cluster tests do (shoal.testing.SimCluster: real
DistroProtocol objects on an InMemoryNetwork with a ManualClock), puts ``--clients``
connection clients with one instance each on A, syncs them to B, then measures:

* **in sync** — ``--rounds`` verify rounds A → B: requests and bytes per peer (request bodies as
  the network records them, answers, and the gRPC message estimate), CPU time per round;
* **1 % diverged** — B loses ``--missing`` copies and holds ``--stale`` at an older revision
  (applied as an older sync record, so B's kept digests follow); one verify round (digest, then
  sub-digests when the mismatched buckets are large, then the hashed detail), its bytes both
  ways, how many clients are re-sent, the re-sync's requests and bytes, and a confirming round;
* **Nacos per-client verify** — computed, not sent: one DistroDataRequest per client per peer
  per round with a ``{"clientId","revision"}`` content, as Nacos 2.x sends them;
* **bucket what-if** — for the same divergence, the detail size at other bucket counts
  (computed with the verify kernel), to size the digest granularity.

The parent runs the measurement twice in child processes of itself, once with the compiled
kernels and once with ``SHOAL_NO_EXTENSIONS=1``, and prints one JSON document with both and
the CPU times side by side.

    .venv/bin/python -m bench.distro.verify_traffic                  # 100,000 clients, both modes
    .venv/bin/python -m bench.distro.verify_traffic --modes cython --clients 20000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.distro._common import REPO, emit, host_info, install_signal_handlers, log, run_main

TARGET_IN_SYNC_REQUESTS = 1
TARGET_IN_SYNC_BYTES = 64 * 1024
GRPC_PREFIX = 5  # gRPC length-prefixed message: flag + 4-byte length
H2_DATA_FRAME = 9  # one HTTP/2 DATA frame header (messages below 16 KiB)
H2_HEADERS_EST = 40  # HEADERS frame of a unary call once HPACK has indexed the static headers (estimate)
NACOS_VERIFY_TYPE = "Nacos:Naming:v2:ClientData"


# --- the child: one measurement with whatever kernels this process has --------------------------
def client_id(i: int, base_ms: int) -> str:
    """A connection id shaped like Shoal's (and Nacos's): ``<ms>_<ip>_<port>``."""
    return f"{base_ms + i // 50}_10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}_{40000 + i % 20000}"


def grpc_message_bytes(type_name: str, body: bytes, headers: dict[str, str]) -> int:
    """Serialized Payload (metadata type + headers, body) + gRPC prefix + DATA frame header."""
    from shoal.transport.grpc._proto import Metadata, Payload

    payload = Payload(metadata=Metadata(type=type_name, headers=headers), body={"value": body})
    size = int(payload.ByteSize())
    frames = -(-(size + GRPC_PREFIX) // 16384)
    return size + GRPC_PREFIX + frames * H2_DATA_FRAME


class Recorder:
    """Wraps each node's dispatch to record answer sizes and the receiver's CPU time."""

    def __init__(self, network: Any) -> None:
        self.answers: list[tuple[str, str, str, int]] = []  # (source, target, request type, answer bytes)
        self.receiver_cpu: dict[str, float] = {}
        for address, handler in list(network.handlers.items()):
            network.handlers[address] = self._wrap(address, handler)

    def _wrap(self, target: str, handler: Any) -> Any:
        async def dispatch(sender: str, type_name: str, body: bytes) -> tuple[str, bytes]:
            c0 = time.process_time()
            kind, answer = await handler(sender, type_name, body)
            self.receiver_cpu[type_name] = self.receiver_cpu.get(type_name, 0.0) + time.process_time() - c0
            self.answers.append((sender, target, type_name, len(answer)))
            return kind, answer

        return dispatch

    def clear(self) -> None:
        self.answers.clear()
        self.receiver_cpu.clear()


def traffic(cluster: Any, recorder: Recorder, source: str, member_header: str) -> dict[str, Any]:
    """Requests and bytes from ``source`` per peer since the last clear, by request type."""
    per_peer: dict[str, dict[str, Any]] = {}
    for (src, target, type_name, size), (_, _, _, answer) in zip(cluster.network.calls, recorder.answers,
                                                                 strict=False):
        if src != source:
            continue
        peer = per_peer.setdefault(target, {"requests": 0, "request_body_bytes": 0, "answer_body_bytes": 0,
                                            "request_grpc_bytes_est": 0, "by_type": {}})
        peer["requests"] += 1
        peer["request_body_bytes"] += size
        peer["answer_body_bytes"] += answer
        peer["request_grpc_bytes_est"] += H2_HEADERS_EST + grpc_message_bytes(
            type_name, b"\0" * size, {member_header: source})
        kind = peer["by_type"].setdefault(type_name, {"requests": 0, "request_body_bytes": 0})
        kind["requests"] += 1
        kind["request_body_bytes"] += size
    return per_peer


async def flush(cluster: Any, max_rounds: int = 1000) -> None:
    """Advance past the sync delay and send everything due, until every queue is empty (bounded)."""
    for _ in range(max_rounds):
        cluster.clock.advance(cluster.config.sync_delay_ms)
        sent = 0
        for node in list(cluster.nodes.values()):
            for target in list(node.distro.engine.queues):
                while n := await node.distro.engine.flush(target):
                    sent += n
        if not sent and not any(n.distro.engine.pending_count() for n in cluster.nodes.values()):
            return
    raise RuntimeError("sync queues did not drain")


def nacos_verify_cost(ids: list[str], revisions: list[int], target: str) -> dict[str, Any]:
    """One Nacos 2.x DistroDataRequest (VERIFY) per client, computed the way Nacos serialises it."""
    body_total = 0
    grpc_total = 0
    sample = b""
    for n, (cid, rev) in enumerate(zip(ids, revisions, strict=True)):
        content = json.dumps({"clientId": cid, "revision": rev}, separators=(",", ":")).encode()
        request = {"headers": {}, "requestId": str(n + 1),
                   "distroData": {"distroKey": {"resourceKey": cid, "resourceType": NACOS_VERIFY_TYPE,
                                                "targetServer": target},
                                  "type": "VERIFY", "content": base64.b64encode(content).decode()},
                   "dataOperation": "VERIFY", "module": "core"}
        body = json.dumps(request, separators=(",", ":")).encode()
        body_total += len(body)
        if n == 0:
            sample = body
        # Payload metadata of a Nacos cluster request: type + clientIp; headers are in the body
        grpc_total += H2_HEADERS_EST + grpc_message_bytes("DistroDataRequest", body, {}) + len("127.0.0.1") + 2
    count = len(ids)
    return {
        "requests_per_peer": count,
        "request_body_bytes": body_total,
        "request_grpc_bytes_est": grpc_total,
        "answers_per_peer": count,
        "sample_request_body": sample.decode(),
        "note": "computed, not sent: Nacos DistroVerifyTimedTask sends one DistroDataRequest per "
                "responsible client per peer every verify interval; answers are one DistroDataResponse each",
    }


def legacy_detail_request(ids: list[str], revisions: list[int], n: int, buckets: set[int]) -> bytes:
    """The version-1 detail body (ids and revisions of the mismatched buckets as JSON), for sizing."""
    from shoal.kernels import verify as kernel

    per_bucket: dict[str, list[list[object]]] = {str(b): [] for b in buckets}
    for cid, rev, b in zip(ids, revisions, kernel.bucket_of(ids, n), strict=True):
        if b in buckets:
            per_bucket[str(b)].append([cid, rev])
    return json.dumps({"buckets": n, "clients": per_bucket}, separators=(",", ":")).encode()


def bucket_what_if(a_ids: list[str], a_revs: list[int], b_ids: list[str], b_revs: list[int]) -> list[dict[str, Any]]:
    """Digest and detail size of the same divergence at other bucket counts."""
    from shoal.distro import verify
    from shoal.kernels import verify as kernel

    rows = []
    default_n = verify.bucket_count(len(a_ids))
    for n in sorted({default_n, 1024, 4096, 16384, 65536}):
        theirs = kernel.bucket_digests(a_ids, a_revs, n)
        mine = kernel.bucket_digests(b_ids, b_revs, n)
        mismatched = {i for i in range(n) if theirs[i] != mine[i]}
        digest = json.dumps({"buckets": n, "count": len(a_ids), "digests": [f"{d:016x}" for d in theirs]},
                            separators=(",", ":")).encode()
        detail = legacy_detail_request(a_ids, a_revs, n, mismatched) if mismatched else b""
        pairs = sum(1 for b in kernel.bucket_of(a_ids, n) if b in mismatched)
        rows.append({"buckets": n, "clients_per_bucket": round(len(a_ids) / n, 1),
                     "is_current_default": n == default_n, "digest_bytes": len(digest),
                     "mismatched_buckets": len(mismatched), "detail_pairs": pairs, "detail_bytes": len(detail),
                     "round_bytes": len(digest) + len(detail), "requests": 2 if mismatched else 1})
    # two levels: the current digest, then k sub-digests for each mismatched bucket (sub-bucket =
    # fnv % (n*k), which refines fnv % n), then (id, revision) pairs only for mismatched sub-buckets
    n = default_n
    theirs = kernel.bucket_digests(a_ids, a_revs, n)
    mine = kernel.bucket_digests(b_ids, b_revs, n)
    level1 = {i for i in range(n) if theirs[i] != mine[i]}
    digest = json.dumps({"buckets": n, "count": len(a_ids), "digests": [f"{d:016x}" for d in theirs]},
                        separators=(",", ":")).encode()
    for k in (16, 64, 256):
        fine = n * k
        theirs_fine = kernel.bucket_digests(a_ids, a_revs, fine)
        mine_fine = kernel.bucket_digests(b_ids, b_revs, fine)
        children = [b1 + n * j for b1 in sorted(level1) for j in range(k)]  # x % n == b1
        sub = json.dumps({"buckets": fine, "digests": {str(c): f"{theirs_fine[c]:016x}" for c in children}},
                         separators=(",", ":")).encode()
        level2 = {c for c in children if theirs_fine[c] != mine_fine[c]}
        detail = legacy_detail_request(a_ids, a_revs, fine, level2) if level2 else b""
        pairs = sum(1 for b in kernel.bucket_of(a_ids, fine) if b in level2)
        rows.append({"two_level": True, "buckets": n, "sub_buckets_per_bucket": k, "digest_bytes": len(digest),
                     "sub_digest_bytes": len(sub), "mismatched_buckets": len(level1),
                     "mismatched_sub_buckets": len(level2), "detail_pairs": pairs, "detail_bytes": len(detail),
                     "round_bytes": len(digest) + len(sub) + len(detail), "requests": 3 if level1 else 1})
    return rows


async def child(args: argparse.Namespace) -> dict[str, Any]:
    from shoal import kernels
    from shoal.distro import records, verify
    from shoal.distro.transport import MEMBER_HEADER
    from shoal.model.instance import InstanceInfo
    from shoal.model.keys import ServiceKey
    from shoal.testing import SimCluster

    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    recorder = Recorder(cluster.network)
    out: dict[str, Any] = {"kernels": kernels.implementation(), "no_extensions": kernels.NO_EXTENSIONS,
                           "clients": args.clients, "config": {
                               "sync_batch_max": cluster.config.sync_batch_max,
                               "sync_queue_max": cluster.config.sync_queue_max,
                               "clients_per_bucket": verify.CLIENTS_PER_BUCKET,
                               "max_buckets": verify.MAX_BUCKETS}}
    base_ms = 1_700_000_000_000
    ids = [client_id(i, base_ms) for i in range(args.clients)]
    services = [ServiceKey("public", "DEFAULT_GROUP", f"svc-{s}") for s in range(args.services)]

    # --- A gets the clients, B gets them by sync (flushed every chunk, as the engine would) ---
    log(f"[{out['kernels'].get('verify')}] registering {args.clients} clients on A and syncing them to B")
    register_cpu = 0.0
    sync_cpu = 0.0
    cluster.network.calls.clear()
    recorder.clear()
    chunk = 5000
    for start in range(0, args.clients, chunk):
        c0 = time.process_time()
        for i in range(start, min(start + chunk, args.clients)):
            a.connect(ids[i])
            a.naming.ephemeral.register_instance(ids[i], services[i % len(services)],
                                       InstanceInfo(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 8080))
        c1 = time.process_time()
        await flush(cluster)
        sync_cpu += time.process_time() - c1
        register_cpu += c1 - c0
    full_sync = traffic(cluster, recorder, a.address, MEMBER_HEADER).get(b.address, {})
    b_count = sum(1 for c in b.clients if not c.native)
    if b_count != args.clients:
        raise RuntimeError(f"B holds {b_count} copies after the sync, expected {args.clients}")
    out["initial_sync"] = {"register_cpu_s": round(register_cpu, 3), "sync_cpu_s": round(sync_cpu, 3),
                           "requests": full_sync.get("requests"),
                           "request_body_bytes": full_sync.get("request_body_bytes"),
                           "b_copies": b_count}

    # --- in sync: verify rounds ----------------------------------------------------------------
    rounds = []
    for _ in range(args.rounds):
        cluster.network.calls.clear()
        recorder.clear()
        c0, w0 = time.process_time(), time.perf_counter()
        await a.distro.verify_round()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        peer = traffic(cluster, recorder, a.address, MEMBER_HEADER).get(b.address, {})
        stats = a.distro.verify_stats.last_round.get(b.address, {})
        rounds.append({"cpu_s": cpu, "wall_s": wall, "receiver_cpu_s": sum(recorder.receiver_cpu.values()),
                       "peer": peer, "mismatched_buckets": stats.get("mismatched")})
    first = rounds[0]
    out["in_sync_round"] = {
        "requests_per_peer": first["peer"].get("requests"),
        "request_body_bytes_per_peer": first["peer"].get("request_body_bytes"),
        "request_grpc_bytes_est_per_peer": first["peer"].get("request_grpc_bytes_est"),
        "answer_body_bytes_per_peer": first["peer"].get("answer_body_bytes"),
        "buckets": verify.bucket_count(args.clients),
        "mismatched_buckets": first["mismatched_buckets"],
        "by_type": first["peer"].get("by_type"),
        "rounds": len(rounds),
        "cpu_s_median": round(statistics.median(r["cpu_s"] for r in rounds), 4),
        "cpu_s_min": round(min(r["cpu_s"] for r in rounds), 4),
        "receiver_cpu_s_median": round(statistics.median(r["receiver_cpu_s"] for r in rounds), 4),
        "sender_cpu_s_median": round(statistics.median(r["cpu_s"] - r["receiver_cpu_s"] for r in rounds), 4),
        "wall_s_median": round(statistics.median(r["wall_s"] for r in rounds), 4),
    }

    # --- the Nacos per-client verify of the same state (computed) ------------------------------
    a_ids, a_revs = verify.responsible_revisions(a.clients, a.distro.mapper.responsible_client)
    out["nacos_per_client_verify"] = nacos_verify_cost(a_ids, a_revs, b.address)

    # --- 1 % diverged ----------------------------------------------------------------------------
    rng = random.Random(args.seed)
    victims = rng.sample(ids, args.missing + args.stale)
    for cid in victims[:args.missing]:
        b.clients.remove(cid, "deleted by owner")  # lost on B
    for cid in victims[args.missing:]:
        copy = b.clients.get(cid)
        assert copy is not None
        op, _, revision, services = records.client_record(copy)
        b.distro.processor.apply(a.address, [(op, cid, revision - 1, services)])  # B holds an older revision
    copies = [c for c in b.clients if not c.native and c.owner == a.address]
    b_ids = [c.client_id for c in copies]
    b_revs = [c.revision for c in copies]

    cluster.network.calls.clear()
    recorder.clear()
    resynced_before = a.distro.verify_stats.resynced
    c0, w0 = time.process_time(), time.perf_counter()
    await a.distro.verify_round()
    verify_cpu, verify_wall = time.process_time() - c0, time.perf_counter() - w0
    receiver_cpu = sum(recorder.receiver_cpu.values())
    peer = traffic(cluster, recorder, a.address, MEMBER_HEADER).get(b.address, {})
    stats = a.distro.verify_stats.last_round.get(b.address, {})
    resynced = a.distro.verify_stats.resynced - resynced_before

    cluster.network.calls.clear()
    recorder.clear()
    c0 = time.process_time()
    await flush(cluster)
    resync_cpu = time.process_time() - c0
    resync = traffic(cluster, recorder, a.address, MEMBER_HEADER).get(b.address, {})

    cluster.network.calls.clear()
    recorder.clear()
    await a.distro.verify_round()
    after = traffic(cluster, recorder, a.address, MEMBER_HEADER).get(b.address, {})
    b_after = sum(1 for c in b.clients if not c.native)
    agree = all(getattr(b.clients.get(cid), "revision", None) == rev for cid, rev in zip(a_ids, a_revs, strict=True))
    out["diverged_round"] = {
        "missing_on_b": args.missing,
        "stale_on_b": args.stale,
        "diverged_fraction": round((args.missing + args.stale) / args.clients, 4),
        "verify_requests_per_peer": peer.get("requests"),
        "verify_request_body_bytes_per_peer": peer.get("request_body_bytes"),
        "verify_request_grpc_bytes_est_per_peer": peer.get("request_grpc_bytes_est"),
        "verify_answer_body_bytes_per_peer": peer.get("answer_body_bytes"),
        "by_type": peer.get("by_type"),
        "mismatched_buckets": stats.get("mismatched"),
        "buckets": verify.bucket_count(args.clients),
        "sub_buckets_per_bucket": stats.get("sub_buckets"),
        "detail_clients": stats.get("detail_clients"),
        "verify_total_bytes_both_ways": (peer.get("request_body_bytes") or 0) + (peer.get("answer_body_bytes") or 0),
        "clients_resent": resynced,
        "resync_requests": resync.get("requests"),
        "resync_request_body_bytes": resync.get("request_body_bytes"),
        "verify_cpu_s": round(verify_cpu, 4),
        "verify_receiver_cpu_s": round(receiver_cpu, 4),
        "verify_sender_cpu_s": round(verify_cpu - receiver_cpu, 4),
        "verify_wall_s": round(verify_wall, 4),
        "resync_cpu_s": round(resync_cpu, 4),
        "next_round_requests": after.get("requests"),
        "next_round_request_body_bytes": after.get("request_body_bytes"),
        "b_copies_after": b_after,
        "b_agrees_after": agree,
    }
    if args.what_if:
        out["bucket_what_if"] = bucket_what_if(a_ids, a_revs, b_ids, b_revs)
    return out


# --- the parent: both modes, side by side --------------------------------------------------------
def run_child(args: argparse.Namespace, pure: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("SHOAL_NO_EXTENSIONS", None)
    if pure:
        env["SHOAL_NO_EXTENSIONS"] = "1"
    cmd = [sys.executable, "-m", "bench.distro.verify_traffic", "--child", "--clients", str(args.clients),
           "--services", str(args.services), "--rounds", str(args.rounds), "--missing", str(args.missing),
           "--stale", str(args.stale), "--seed", str(args.seed)]
    if not args.what_if:
        cmd.append("--no-what-if")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=REPO)  # the repo root holds `bench`
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{'pure' if pure else 'cython'} run failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=100_000, help="connection clients on A, one instance each")
    p.add_argument("--services", type=int, default=1000, help="services the instances are spread over")
    p.add_argument("--rounds", type=int, default=5, help="in-sync verify rounds (CPU time is their median)")
    p.add_argument("--missing", type=int, default=None, help="copies removed on B (default 0.5 %% of clients)")
    p.add_argument("--stale", type=int, default=None, help="copies made stale on B (default 0.5 %% of clients)")
    p.add_argument("--seed", type=int, default=4, help="seed of the choice of diverged clients")
    p.add_argument("--modes", default="cython,pure", help="cython, pure or both (default cython,pure)")
    p.add_argument("--no-what-if", dest="what_if", action="store_false", help="skip the bucket-count what-if")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per mode")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1000 <= args.clients <= 2_000_000:
        raise SystemExit("--clients must be 1000..2,000,000")
    args.missing = args.clients // 200 if args.missing is None else args.missing
    args.stale = args.clients // 200 if args.stale is None else args.stale
    if args.missing + args.stale > args.clients or args.rounds < 1:
        raise SystemExit("--missing + --stale must not exceed --clients; --rounds >= 1")
    if args.child:
        emit(asyncio.run(child(args)))
        return 0
    install_signal_handlers()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("cython", "pure") for m in modes):
        raise SystemExit("--modes takes cython, pure or cython,pure")
    report: dict[str, Any] = {"benchmark": "distro-verify-traffic", "host": host_info(),
                              "settings": {k: v for k, v in vars(args).items() if k != "child"}}
    results = {m: run_child(args, pure=(m == "pure")) for m in modes}
    report["modes"] = results
    main_result = results.get("cython") or results[modes[0]]
    ins = main_result["in_sync_round"]
    div = main_result["diverged_round"]
    nacos = main_result["nacos_per_client_verify"]
    report["summary"] = {
        "in_sync": {"requests_per_peer": ins["requests_per_peer"],
                    "request_body_bytes_per_peer": ins["request_body_bytes_per_peer"],
                    "request_grpc_bytes_est_per_peer": ins["request_grpc_bytes_est_per_peer"]},
        "diverged_1pct": {"requests_per_peer": div["verify_requests_per_peer"],
                          "request_body_bytes_per_peer": div["verify_request_body_bytes_per_peer"],
                          "clients_resent": div["clients_resent"], "resync_requests": div["resync_requests"],
                          "resync_bytes": div["resync_request_body_bytes"]},
        "nacos_in_sync": {"requests_per_peer": nacos["requests_per_peer"],
                          "request_body_bytes_per_peer": nacos["request_body_bytes"],
                          "request_grpc_bytes_est_per_peer": nacos["request_grpc_bytes_est"]},
    }
    if len(results) == 2:
        c, p = results["cython"], results["pure"]
        report["cpu_side_by_side"] = {
            key: {"cython_s": cy, "pure_s": py, "pure_over_cython": ratio(py, cy)}
            for key, cy, py in [
                ("in_sync_verify_round", c["in_sync_round"]["cpu_s_median"], p["in_sync_round"]["cpu_s_median"]),
                ("in_sync_verify_sender", c["in_sync_round"]["sender_cpu_s_median"],
                 p["in_sync_round"]["sender_cpu_s_median"]),
                ("in_sync_verify_receiver", c["in_sync_round"]["receiver_cpu_s_median"],
                 p["in_sync_round"]["receiver_cpu_s_median"]),
                ("diverged_verify_round", c["diverged_round"]["verify_cpu_s"], p["diverged_round"]["verify_cpu_s"]),
                ("diverged_resync", c["diverged_round"]["resync_cpu_s"], p["diverged_round"]["resync_cpu_s"]),
                ("initial_sync_100pct", c["initial_sync"]["sync_cpu_s"], p["initial_sync"]["sync_cpu_s"]),
            ]
        }
    report["targets"] = {
        "in_sync_requests_per_peer": {"target": TARGET_IN_SYNC_REQUESTS, "measured": ins["requests_per_peer"],
                                      "met": ins["requests_per_peer"] == TARGET_IN_SYNC_REQUESTS},
        "in_sync_bytes_per_peer": {"target": TARGET_IN_SYNC_BYTES, "measured": ins["request_grpc_bytes_est_per_peer"],
                                   "met": (ins["request_grpc_bytes_est_per_peer"] or 0) <= TARGET_IN_SYNC_BYTES},
    }
    emit(report)
    return 0


if __name__ == "__main__":
    run_main(main)
