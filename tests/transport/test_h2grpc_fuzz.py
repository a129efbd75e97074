"""Arbitrary bytes, split at arbitrary points, fed to one h2grpc session.

Whatever arrives, a session must: never crash the process, let no exception out of ``feed`` or
``output_parts`` other than ``H2Error`` (the owner then closes the connection), never raise
``H2CallbackError`` (that is a bug of ours, not the peer's), keep its memory bounded (the
read-buffer budget, and what libnghttp2 itself holds), and either answer with well-formed
HTTP/2 frames or close cleanly (``H2Error``, ``abuse`` set, or ``is_done()``).

Two generators: plain random bytes (mostly a bad preface), and a valid preface followed by
frames of random type, flags, stream and payload, among them real header blocks and DATA whose
gRPC prefix announces any size, so that the frame parser, the callbacks and the reassembly are
all reached.
"""

from __future__ import annotations

import itertools
import struct

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal._ext import h2grpc

pytestmark = pytest.mark.c_extension

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_MESSAGE = 2048
MAX_READ_BUFFER = 8192
MAX_STREAMS = 8
#: what libnghttp2 may hold for one such session (measured: ~10 KB idle; HPACK tables, streams)
LIBRARY_BYTES_BOUND = 512 * 1024
EVENT_KINDS = {h2grpc.EV_HEADERS, h2grpc.EV_MESSAGE, h2grpc.EV_HALF_CLOSE, h2grpc.EV_CLOSED, h2grpc.EV_FAILED}


def _frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", sid) + payload


def _header_block(path: str) -> bytes:
    return bytes(hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                         (":authority", "x"), ("content-type", "application/grpc")]))


_sids = st.sampled_from([0, 1, 3, 5, 7, 2, 0x7FFFFFFF])
_grpc_data = st.builds(lambda flag, size, body: struct.pack(">BI", flag, size) + body,
                       st.integers(0, 1), st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1)),
                       st.binary(max_size=64))
_paths = st.sampled_from(["/Request/request", "/BiRequestStream/requestBiStream", "/x"])
_payloads = st.one_of(st.binary(max_size=64), _grpc_data, _paths.map(_header_block))
# mostly the frames a gRPC client sends (so that streams open and messages arrive), some random
_request_frames = st.one_of(
    st.builds(_frame, st.just(1), st.sampled_from([4, 5, 0]), st.sampled_from([1, 3, 5, 7]),
              _paths.map(_header_block)),
    st.builds(_frame, st.just(0), st.sampled_from([0, 1]), st.sampled_from([1, 3, 5, 7]),
              st.one_of(_grpc_data, st.binary(max_size=64))),
    st.builds(_frame, st.just(3), st.just(0), st.sampled_from([1, 3, 5]), st.just(struct.pack(">I", 8))),
)
_frames = st.one_of(_request_frames, _request_frames,
                    st.builds(_frame, st.integers(0, 12), st.integers(0, 255), _sids, _payloads))
_h2_input = st.builds(lambda settings_frame, frames: PREFACE + settings_frame + b"".join(frames),
                      st.sampled_from([_frame(4, 0, 0, b""), _frame(4, 0, 0, struct.pack(">HI", 4, 65535))]),
                      st.lists(_frames, max_size=24))


def _conversation(streams: list[tuple[str, list[bytes], bool]], noise: list[bytes]) -> bytes:
    """Well-formed calls (increasing stream ids, DATA of gRPC messages of any announced size),
    with random frames appended."""
    out = [PREFACE, _frame(4, 0, 0, b"")]
    for i, (path, datas, end) in enumerate(streams):
        sid = 1 + 2 * i
        out.append(_frame(1, 4, sid, _header_block(path)))
        out += [_frame(0, 1 if end and k == len(datas) - 1 else 0, sid, d) for k, d in enumerate(datas)]
    return b"".join(out + noise)


_calls = st.lists(st.tuples(_paths, st.lists(st.one_of(_grpc_data, st.binary(max_size=300)), max_size=4),
                            st.booleans()), min_size=1, max_size=6)
_inputs = st.one_of(st.binary(max_size=256), _h2_input,
                    st.builds(_conversation, _calls, st.lists(_frames, max_size=3)))


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def _well_formed(out: bytes) -> bool:
    """Whole frames of known types, nothing left over."""
    at = 0
    while at < len(out):
        if at + 9 > len(out):
            return False
        length = int.from_bytes(out[at:at + 3], "big")
        if out[at + 3] > 9:
            return False
        at += 9 + length
    return at == len(out)


def _output(session: h2grpc.H2Session) -> bytes | None:
    """What the owner would write: the bytes, or None when the session refuses to send (H2Error)."""
    try:
        return b"".join(bytes(p) for p in session.output_parts())
    except h2grpc.H2CallbackError:
        raise
    except h2grpc.H2Error:
        return None


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_inputs, cuts=st.lists(st.integers(0, 4096), max_size=8))
def test_any_bytes_any_split_are_answered_or_closed_cleanly(data: bytes, cuts: list[int]) -> None:
    base = h2grpc.library_bytes()
    session = h2grpc.H2Session(MAX_MESSAGE, max_concurrent_streams=MAX_STREAMS, max_read_buffer=MAX_READ_BUFFER)
    closed = False
    written = _output(session) or b""  # what the owner writes on connect: our SETTINGS
    for chunk in _chunks(data, cuts):
        try:
            events = session.feed(chunk)
        except h2grpc.H2CallbackError:
            raise
        except h2grpc.H2Error:
            closed = True  # the owner writes the GOAWAY, if it can, and closes
            out = _output(session)
            assert out is None or _well_formed(out)
            break
        assert isinstance(events, list)
        for kind, sid, _a, _b in events:
            assert kind in EVENT_KINDS and sid > 0
            if kind == h2grpc.EV_MESSAGE:
                assert len(_a) <= MAX_MESSAGE
        for kind, _sid, _a, _b in session.take_events() or []:
            assert kind in EVENT_KINDS
        assert session.read_buffered <= MAX_READ_BUFFER
        assert h2grpc.library_bytes() - base <= LIBRARY_BYTES_BOUND
        out = _output(session)
        assert out is not None and _well_formed(out)
        written += out
        if session.abuse is not None or session.is_done():
            closed = True
            break
    if not closed:
        # still open: it answered (at least its own SETTINGS, first) and waits for more
        assert written[3:4] == b"\x04" and _well_formed(written)
    del session  # freed at once (no reference cycle): nothing the library held outlives it
    assert h2grpc.library_bytes() <= base  # (<=: a collection may free an earlier test's sessions meanwhile)
