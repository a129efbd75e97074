"""The native gRPC transport (libnghttp2) at the HTTP/2 byte level: each bad or unusual input
gets its gRPC status, and another live connection of the same node is unharmed by it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.transport.selection import native_available

pytest.importorskip("h2", reason="the h2 dev dependency drives HTTP/2 frames directly")
from shoal.testing import OPEN, ServerProcess, kill, start_server
from shoal.testing.h2client import STREAM, UNARY, H2Client, grpc_frame, nacos
from shoal.testing.rawclient import register_body

pytestmark = pytest.mark.skipif(not native_available(), reason="the h2grpc extension is not built")

NATIVE = ["-D", "shoal.remote.transport=native"]
LIMIT = 65536
OK, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 0, 4, 8, 12, 13, 14


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("h2"), [
        *NATIVE, "-D", f"nacos.remote.server.grpc.sdk.max-inbound-message-size={LIMIT}"], auth=OPEN)
    yield server
    kill(server)


@pytest.fixture
def bystander(node: ServerProcess) -> Iterator[H2Client]:
    """A registered connection that must keep working whatever the test does elsewhere."""
    client = H2Client(node.grpc_port)
    client.connect()
    assert client.nacos_call("InstanceRequest", register_body("h2-bystander"))[1]["resultCode"] == 200
    yield client
    kind, body = client.nacos_call("InstanceRequest", register_body("h2-bystander", port=81))
    assert (kind, body["resultCode"]) == ("InstanceResponse", 200), body
    client.close()


@pytest.fixture
def client(node: ServerProcess) -> Iterator[H2Client]:
    made = H2Client(node.grpc_port)
    yield made
    made.close()


def test_unknown_path_is_unimplemented(client: H2Client, bystander: H2Client) -> None:
    result = client.call("/No/suchMethod", nacos("ServerCheckRequest"))
    assert result.status == UNIMPLEMENTED and "/No/suchMethod" in result.message
    assert client.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"  # same connection goes on


def test_message_over_the_limit_is_resource_exhausted_before_its_body(client: H2Client,
                                                                      bystander: H2Client) -> None:
    stream_id = client.start(UNARY)
    client.send(stream_id, grpc_frame(b"x" * 100, declared=10 * LIMIT))  # the body never comes
    result = client.wait_end(stream_id)
    assert result.status == RESOURCE_EXHAUSTED and str(LIMIT) in result.message
    assert client.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"


def test_compressed_message_gets_a_clear_status(client: H2Client, bystander: H2Client) -> None:
    stream_id = client.start(UNARY, extra=[("grpc-encoding", "gzip")])
    client.send(stream_id, grpc_frame(b"\x1f\x8b compressed", compressed=True), end=True)
    result = client.wait_end(stream_id)
    assert result.status == UNIMPLEMENTED and "compress" in result.message


def test_grpc_timeout_ends_a_unary_call_waiting_for_its_message(client: H2Client, bystander: H2Client) -> None:
    stream_id = client.start(UNARY, extra=[("grpc-timeout", "200m")])  # no message, no half-close
    assert client.wait_end(stream_id).status == DEADLINE_EXCEEDED


def test_grpc_timeout_ends_a_bi_stream_and_its_connection(client: H2Client, bystander: H2Client) -> None:
    assert client.nacos_call("ServerCheckRequest")[0] == "ServerCheckResponse"
    stream_id = client.start(STREAM, extra=[("grpc-timeout", "300m")])
    client.send(stream_id, grpc_frame(nacos("ConnectionSetupRequest", {"labels": {"module": "naming"}})))
    assert client.wait_end(stream_id).status == DEADLINE_EXCEEDED
    assert client.nacos_call("InstanceRequest", register_body("h2-deadline"))[1]["errorCode"] == 301


def test_unary_half_close_without_a_message_is_internal(client: H2Client, bystander: H2Client) -> None:
    stream_id = client.start(UNARY, end=True)
    result = client.wait_end(stream_id)
    assert result.status == INTERNAL and "missing" in result.message


def test_half_close_of_the_bi_stream_ends_it_and_unregisters(client: H2Client, bystander: H2Client) -> None:
    _, stream_id = client.connect()
    assert client.nacos_call("InstanceRequest", register_body("h2-half"))[1]["resultCode"] == 200
    client.send(stream_id, b"", end=True)
    assert client.wait_end(stream_id).status == OK
    assert client.nacos_call("InstanceRequest", register_body("h2-half"))[1]["errorCode"] == 301


def test_rst_stream_of_the_bi_stream_unregisters(client: H2Client, bystander: H2Client) -> None:
    _, stream_id = client.connect()
    assert client.nacos_call("InstanceRequest", register_body("h2-rst"))[1]["resultCode"] == 200
    client.conn.reset_stream(stream_id)
    client.flush()

    def unregistered() -> bool:
        return client.nacos_call("InstanceRequest", register_body("h2-rst"))[1]["errorCode"] == 301

    client.wait(unregistered, what="the connection to be unregistered")


def test_ping_is_answered(client: H2Client, bystander: H2Client) -> None:
    client.conn.ping(b"shoal-42")
    client.flush()
    client.wait(lambda: b"shoal-42" in client.pings, what="the PING ack")


def test_garbage_instead_of_the_preface_closes_only_that_connection(node: ServerProcess,
                                                                     bystander: H2Client) -> None:
    import socket
    with socket.create_connection(("127.0.0.1", node.grpc_port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00garbage" * 20)
        sock.settimeout(5)
        while sock.recv(65536):  # whatever the server says, it then closes
            pass
    assert node.proc.poll() is None


def test_sigterm_sends_goaway_ends_streams_and_exits_zero(tmp_path: Path) -> None:
    server = start_server(tmp_path, NATIVE, auth=OPEN)
    try:
        client = H2Client(server.grpc_port)
        _, stream_id = client.connect()
        server.signal(signal.SIGTERM)
        result = client.wait_end(stream_id)
        assert result.status == UNAVAILABLE
        client.wait(lambda: client.goaway or client.closed, what="GOAWAY")
        client.wait_closed()
        assert server.proc.wait(5) == 0
    finally:
        kill(server)
