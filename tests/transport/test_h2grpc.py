"""The h2grpc session in memory, against the ``h2`` client library: gRPC message framing
across arbitrary DATA frame splits, limits, trailers, and output that a real client parses."""

from __future__ import annotations

import gc
import struct
from typing import Any

import h2.config as h2_config
import h2.connection
import h2.events
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal._ext import h2grpc

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


# --- abuse limits: raw frames fed straight to the session -------------------
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 1, 4
ENHANCE_YOUR_CALM, REFUSED_STREAM = 11, 7


def raw(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", sid) + payload


def header_block(extra: list[tuple[str, str]] | None = None) -> bytes:
    import hpack
    return bytes(hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", PATH),
                                         (":authority", "x"), ("content-type", "application/grpc"),
                                         *(extra or [])]))


def goaways(out: bytes) -> list[int]:
    """Error codes of the GOAWAY frames in a server's output."""
    codes, at = [], 0
    while at + 9 <= len(out):
        length = int.from_bytes(out[at:at + 3], "big")
        if out[at + 3] == GOAWAY:
            codes.append(struct.unpack(">I", out[at + 13:at + 17])[0])
        at += 9 + length
    return codes


def opened(max_message: int = 1 << 20, **limits: Any) -> Any:
    session = h2grpc.H2Session(max_message, **limits)
    assert not session.preface_received
    session.feed(PREFACE + raw(SETTINGS, 0, 0))
    assert session.preface_received
    session.pending_output()
    session.feed(raw(SETTINGS, 1, 0))  # ACK: our SETTINGS (stream window, limits) are in force
    return session


def test_continuations_past_the_bound_end_the_session_with_enhance_your_calm() -> None:
    session = opened(max_continuations=3)
    block = header_block()
    ok = raw(HEADERS, 0, 1, block[:4]) + raw(CONTINUATION, 0, 1, block[4:8]) + \
        raw(CONTINUATION, END_HEADERS, 1, block[8:])
    assert [e[0] for e in session.feed(ok)] == [h2grpc.EV_HEADERS]  # 2 CONTINUATIONs: within the bound
    # The count follows frame headers split across reads (kept whole for the CONTINUATIONs here:
    # a patched nghttp2 1.52 counts one more each time a CONTINUATION header arrives in pieces).
    head = raw(HEADERS, 0, 3, block[:4])
    conts = [raw(CONTINUATION, 0, 3, b"") for _ in range(4)]
    for chunk in (head[:5], head[5:11], head[11:], conts[0] + conts[1], conts[2], conts[3]):
        session.feed(chunk)
    assert session.abuse is not None and "CONTINUATION" in session.abuse
    assert goaways(session.pending_output()) == [ENHANCE_YOUR_CALM] and session.is_done()


def test_continuations_of_a_refused_header_block_are_counted_too() -> None:
    # nghttp2 1.52 decodes the CONTINUATIONs of a block it refused without any callback.
    session = opened(max_continuations=2, max_header_list=100)
    block = header_block([("x-big", "v" * 400)])
    session.feed(raw(HEADERS, 0, 1, block))  # over the header list: the stream is reset
    session.feed(b"".join(raw(CONTINUATION, 0, 1, b"") for _ in range(3)))
    assert session.abuse is not None and ENHANCE_YOUR_CALM in goaways(session.pending_output())


def test_a_header_list_over_the_limit_resets_only_its_stream() -> None:
    session = opened(max_header_list=400)  # a plain request is ~250 (RFC 9113 §6.5.2)
    session.feed(raw(HEADERS, END_HEADERS, 1, header_block([("x-big", "v" * 400)])))
    out = session.pending_output()
    assert b"\x00\x00\x04\x03" in out and not goaways(out)  # RST_STREAM of stream 1, no GOAWAY
    events = session.feed(raw(HEADERS, END_HEADERS, 3, header_block()))
    assert (h2grpc.EV_HEADERS, 3) in [e[:2] for e in events] and session.abuse is None


