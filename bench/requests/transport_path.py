"""The in-process request path *with* the native transport: HTTP/2 bytes in → ``H2Connection`` (libnghttp2
session, gRPC framing, dispatch) → ``SdkServer.unary`` → handler → HTTP/2 bytes out.

A :class:`~bench.requests.path.RequestPath` node behind a real :class:`H2Connection` whose socket is
a stand-in that keeps nothing (so the kernel's send cost is left out: what is measured is the
transport's and the node's CPU per request). An ``h2`` client makes the requests and reads the
answers (acknowledging their bytes, so flow control goes on); only the server side's calls are
timed, with the process CPU clock.

    PYTHONPATH=src:. python bench/requests/transport_path.py [--n 20000] [--hosts 100] [--window 2]

Prints µs of server CPU per request (best of ``--repeat`` runs) for a query of a ``--hosts``
instance service (a ~37 KB answer at 100) and for a register/deregister pair. Optionally
``--profile query`` prints the cProfile of one query run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import json
import pstats
import struct
import time
from typing import Any

import h2.config
import h2.connection
import h2.events

from bench.requests.path import RequestPath, deregister_body, ips, populate, query_body, register_body
from shoal.kernels.payload import decode
from shoal.transport.grpc.native_server import H2Connection, NativeGrpcServer

UNARY = "/Request/request"
STREAM = "/BiRequestStream/requestBiStream"


class NullTransport:
    """A socket that takes every write at once and keeps nothing (counts the bytes)."""

    def __init__(self) -> None:
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += len(part)

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    port = 50000

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            NullTransport.port += 1  # one peer per connection
            return ("127.0.0.1", NullTransport.port)
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class Client:
    """An ``h2`` client on one H2Connection; ``server_s`` sums the CPU time spent in the server."""

    def __init__(self, conn: H2Connection) -> None:
        self.conn = conn
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        self.h2.increment_flow_control_window(1 << 24)
        self.server_s = 0.0
        self.sent: list[bytes] = []  # every byte the client sent, in reads, for a replay
        self.answers: dict[int, bytes] = {}
        self.done: set[int] = set()
        self.pump()

    def pump(self) -> None:
        """Client bytes → server (timed) → client, until both are quiet."""
        transport: Any = self.conn.transport
        for _ in range(50):
            out = self.h2.data_to_send()
            if out:
                self.sent.append(out)
                t0 = time.process_time()
                self.conn.data_received(out)
                self.server_s += time.process_time() - t0
            back = transport.taken
            transport.taken = []
            if not out and not back:
                return
            for chunk in back:
                for ev in self.h2.receive_data(bytes(chunk)):
                    if isinstance(ev, h2.events.DataReceived):
                        self.answers[ev.stream_id] = self.answers.get(ev.stream_id, b"") + ev.data
                        self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset):
                        self.done.add(ev.stream_id)

    def start(self, path: str, message: bytes, end: bool = True) -> int:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "127.0.0.1:9848"), ("content-type", "application/grpc"),
                                   ("te", "trailers"), ("grpc-timeout", "2999m"),
                                   ("user-agent", "grpc-python/1.60.0 grpc-c/37.0.0 (linux; chttp2)")])
        self.h2.send_data(sid, struct.pack(">BI", 0, len(message)) + message, end_stream=end)
        return sid

    def answer(self, sid: int) -> bytes:
        data = self.answers.pop(sid)
        self.done.discard(sid)
        return data[5:]


class KeepingTransport(NullTransport):
    """A NullTransport that keeps what was written for the client (joined outside the timing)."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[Any] = []

    def write(self, data: Any) -> None:
        self.written += len(data)
        self.taken.append(data)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.written += len(part)
        self.taken.extend(parts)


