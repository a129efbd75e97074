"""HTTP/2 abuse against a real node on the native transport: rapid reset,
PING/SETTINGS floods, too many SETTINGS entries, CONTINUATION floods, oversized header lists,
too many streams, unfinished messages past the read buffer, no preface, and garbage.

Each abusive connection is refused, GOAWAYed or closed at the byte level, while a bystander
connection on the same node keeps answering within its deadline and the node's RSS stays
bounded. The limits are ``shoal.remote.h2.*``, set low here so that a test fails without them
(for CONTINUATION, below the bound a patched libnghttp2 has of its own). grpc.aio has grpc
core's own limits (see native_server.py) and is not tested here.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shoal.testing import OPEN, ServerProcess, kill, poll_until, start_server
from shoal.transport.selection import native_available

pytest.importorskip("h2", reason="the h2 dev dependency drives HTTP/2 frames directly")
import h2.settings
import hpack  # h2's own HPACK codec

from shoal.testing.h2client import UNARY, H2Client, grpc_frame, nacos
from shoal.testing.rawclient import register_body

pytestmark = pytest.mark.skipif(not native_available(), reason="the h2grpc extension is not built")

MIB = 1024 * 1024
LIMIT = 65536  # max inbound message
READ_BUFFER = 2 * LIMIT  # two unfinished messages of the limit fit, a third does not
MAX_STREAMS, HEADER_LIST, RESET_BURST, MAX_ACKS, MAX_SETTINGS, MAX_CONTINUATIONS = 8, 4096, 50, 100, 8, 4
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM, ACK, END_HEADERS = 1, 1, 4
PROTOCOL_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 1, 7, 8, 11
RESOURCE_EXHAUSTED = 8


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("h2abuse"), [
        "-D", "shoal.remote.transport=native",
        "-D", f"nacos.remote.server.grpc.sdk.max-inbound-message-size={LIMIT}",
        "-D", f"shoal.remote.h2.max-concurrent-streams={MAX_STREAMS}",
        "-D", f"shoal.remote.h2.max-header-list-size={HEADER_LIST}",
        "-D", f"shoal.remote.h2.reset-burst={RESET_BURST}",
        "-D", "shoal.remote.h2.reset-rate=1",
        "-D", f"shoal.remote.h2.max-outbound-ack={MAX_ACKS}",
        "-D", f"shoal.remote.h2.max-settings={MAX_SETTINGS}",
        "-D", f"shoal.remote.h2.max-continuations={MAX_CONTINUATIONS}",
        "-D", "shoal.remote.h2.preface-timeout-ms=500",
        "-D", f"shoal.remote.h2.max-read-buffer-bytes={READ_BUFFER}",
    ], auth=OPEN)
    yield server
    kill(server)


def rss(server: ServerProcess) -> int:
    value = server.proc_status().get("VmRSS")
    assert value is not None, "the node is gone"
    return value


@pytest.fixture
def bystander(node: ServerProcess) -> Iterator[H2Client]:
    """A registered connection that must keep answering (within its 5 s deadline) and a node
    whose RSS stays bounded, whatever the test does on its other connections."""
    client = H2Client(node.grpc_port)
    client.connect()
    assert client.nacos_call("InstanceRequest", register_body("h2-abuse-bystander"))[1]["resultCode"] == 200
    before = rss(node)
    yield client
    kind, body = client.nacos_call("InstanceRequest", register_body("h2-abuse-bystander", port=81))
    assert (kind, body["resultCode"]) == ("InstanceResponse", 200), body
    assert rss(node) - before < 50 * MIB, f"RSS grew by {(rss(node) - before) / MIB:.0f} MiB"
    assert node.proc.poll() is None
    client.close()


# --- a raw HTTP/2 peer: exactly the frames a test writes -----------------------------------
def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", stream_id) + payload


def request_block(extra: list[tuple[str, str]] | None = None) -> bytes:
    return bytes(hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":path", UNARY), (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])]))


@dataclass
class Seen:
    """What the node sent a raw peer, and whether it closed the connection."""

    goaway: list[int] = field(default_factory=list)  # error codes
    resets: dict[int, int] = field(default_factory=dict)  # stream id -> error code
    closed: bool = False


class RawPeer:
    """A TCP connection that has sent the preface, empty SETTINGS and the ACK of the node's."""

    def __init__(self, port: int, preface: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.seen = Seen()
        self._buf = b""
        if preface:
            self.send(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))

    def send(self, data: bytes) -> None:
        """Send, tolerating a node that has already closed on us (that is the point)."""
        with contextlib.suppress(OSError):
            self.sock.sendall(data)

    def read_some(self, timeout: float) -> None:
        """One read (up to ``timeout``); parse what came, note a close."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except OSError:  # reset: the node aborted (what it sent before may be lost)
            data = b""
        if not data:
            self.seen.closed = True
        self._parse(data)

    def read_until_closed(self, timeout: float = 10) -> Seen:
        """Read frames until the node closes the connection (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self.seen.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the node did not close the connection within {timeout}s: {self.seen}")
            self.read_some(left)
        return self.seen

    def _parse(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                return
            ftype, stream_id = self._buf[3], struct.unpack(">I", self._buf[5:9])[0] & 0x7FFFFFFF
            payload = self._buf[9:9 + length]
            self._buf = self._buf[9 + length:]
            if ftype == GOAWAY:
                self.seen.goaway.append(struct.unpack(">I", payload[4:8])[0])
            elif ftype == RST_STREAM:
                self.seen.resets[stream_id] = struct.unpack(">I", payload[:4])[0]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def peer(node: ServerProcess) -> Iterator[RawPeer]:
    made = RawPeer(node.grpc_port)
    yield made
    made.close()


# --- the abuses ----------------------------------------------------------------------------
def test_rapid_reset_past_the_budget_gets_goaway_and_is_closed(peer: RawPeer, bystander: H2Client) -> None:
    block = request_block()
    burst = b"".join(frame(HEADERS, END_HEADERS, sid, block) + frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
                     for sid in range(1, 2 * 4 * RESET_BURST, 2))
    peer.send(burst)
    seen = peer.read_until_closed()
    assert seen.goaway and seen.goaway[-1] != 0, seen  # nghttp2's reset guard says INTERNAL_ERROR


def test_resets_within_the_budget_leave_the_connection_working(node: ServerProcess, bystander: H2Client) -> None:
    client = H2Client(node.grpc_port)
    try:
        for _ in range(RESET_BURST // 2):
            stream_id = client.start(UNARY)
            client.conn.reset_stream(stream_id)
            client.flush()
        assert client.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"
        assert not client.goaway
    finally:
        client.close()


@pytest.mark.parametrize("flood", ["ping", "settings"])
def test_ack_flood_from_a_peer_that_does_not_read_is_closed(flood: str, peer: RawPeer,
                                                           bystander: H2Client) -> None:
    # a PING, or a valid SETTINGS: each wants an ACK
    one = frame(PING, 0, 0, b"flooding") if flood == "ping" else frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535))
    peer.send(one * (20 * MAX_ACKS))
    assert peer.read_until_closed().closed


def test_settings_with_too_many_entries_get_enhance_your_calm(peer: RawPeer, bystander: H2Client) -> None:
    peer.send(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", 4, 65535) for _ in range(MAX_SETTINGS + 1))))
    assert ENHANCE_YOUR_CALM in peer.read_until_closed().goaway


@pytest.mark.parametrize("count", [MAX_CONTINUATIONS + 2, 5000])
def test_continuation_flood_gets_enhance_your_calm(count: int, peer: RawPeer, bystander: H2Client) -> None:
    # MAX_CONTINUATIONS + 2 stays under the 8 that a patched libnghttp2 1.52 allows by itself.
    block = request_block()
    peer.send(frame(HEADERS, 0, 1, block[:3]) + b"".join(frame(CONTINUATION, 0, 1) for _ in range(count)))
    assert ENHANCE_YOUR_CALM in peer.read_until_closed().goaway


def test_continuations_of_a_refused_header_block_are_counted(peer: RawPeer, bystander: H2Client) -> None:
    # An oversized header list resets its stream; nghttp2 then reads its CONTINUATIONs silently.
    block = request_block([("x-big", "v" * (2 * HEADER_LIST))])
    peer.send(frame(HEADERS, 0, 1, block) + b"".join(frame(CONTINUATION, 0, 1) for _ in range(1000)))
    assert ENHANCE_YOUR_CALM in peer.read_until_closed().goaway


def test_an_oversized_header_list_resets_only_its_stream(node: ServerProcess, bystander: H2Client) -> None:
    client = H2Client(node.grpc_port)
    try:
        for _ in range(50):  # again and again: each is a stream error, never the node's
            stream_id = client.start(UNARY, extra=[("x-big", "v" * (2 * HEADER_LIST))])
            result = client.wait_end(stream_id)
            assert result.reset or result.status not in (None, 0)
        assert client.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"
    finally:
        client.close()


def test_streams_over_the_acknowledged_limit_end_the_connection(peer: RawPeer, bystander: H2Client) -> None:
    # The peer has ACKed our SETTINGS: a stream over MAX_CONCURRENT_STREAMS is then a protocol
    # error, which nghttp2 treats as the connection's (RFC 9113 §5.1.2 allows either).
    block = request_block()
    peer.send(b"".join(frame(HEADERS, END_HEADERS, sid, block) for sid in range(1, 2 * (MAX_STREAMS + 4), 2)))
    seen = peer.read_until_closed()
    assert seen.goaway == [PROTOCOL_ERROR], seen


def test_streams_over_the_limit_before_the_settings_ack_are_refused(node: ServerProcess,
                                                                    bystander: H2Client) -> None:
    peer = RawPeer(node.grpc_port, preface=False)
    try:
        block = request_block()
        extra = 4
        peer.send(PREFACE + frame(SETTINGS, 0, 0) + b"".join(
            frame(HEADERS, END_HEADERS, sid, block) for sid in range(1, 2 * (MAX_STREAMS + extra), 2)))
        deadline = time.monotonic() + 10
        while len(peer.seen.resets) < extra and not peer.seen.closed:
            assert time.monotonic() < deadline, peer.seen
            peer.read_some(0.5)
        assert sorted(peer.seen.resets.values()) == [REFUSED_STREAM] * extra, peer.seen
        assert not peer.seen.goaway
    finally:
        peer.close()


def test_unfinished_messages_past_the_read_buffer_are_refused(node: ServerProcess, bystander: H2Client) -> None:
    client = H2Client(node.grpc_port)
    try:
        message = grpc_frame(nacos("ServerCheckRequest", {"pad": "x" * (LIMIT - 200)}))
        assert len(message) <= LIMIT + 5
        streams = [client.start(UNARY) for _ in range(3)]
        for stream_id in streams:
            client.send(stream_id, message[:-100])  # each holds all but 100 bytes of its message
        third = client.wait_end(streams[2])
        assert third.status == RESOURCE_EXHAUSTED and "read buffer" in third.message
        client.send(streams[0], message[-100:], end=True)  # finished messages are still answered
        first = client.wait_end(streams[0])
        assert first.status == 0 and first.messages()[0][0] == "ServerCheckResponse"
    finally:
        client.close()


@pytest.mark.parametrize("sent", [b"", b"PRI * HTTP/2.0\r\n"], ids=["nothing", "half-a-preface"])
def test_a_connection_without_the_preface_is_closed_after_the_timeout(sent: bytes, node: ServerProcess,
                                                                     bystander: H2Client) -> None:
    peer = RawPeer(node.grpc_port, preface=False)
    try:
        peer.send(sent)
        assert peer.read_until_closed().closed
    finally:
        peer.close()


def garbage(rng: random.Random, i: int) -> bytes:
    """Bytes that are not a usable HTTP/2 connection, of several kinds."""
    noise = rng.randbytes(rng.randrange(1, 4096))
    kind = i % 6
    if kind == 0:
        return noise
    if kind == 1:
        return b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + noise
    if kind == 2:  # a TLS ClientHello's start on a plaintext port
        return b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + noise
    if kind == 3:  # a good preface, then frames of random types, flags, streams and lengths
        return PREFACE + frame(SETTINGS, 0, 0) + b"".join(
            frame(rng.randrange(0, 12), rng.randrange(0, 256), rng.randrange(0, 8), rng.randbytes(rng.randrange(0, 64)))
            for _ in range(rng.randrange(1, 20)))
    if kind == 4:  # a good preface, then a frame header claiming 16 MiB
        return PREFACE + frame(SETTINGS, 0, 0) + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + noise
    return PREFACE + noise  # a good preface, then noise


def test_500_garbage_connections_leave_no_traceback_and_no_memory(node: ServerProcess,
                                                                 bystander: H2Client) -> None:
    rng = random.Random(10)

    def one(i: int) -> None:
        with socket.create_connection(("127.0.0.1", node.grpc_port), timeout=10) as sock:
            try:
                sock.sendall(garbage(rng, i))
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):  # until the node closes
                    pass
            except OSError:  # reset by the node: fine
                pass

    for i in range(30):  # warm up the allocator before the baseline
        one(i)
    baseline = rss(node)
    for i in range(500):
        one(i)
        if i % 100 == 99:
            assert bystander.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"
    assert node.proc.poll() is None
    assert "Traceback" not in node.log()
    poll_until(lambda: rss(node) - baseline < 4 * MIB, 20, what="RSS back near its baseline")


def test_pipelined_queries_from_a_peer_that_never_reads_build_bounded_answers(tmp_path: Path) -> None:
    """Wide-open windows, 600 pipelined queries of a ~100 KB service, nothing read: the node
    builds answers only up to ``shoal.remote.outbound-queue-bytes`` before it stops reading,
    then ejects the peer after the write-stall timeout; RSS stays bounded throughout."""
    server = start_server(tmp_path, ["-D", "shoal.remote.transport=native",
                                     "-D", "shoal.remote.outbound-queue-bytes=1048576",
                                     "-D", "shoal.remote.write-stall-timeout-ms=3000"], auth=OPEN)
    try:
        publisher = H2Client(server.grpc_port)
        publisher.connect()
        instances = [register_body("h2-big", ip=f"10.3.0.{i % 250}", port=1000 + i,
                                   metadata={"pad": "x" * 400})["instance"] for i in range(200)]
        _, body = publisher.nacos_call("BatchInstanceRequest", {
            "headers": {}, "namespace": "public", "serviceName": "h2-big", "groupName": "DEFAULT_GROUP",
            "type": "batchRegisterInstance", "module": "naming", "instances": instances})
        assert body["resultCode"] == 200, body
        query = {"headers": {}, "namespace": "public", "serviceName": "h2-big", "groupName": "DEFAULT_GROUP",
                 "module": "naming", "cluster": "", "healthyOnly": False, "udpPort": 0}
        _, body = publisher.nacos_call("ServiceQueryRequest", query)
        assert len(body["serviceInfo"]["hosts"]) == 200
        answer_size = len(json.dumps(body))

        hog = H2Client(server.grpc_port, rcvbuf=4096)
        hog.connect()
        hog.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
        hog.conn.increment_flow_control_window(2**31 - 1 - 65535)
        hog.flush()
        assert server.gauge("connections") == 2
        before = rss(server)
        count = 600
        for _ in range(count):  # the requests only: the answers are never read
            stream_id = hog.conn.get_next_available_stream_id()
            hog.conn.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", UNARY),
                                              (":authority", "127.0.0.1"), ("content-type", "application/grpc")])
            hog.conn.send_data(stream_id, grpc_frame(nacos("ServiceQueryRequest", query)), end_stream=True)
        with contextlib.suppress(OSError):
            hog.sock.sendall(hog.conn.data_to_send())
        peak = before

        def ejected() -> bool:
            nonlocal peak
            peak = max(peak, rss(server))
            assert publisher.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"
            return server.gauge("connections") == 1  # the publisher's alone

        poll_until(ejected, 30, interval=0.2, what="the peer that never reads to be closed")
        # Unbounded, the node would have built count * answer_size (~60 MB) of answers.
        assert count * answer_size > 50 * MIB
        assert peak - before < 25 * MIB, f"RSS grew by {(peak - before) / MIB:.0f} MiB"
        assert "Traceback" not in server.log()
    finally:
        kill(server)