def test_rapid_reset_past_the_budget_gets_goaway() -> None:
    session = opened(reset_burst=10, reset_rate=1)
    block = header_block()
    for sid in range(1, 2 * 30, 2):
        session.feed(raw(HEADERS, END_HEADERS, sid, block) + raw(RST_STREAM, 0, sid, struct.pack(">I", 8)))
        if session.goaway_sent:
            break
    out = session.pending_output()
    assert session.goaway_sent and goaways(out) and session.abuse is not None


def test_resets_within_the_budget_are_fine() -> None:
    session = opened(reset_burst=50, reset_rate=1)
    block = header_block()
    for sid in range(1, 2 * 30, 2):
        session.feed(raw(HEADERS, END_HEADERS, sid, block) + raw(RST_STREAM, 0, sid, struct.pack(">I", 8)))
    assert not goaways(session.pending_output()) and session.abuse is None


def test_ping_flood_without_reading_the_acks_ends_the_session() -> None:
    session = opened(max_outbound_ack=50)
    with pytest.raises(h2grpc.H2Error):
        session.feed(b"".join(raw(PING, 0, 0, b"%08d" % i) for i in range(60)))
    assert session.abuse is not None and ENHANCE_YOUR_CALM in goaways(session.pending_output())


def test_settings_with_too_many_entries_end_the_session() -> None:
    session = opened(max_settings=4)
    session.feed(raw(SETTINGS, 0, 0, b"".join(struct.pack(">HI", 3, 100 + i) for i in range(5))))
    assert ENHANCE_YOUR_CALM in goaways(session.pending_output()) and session.abuse is not None
    assert session.is_done()


def test_unfinished_messages_share_one_bounded_read_buffer() -> None:
    session = opened(max_message=400_000, max_read_buffer=300_000)  # the budget grows to one max message
    block = header_block()
    failed: list[int] = []
    for sid in (1, 3, 5):
        session.feed(raw(HEADERS, END_HEADERS, sid, block))
        events = session.feed(raw(0, 0, sid, struct.pack(">BI", 0, 400_000) + b"x" * 1000))
        failed += [e[1] for e in events if e[0] == h2grpc.EV_FAILED and e[2] == h2grpc.RESOURCE_EXHAUSTED]
    assert failed == [3, 5] and session.read_buffered == 400_000  # the first fits (one max message)
    rest = 400_000 - 1000
    events = session.feed(b"".join(raw(0, END_STREAM if at + 16_000 >= rest else 0, 1, b"x" * min(16_000, rest - at))
                                   for at in range(0, rest, 16_000)))
    assert [len(e[2]) for e in events if e[0] == h2grpc.EV_MESSAGE] == [400_000]
    assert session.read_buffered == 0
    session.feed(raw(HEADERS, END_HEADERS, 7, block))
    events = session.feed(raw(0, 0, 7, struct.pack(">BI", 0, 400_000) + b"x"))
    assert not [e for e in events if e[0] == h2grpc.EV_FAILED]  # room again once the first completed
    session.feed(raw(RST_STREAM, 0, 7, struct.pack(">I", 8)))
    assert session.read_buffered == 0  # a reset stream gives its reservation back


def test_a_large_answer_is_written_from_the_message_itself_not_a_copy() -> None:
    # the query answer (~37 KB) must reach the socket without being copied into frames
    pair = Pair()
    sid = pair.open()
    pair.client.send_data(sid, frame(b"q"), end_stream=True)
    pair.exchange()
    message = bytes(range(256)) * 40  # 10 KB: fits one DATA frame and the initial window
    pair.server.reply(sid, message)
    parts = pair.server.output_parts()
    assert any(part is message or (isinstance(part, memoryview) and part.obj is message) for part in parts)
    pair.client_events += pair.client.receive_data(b"".join(parts))
    _, data, trailers = pair.response(sid)
    assert data == frame(message) and trailers["grpc-status"] == "0"
    assert pair.server.output_parts() == []