async def _open(path: RequestPath) -> tuple[H2Connection, KeepingTransport]:
    """A native-transport connection (on the running loop) to the node, on a stand-in socket."""
    server = NativeGrpcServer(path.node.config, 0, "bench", path.server, path.server, 4 << 20)
    conn = H2Connection(server)
    transport = KeepingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def _connect(path: RequestPath) -> Client:
    conn, _ = await _open(path)
    client = Client(conn)
    sid = client.start(UNARY, path.request("ServerCheckRequest", {"headers": {}, "module": "internal"}))
    client.pump()
    assert decode(client.answer(sid))[0] == "ServerCheckResponse"
    setup = {"headers": {}, "clientVersion": "Nacos-Java-Client:v2.5.1", "tenant": "", "labels": {
        "module": "naming", "source": "sdk", "AppName": "bench"}, "abilityTable": {}, "module": "internal"}
    client.start(STREAM, path.request("ConnectionSetupRequest", setup), end=False)
    client.pump()
    await asyncio.sleep(0.01)  # the SetupAck goes out on a scheduled flush
    client.pump()
    return client


def run(client: Client, requests: list[bytes], n: int, window: int) -> float:
    """µs of server CPU per request for ``n`` requests, ``window`` sent per read."""
    client.server_s = 0.0
    i = 0
    while i < n:
        sids = [client.start(UNARY, requests[(i + k) % len(requests)]) for k in range(min(window, n - i))]
        client.pump()
        for sid in sids:
            client.answer(sid)
        i += len(sids)
    return client.server_s / n * 1e6


def replay(path: RequestPath, chunks: list[bytes], timed_from: int) -> float:
    """Feed a client's recorded reads to a new connection; server CPU seconds of the reads from
    ``timed_from`` on (answers are dropped: the recording client opened the flow-control windows).

    The timed loop runs in ``functools.reduce`` so that ``valgrind --tool=callgrind --collect-atstart=no
    --toggle-collect=functools_reduce`` counts the instructions of exactly that part (a load-proof
    figure on a busy machine)."""
    conn, transport = path.loop.run_until_complete(_open(path))
    for chunk in chunks[:timed_from]:
        conn.data_received(chunk)
    transport.taken.clear()
    feed, taken = conn.data_received, transport.taken

    def step(_: None, chunk: bytes) -> None:
        feed(chunk)
        taken.clear()

    written = transport.written
    t0 = time.process_time()
    functools.reduce(step, chunks[timed_from:], None)
    spent = time.process_time() - t0
    if transport.written - written < len(chunks) - timed_from:
        raise RuntimeError("the replayed requests were not answered")
    return spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--hosts", type=int, default=100)
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--profile", choices=("query", "register"))
    p.add_argument("--only", choices=("query", "register+deregister"), help="one workload (e.g. under callgrind)")
    a = p.parse_args()
    path = RequestPath()
    try:
        populate(path, "q0", a.hosts)
        client = path.loop.run_until_complete(_connect(path))
        query = [path.request("ServiceQueryRequest", query_body("q0"))]
        sid = client.start(UNARY, query[0])
        client.pump()
        answer = client.answer(sid)
        body = json.loads(decode(answer)[3])
        assert len(body["serviceInfo"]["hosts"]) == a.hosts, body
        addr = next(iter(ips(1)))
        pairs = [path.request("InstanceRequest", register_body("r0", addr)),
                 path.request("InstanceRequest", deregister_body("r0", addr))]
        results: dict[str, Any] = {"query_answer_bytes": len(answer)}
        for name, reqs in (("query", query), ("register+deregister", pairs)):
            if a.only and a.only != name:
                continue
            client = path.loop.run_until_complete(_connect(path))
            start = len(client.sent)
            results[name + "_us_live"] = round(run(client, reqs, a.n, a.window), 2)
            results[name + "_us"] = round(min(replay(path, client.sent, start) for _ in range(a.repeat)) / a.n * 1e6, 2)
        print(json.dumps(results))
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            run(client, query if a.profile == "query" else pairs, a.n, a.window)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    finally:
        path.close()


if __name__ == "__main__":
    main()
