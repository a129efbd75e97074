"""Memory after a burst of large garbage comes back.

One node of a two-node cluster gets ``BURST_S`` seconds of mixed garbage from several clients
at once: random and truncated protobuf, JSON that is no request, random HTTP/2 frames, gRPC
messages of 9 MiB (under the 10 MiB inbound limit: read whole, then refused), 11 and 30 MiB
(over it: refused from their 5-byte prefix), HTTP bodies of 9 and 11 MiB and bad query strings.
Bounds (the issue's): the RSS peak stays within ``2 x baseline + 50 MB``, and within a minute
after the burst the RSS is back within 30 MB of the baseline (polled, not slept). Run on the
native transport and on grpc.aio.

The same bounds hold for a node *under load* (:class:`shoal.testing.load.MixedLoad` on both
nodes: beats, writers, SDK churn, a subscriber, console reads), whose baseline is taken once its
RSS has settled, and whose garbage adds the soak's (random bytes, and HTTP/2 prefaces followed
by random bytes, up to 1 MiB a connection, on its HTTP, gRPC and cluster ports). Before the heap
trimmer (``shoal.gcpolicy.HeapTrimmer``) the node kept everything the burst had taken: the
heap's holes are not at its top while the load's live blocks are, and glibc gives a heap back
only from its top.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from shoal.testing.faults import RssSampler, rss_kb, tracebacks
from shoal.testing.h2client import UNARY, H2Client, grpc_frame
from shoal.testing.load import MixedLoad
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster
from shoal.testing.procs import ServerProcess
from shoal.testing.rawclient import payload
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

BURST_S = 20.0  # the issue sent 90 s; 20 s of the same mix reaches the same peak, in CI time
WORKERS = 4
MIB = 1024 * 1024
PEAK_BOUND = lambda baseline_kb: 2 * baseline_kb + 50 * 1024  # noqa: E731 - the issue's formula, in kB
SETTLED_KB = 30 * 1024
SETTLE_S = 60.0
#: Under load: the baseline is taken once the RSS grew less than WARM_KB over WARM_SPAN_S (a fresh
#: node under the load grows ~0.5 MB/s for its first minute: connections, pools, caches).
WARM_KB = 3 * 1024
WARM_SPAN_S = 15.0
WARM_DEADLINE_S = 150.0


@pytest.fixture(params=["native", "grpcio"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    cluster = FaultCluster(tmp_path, 2, base=(*FAST_MEMBERS, "-D", f"shoal.remote.transport={request.param}"))
    try:
        cluster.start_all()
        yield cluster.nodes[0]
    finally:
        cluster.kill_all()


def _grpc_message(node: ServerProcess, size: int, rng: random.Random) -> None:
    """One unary call carrying ``size`` random bytes, over a raw HTTP/2 connection."""
    try:
        client = H2Client(node.grpc_port, host=node.host)
    except OSError:
        return
    try:
        sid = client.start(UNARY)
        client.send(sid, grpc_frame(rng.randbytes(size)), end=True)
        client.wait_end(sid, 30)
    except Exception:  # refused by a reset or a close (h2 raises on a closed stream): expected
        pass
    finally:
        client.close()


def _small_garbage(node: ServerProcess, rng: random.Random) -> None:
    """Random and truncated protobuf, JSON that is no request, random HTTP/2 frames."""
    channel = grpc.insecure_channel(f"{node.host}:{node.grpc_port}")
    unary = channel.unary_unary("/Request/request")
    try:
        good = payload("ServerCheckRequest", {"headers": {}}).SerializeToString()
        not_json = payload("InstanceRequest", raw=b'{"serviceName": [' + rng.randbytes(64) + b"]")
        unknown = payload(rng.choice(["Nope", "InstanceRequest", ""]), raw=rng.randbytes(512))
        for body in (rng.randbytes(rng.randint(1, 4096)), good[:rng.randint(1, len(good) - 1)],
                     not_json.SerializeToString(), unknown.SerializeToString()):
            with contextlib.suppress(grpc.RpcError):
                unary(body, timeout=10)
    finally:
        channel.close()
    try:
        client = H2Client(node.grpc_port, host=node.host)
    except OSError:
        return
    try:
        client.sock.sendall(rng.randbytes(rng.randint(9, 20_000)))
        client.wait_closed(5)
    except Exception:  # whatever the server does with it, the client only sends
        pass
    finally:
        client.close()


def _http(node: ServerProcess, request: bytes) -> None:
    try:
        with socket.create_connection((node.host, node.port), timeout=30) as s:
            s.sendall(request)
            s.recv(256)
    except OSError:
        pass


def _http_garbage(node: ServerProcess, rng: random.Random) -> None:
    query = urllib.parse.quote_from_bytes(rng.randbytes(200)).encode()
    _http(node, b"GET /nacos/v1/ns/instance/list?serviceName=" + query + b"&pageNo=%ff&x HTTP/1.1\r\nHost: a\r\n"
          b"Connection: close\r\n\r\n")
    size = rng.choice([9, 11]) * MIB
    _http(node, (f"POST /nacos/v1/ns/instance HTTP/1.1\r\nHost: a\r\nContent-Type: application/x-www-form-urlencoded"
                 f"\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n").encode()
          + b"serviceName=s&ip=1.1.1.1&port=1&metadata=" + b"a" * (size - 41))


def _raw_garbage(node: ServerProcess, rng: random.Random) -> None:
    """The soak's garbage: a connection to the HTTP, gRPC or cluster port, random bytes (after an
    HTTP/2 preface or not), closed without reading."""
    port = node.port + rng.choice([0, 1000, 1001])
    data = rng.randbytes(rng.choice([64, 4096, 65536, MIB]))
    try:
        with socket.create_connection((node.host, port), timeout=5) as s:
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + data if rng.random() < 0.5 else data)
    except OSError:
        pass


def _burst(node: ServerProcess, seconds: float, seed: int, raw: int = 0) -> int:
    """Garbage from ``WORKERS`` threads (and ``raw`` more sending the soak's) for ``seconds``; how
    many pieces were sent."""
    sent = [0] * WORKERS
    end = time.monotonic() + seconds
    kinds: list[Callable[[ServerProcess, random.Random], None]] = [
        lambda n, r: _grpc_message(n, 9 * MIB, r),
        lambda n, r: _grpc_message(n, 11 * MIB, r),
        lambda n, r: _grpc_message(n, 30 * MIB, r),
        _small_garbage, _small_garbage, _http_garbage,
    ]

    def work(i: int) -> None:
        rng = random.Random(seed + i)
        pick = (lambda: _raw_garbage) if i >= WORKERS else (lambda: rng.choice(kinds))
        while time.monotonic() < end:
            pick()(node, rng)
            sent[i] += 1

    sent += [0] * raw
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(WORKERS + raw)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    return sum(sent)


def test_memory_comes_back_after_large_garbage(node: ServerProcess) -> None:
    baseline = rss_kb(node.pid)
    with RssSampler(node.pid) as sampler:
        sent = _burst(node, BURST_S, int(os.environ.get("SHOAL_GARBAGE_SEED", "22")))
    stopped = time.monotonic()
    peak = sampler.peak_kb
    settled = rss_kb(node.pid)
    while settled - baseline > SETTLED_KB and time.monotonic() - stopped < SETTLE_S:  # poll, up to a minute
        time.sleep(0.5)
        settled = rss_kb(node.pid)
    took = time.monotonic() - stopped
    assert poll_until(node.ready, 20, what="the node to still serve")
    print(f"garbage {BURST_S:.0f} s, {sent} pieces: RSS baseline {baseline // 1024} MB, peak {peak // 1024} MB "
          f"(bound {PEAK_BOUND(baseline) // 1024} MB), {settled // 1024} MB {took:.1f} s after the burst")
    assert peak <= PEAK_BOUND(baseline)
    assert settled - baseline <= SETTLED_KB, f"RSS {settled // 1024} MB a minute after, from {baseline // 1024} MB"
    assert tracebacks(node.log()) == 0


def _settled_rss(pid: int) -> int:
    """The RSS once it grew less than ``WARM_KB`` over ``WARM_SPAN_S`` (polled)."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + WARM_DEADLINE_S
    while time.monotonic() < deadline:
        now = time.monotonic()
        samples.append((now, rss_kb(pid)))
        span = [kb for t, kb in samples if now - t <= WARM_SPAN_S]
        if now - samples[0][0] >= WARM_SPAN_S and max(span) - min(span) < WARM_KB:
            return samples[-1][1]
        time.sleep(1.0)
    raise AssertionError(f"RSS never settled under the load: {[kb // 1024 for _t, kb in samples[-20:]]} MB")


def test_memory_comes_back_after_garbage_under_load(tmp_path: Path) -> None:
    cluster = FaultCluster(tmp_path, 2, base=FAST_MEMBERS)
    try:
        cluster.start_all()
        node = cluster.nodes[0]
        with MixedLoad([cluster.nodes[0], cluster.nodes[1]], tmp_path) as load:
            baseline = _settled_rss(node.pid)
            served = load.ok
            with RssSampler(node.pid) as sampler:
                sent = _burst(node, BURST_S, int(os.environ.get("SHOAL_GARBAGE_SEED", "22")), raw=2)
            stopped = time.monotonic()
            settled = rss_kb(node.pid)
            while settled - baseline > SETTLED_KB and time.monotonic() - stopped < SETTLE_S:  # poll, up to a minute
                time.sleep(0.5)
                settled = rss_kb(node.pid)
            took = time.monotonic() - stopped
            assert poll_until(node.ready, 20, what="the node to still serve")
            assert load.ok > served, "the load went on"
        peak = sampler.peak_kb
        print(f"under load ({load.ok} calls, {load.errors} errors): garbage {BURST_S:.0f} s, {sent} pieces: "
              f"RSS baseline {baseline // 1024} MB, peak {peak // 1024} MB (bound {PEAK_BOUND(baseline) // 1024} MB), "
              f"{settled // 1024} MB {took:.1f} s after the burst")
        assert peak <= PEAK_BOUND(baseline)
        assert settled - baseline <= SETTLED_KB, f"RSS {settled // 1024} MB a minute after, from {baseline // 1024} MB"
        assert tracebacks(node.log()) == 0
    finally:
        cluster.kill_all()
