"""The h2grpc session in memory, against the ``h2`` client library: gRPC message framing
across arbitrary DATA frame splits, limits, trailers, and output that a real client parses."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from shoal.kernels import NO_EXTENSIONS

if NO_EXTENSIONS:
    pytest.skip("SHOAL_NO_EXTENSIONS is set: h2grpc has no pure-Python twin", allow_module_level=True)
h2grpc = pytest.importorskip("shoal._ext.h2grpc")
h2_config = pytest.importorskip("h2.config")
import h2.connection  # noqa: E402
import h2.events  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.c_extension
PATH = "/Request/request"


def frame(message: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(message)) + message


class Pair:
    """A client (h2) and a server (H2Session) wired back to back in memory."""

    def __init__(self, max_message: int = 1 << 20) -> None:
        self.server = h2grpc.H2Session(max_message)
        self.client = h2.connection.H2Connection(h2_config.H2Configuration(client_side=True,
                                                                           header_encoding="utf-8"))
        self.client.initiate_connection()
        self.events: list[tuple[int, int, Any, Any]] = []
        self.client_events: list[Any] = []
        self.exchange()

    def exchange(self) -> None:
        for _ in range(20):
            out = self.client.data_to_send()
            if out:
                self.events += self.server.feed(out)
            back = self.server.pending_output()
            self.events += self.server.take_events() or []
            if back:
                self.client_events += self.client.receive_data(back)
            if not out and not back:
                return

    def open(self, path: str = PATH, extra: list[tuple[str, str]] | None = None) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                       (":authority", "x"), ("content-type", "application/grpc"),
                                       *(extra or [])])
        return sid

    def of(self, kind: int) -> list[tuple[int, int, Any, Any]]:
        return [e for e in self.events if e[0] == kind]

    def response(self, sid: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        headers: dict[str, str] = {}
        trailers: dict[str, str] = {}
        data = b""
        for ev in self.client_events:
            if getattr(ev, "stream_id", None) != sid:
                continue
            if isinstance(ev, h2.events.ResponseReceived):
                headers = dict(ev.headers)
            elif isinstance(ev, h2.events.TrailersReceived):
                trailers = dict(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                data += ev.data
        return headers, data, trailers


def test_headers_message_half_close_then_reply() -> None:
    pair = Pair()
    sid = pair.open(extra=[("grpc-timeout", "5S")])
    pair.client.send_data(sid, frame(b"hello"), end_stream=True)
    pair.exchange()
    kinds = [e[0] for e in pair.events]
    assert kinds == [h2grpc.EV_HEADERS, h2grpc.EV_MESSAGE, h2grpc.EV_HALF_CLOSE]
    _, _, path, headers = pair.events[0]
    assert path == PATH and headers["grpc-timeout"] == "5S" and headers["content-type"] == "application/grpc"
    assert pair.events[1][2] == b"hello"
    pair.server.reply(sid, b"world")
    pair.exchange()
    headers, data, trailers = pair.response(sid)
    assert headers[":status"] == "200" and data == frame(b"world") and trailers == {"grpc-status": "0"}
    assert pair.of(h2grpc.EV_CLOSED) and not pair.server.streams and pair.server.backlog == 0


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(st.binary(max_size=3000), min_size=1, max_size=5),
       cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=8))
def test_messages_are_reassembled_across_any_data_split(messages: list[bytes], cuts: list[int]) -> None:
    pair = Pair()
    sid = pair.open()
    wire = b"".join(frame(m) for m in messages)
    at = 0
    for cut in sorted(set(cuts)):
        if at < cut < len(wire):
            pair.client.send_data(sid, wire[at:cut])
            pair.exchange()
            at = cut
    pair.client.send_data(sid, wire[at:], end_stream=True)
    pair.exchange()
    assert [e[2] for e in pair.of(h2grpc.EV_MESSAGE)] == messages


def test_declared_size_over_the_limit_fails_the_call_without_waiting_for_the_body() -> None:
    pair = Pair(max_message=100)
    sid = pair.open()
    pair.client.send_data(sid, struct.pack(">BI", 0, 10_000) + b"x" * 10)
    pair.exchange()
    assert pair.of(h2grpc.EV_FAILED)[0][2] == h2grpc.RESOURCE_EXHAUSTED and not pair.of(h2grpc.EV_MESSAGE)
    headers, _, _ = pair.response(sid)  # trailers-only
    assert headers["grpc-status"] == str(h2grpc.RESOURCE_EXHAUSTED) and "100" in headers["grpc-message"]


def test_compressed_flag_fails_the_call_unimplemented() -> None:
    pair = Pair()
    sid = pair.open()
    pair.client.send_data(sid, frame(b"zz", flag=1), end_stream=True)
    pair.exchange()
    headers, _, _ = pair.response(sid)
    assert headers["grpc-status"] == str(h2grpc.UNIMPLEMENTED)


def test_stream_messages_then_trailers_with_an_encoded_message() -> None:
    pair = Pair()
    sid = pair.open("/BiRequestStream/requestBiStream")
    pair.exchange()
    assert pair.server.send_message(sid, b"a" * 70_000)  # over one frame and the initial window
    assert pair.server.send_message(sid, b"b")
    pair.server.send_trailers(sid, h2grpc.UNAVAILABLE, "gone: 100% ünicode")
    acked = 0
    for _ in range(10):  # the client reads: it opens its window as it acknowledges the data
        pair.exchange()
        for ev in pair.client_events[acked:]:
            if isinstance(ev, h2.events.DataReceived) and ev.flow_controlled_length:
                pair.client.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        acked = len(pair.client_events)
        if pair.response(sid)[2]:
            break
    _, data, trailers = pair.response(sid)
    assert data == frame(b"a" * 70_000) + frame(b"b")
    assert trailers["grpc-status"] == str(h2grpc.UNAVAILABLE)
    assert trailers["grpc-message"] == "gone: 100%25 %C3%BCnicode"
    assert not pair.server.send_message(sid, b"late")  # the stream is ended


def test_rst_stream_closes_with_its_code() -> None:
    pair = Pair()
    sid = pair.open()
    pair.exchange()
    pair.client.reset_stream(sid, error_code=8)
    pair.exchange()
    assert pair.of(h2grpc.EV_CLOSED) == [(h2grpc.EV_CLOSED, sid, 8, None)]


def test_goaway_and_bad_preface() -> None:
    pair = Pair()
    pair.server.goaway()
    pair.exchange()
    assert any(isinstance(ev, h2.events.ConnectionTerminated) for ev in pair.client_events)
    with pytest.raises(h2grpc.H2Error):
        h2grpc.H2Session().feed(b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 40)
