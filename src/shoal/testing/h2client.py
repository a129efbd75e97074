"""A bare HTTP/2 gRPC client (the ``h2`` library over a blocking socket) for byte-level tests:
it sends exactly the frames a test asks for and reads only when told to."""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events

from shoal.kernels import payload as payload_codec

UNARY = "/Request/request"
STREAM = "/BiRequestStream/requestBiStream"


def grpc_frame(message: bytes, compressed: bool = False, declared: int | None = None) -> bytes:
    """The 5-byte gRPC prefix (flag, big-endian length) and the message."""
    size = len(message) if declared is None else declared
    return struct.pack(">BI", 1 if compressed else 0, size) + message


def nacos(type_name: str, body: Any = None) -> bytes:
    return payload_codec.encode(type_name, json.dumps(body if body is not None else {}).encode())


def _text_headers(headers: Any) -> dict[str, str]:
    """Header pairs as text (the connection decodes them as UTF-8; the library's types allow bytes)."""
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in headers or ()}


@dataclass
class StreamResult:
    """What the server sent on one stream so far."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: bool = False

    @property
    def status(self) -> int | None:
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    def take_messages(self) -> list[tuple[str, dict[str, Any]]]:
        """The complete messages received since the last take (they are dropped from ``data``)."""
        out: list[tuple[str, dict[str, Any]]] = []
        view, at = bytes(self.data), 0
        while len(view) - at >= 5:
            _, size = struct.unpack(">BI", view[at:at + 5])
            if len(view) - at - 5 < size:
                break
            type_name, _, _, body = payload_codec.decode(view[at + 5:at + 5 + size])
            out.append((type_name, json.loads(body) if body else {}))
            at += 5 + size
        del self.data[:at]
        return out

    def messages(self) -> list[tuple[str, dict[str, Any]]]:
        """The gRPC messages received, decoded as Nacos payloads (type, JSON body)."""
        out, buf = [], bytes(self.data)
        while len(buf) >= 5:
            _, size = struct.unpack(">BI", buf[:5])
            type_name, _, _, body = payload_codec.decode(buf[5:5 + size])
            out.append((type_name, json.loads(body) if body else {}))
            buf = buf[5 + size:]
        return out


class H2Client:
    """One TCP connection = one HTTP/2 session = one Nacos connection."""

    def __init__(self, port: int, rcvbuf: int = 0, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # a small receive buffer makes a client that stops reading stall the server fast
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(5)
        self.sock.connect((host, port))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.streams: dict[int, StreamResult] = {}
        self.pings: list[bytes] = []
        self.goaway = False
        self.closed = False
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(self, path: str, *, end: bool = False, extra: list[tuple[str, str]] | None = None) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])]
        self.conn.send_headers(stream_id, headers, end_stream=end)
        self.streams[stream_id] = StreamResult()
        self.flush()
        return stream_id

    def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        size = self.conn.max_outbound_frame_size
        chunks = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
        for i, chunk in enumerate(chunks):
            need = len(chunk)
            self.wait(lambda n=need: self.conn.local_flow_control_window(stream_id) >= n, what="send window")
            self.conn.send_data(stream_id, chunk, end_stream=end and i == len(chunks) - 1)
        self.flush()

    def call(self, path: str, message: bytes, timeout: float = 5) -> StreamResult:
        stream_id = self.start(path)
        self.send(stream_id, grpc_frame(message), end=True)
        return self.wait_end(stream_id, timeout)

    def nacos_call(self, type_name: str, body: Any = None) -> tuple[str, dict[str, Any]]:
        result = self.call(UNARY, nacos(type_name, body))
        assert result.status == 0, (result.status, result.message)
        return result.messages()[0]

    def connect(self) -> tuple[str, int]:
        """ServerCheck, the bi stream and ConnectionSetup; (connection id, stream id) once acked."""
        kind, body = self.nacos_call("ServerCheckRequest", {})
        assert kind == "ServerCheckResponse", body
        stream_id = self.start(STREAM)
        self.send(stream_id, grpc_frame(nacos("ConnectionSetupRequest", {
            "clientVersion": "h2-test", "labels": {"source": "sdk", "module": "naming"}, "abilityTable": {}})))
        self.wait(lambda: len(self.streams[stream_id].messages()) >= 1, what="SetupAck")
        return str(body["connectionId"]), stream_id

    def pump(self, timeout: float) -> None:
        """Read once (up to ``timeout``) and handle what arrived."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        for event in self.conn.receive_data(data):
            self._on(event)
        self.flush()

    def _on(self, event: Any) -> None:
        sid = getattr(event, "stream_id", None)
        result = self.streams.get(sid) if sid is not None else None
        if isinstance(event, h2.events.ResponseReceived) and result is not None:
            result.headers = _text_headers(event.headers)
        elif isinstance(event, h2.events.TrailersReceived) and result is not None:
            result.trailers = _text_headers(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            if result is not None:
                result.data += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and result is not None:
            result.ended = True
        elif isinstance(event, h2.events.StreamReset) and result is not None:
            result.reset = True
        elif isinstance(event, h2.events.PingAckReceived):
            self.pings.append(event.ping_data)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = True

    def wait(self, predicate: Any, timeout: float = 5, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            if self.closed:
                raise AssertionError(f"connection closed while waiting for {what}")
            self.pump(min(left, 0.5))

    def wait_end(self, stream_id: int, timeout: float = 5) -> StreamResult:
        result = self.streams[stream_id]
        self.wait(lambda: result.ended or result.reset, timeout, what=f"stream {stream_id} to end")
        return result

    def wait_closed(self, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while not self.closed:
            if time.monotonic() > deadline:
                raise AssertionError("connection not closed by the server")
            self.pump(0.5)

    def close(self) -> None:
        self.sock.close()