def test_held_requests_still_see_the_window_updates_that_let_answers_out(tmp_path: Path) -> None:
    """A well-behaved client with the default 64 KiB windows asks for several answers bigger
    than the window and than ``outbound-queue-bytes`` at once: the node holds the later
    requests but keeps reading, so the client's WINDOW_UPDATEs drain the answers and every
    call completes (stopping reading deadlocked this, e.g. a peer loading snapshot pages)."""
    server = start_server(tmp_path, ["-D", "shoal.remote.transport=native",
                                     "-D", "shoal.remote.outbound-queue-bytes=65536"], auth=OPEN)
    try:
        client = H2Client(server.grpc_port)
        client.connect()
        instances = [register_body("h2-wide", ip=f"10.4.0.{i % 250}", port=1000 + i,
                                   metadata={"pad": "x" * 400})["instance"] for i in range(200)]
        _, body = client.nacos_call("BatchInstanceRequest", {
            "headers": {}, "namespace": "public", "serviceName": "h2-wide", "groupName": "DEFAULT_GROUP",
            "type": "batchRegisterInstance", "module": "naming", "instances": instances})
        assert body["resultCode"] == 200, body
        query = nacos("ServiceQueryRequest", {"headers": {}, "namespace": "public", "serviceName": "h2-wide",
                                              "groupName": "DEFAULT_GROUP", "module": "naming", "cluster": "",
                                              "healthyOnly": False, "udpPort": 0})
        streams = [client.start(UNARY) for _ in range(4)]
        for stream_id in streams:
            client.send(stream_id, grpc_frame(query), end=True)
        for stream_id in streams:
            result = client.wait_end(stream_id, timeout=20)
            assert result.status == 0, (result.status, result.message)
            kind, answer = result.messages()[0]
            assert kind == "QueryServiceResponse" and len(answer["serviceInfo"]["hosts"]) == 200
            assert len(result.data) > 65536  # bigger than the window and the bound
        client.close()
    finally:
        kill(server)