def test_sessions_sharing_one_frame_buffer_keep_their_own_output() -> None:
    # Every session serializes its frames into one process-wide buffer (16 KB less per idle
    # connection): interleaved sessions must still each send exactly their own frames, also a
    # trailer too long for one buffer chunk (the extra chunks are the session's own).
    pairs = [Pair() for _ in range(3)]
    assert all(p.server.shares_framebuf for p in pairs)
    sids = []
    for i, pair in enumerate(pairs):
        sid = pair.open()
        pair.client.send_data(sid, frame(b"q%d" % i), end_stream=True)
        pair.exchange()
        sids.append(sid)
    long_message = "x" * 20000
    for i, (pair, sid) in enumerate(zip(pairs, sids, strict=True)):
        if i == 1:
            pair.server.send_message(sid, b"answer %d" % i)
            pair.server.send_trailers(sid, 13, long_message)
        else:
            pair.server.reply(sid, b"answer %d" % i)
    outputs = [pair.server.pending_output() for pair in pairs]  # all packed before any is read
    for i, (pair, sid, out) in enumerate(zip(pairs, sids, outputs, strict=True)):
        pair.client_events += pair.client.receive_data(out)
        _, data, trailers = pair.response(sid)
        assert data == frame(b"answer %d" % i)
        assert trailers["grpc-status"] == ("13" if i == 1 else "0")
        if i == 1:
            assert trailers["grpc-message"] == long_message
    del pairs  # freeing sessions must not free the shared buffer: new ones still work
    pair = Pair()
    sid = pair.open()
    pair.client.send_data(sid, frame(b"again"), end_stream=True)
    pair.exchange()
    pair.server.reply(sid, b"fine")
    pair.exchange()
    assert pair.response(sid)[1] == frame(b"fine")


# --- a callback of ours that raises, and the library version contract --------------------------
def test_an_exception_in_a_callback_ends_the_session_and_is_raised_after_nghttp2_returns() -> None:
    # A stream whose state is corrupted (what a bug in the callbacks would do) makes the DATA
    # callback raise: feed() raises H2CallbackError naming the callback, the exception as cause,
    # and the session queues a GOAWAY INTERNAL_ERROR instead of ending without a trace.
    session = opened()
    session.feed(raw(HEADERS, END_HEADERS, 1, header_block()))
    session.streams[1] = "not a stream"
    with pytest.raises(h2grpc.H2CallbackError) as caught:
        session.feed(raw(0, 0, 1, frame(b"body")))
    assert "_on_data_chunk raised TypeError" in str(caught.value)
    assert isinstance(caught.value.__cause__, TypeError)
    assert goaways(session.pending_output()) == [2]  # INTERNAL_ERROR


def test_an_exception_in_a_sending_callback_is_raised_by_output_parts() -> None:
    session = opened()
    session.feed(raw(HEADERS, END_HEADERS, 1, header_block()) + raw(0, END_STREAM, 1, frame(b"q")))
    session.reply(1, b"answer")
    session.streams[1] = 42  # _read_data finds no stream object where nghttp2 asks for data
    with pytest.raises(h2grpc.H2CallbackError) as caught:
        session.output_parts()
    assert "_read_data raised TypeError" in str(caught.value)
    with pytest.raises(h2grpc.H2Error):  # and the session never sends again
        session.output_parts()


def test_only_the_tested_libnghttp2_is_accepted() -> None:
    assert h2grpc.LIBRARY_VERSION_NUM in h2grpc.TESTED_LIBRARY_VERSIONS  # else this module would not import
    h2grpc.check_library(0x013400, "1.52.0")
    for num, text in ((0x013D00, "1.61.0"), (0x013300, "1.51.0"), (0x023400, "2.52.0")):
        with pytest.raises(ImportError) as caught:
            h2grpc.check_library(num, text)
        message = str(caught.value)
        assert f"libnghttp2 {text}" in message and "shoal.remote.transport=grpcio" in message


def test_library_memory_is_given_back_when_sessions_end() -> None:
    gc.collect()  # sessions of earlier tests, held in reference cycles
    before = h2grpc.library_bytes()
    pairs = [Pair() for _ in range(20)]
    held = h2grpc.library_bytes() - before
    assert held > 0
    del pairs
    gc.collect()
    assert h2grpc.library_bytes() == before
