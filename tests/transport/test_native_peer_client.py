"""The native peer client (``NativePeerTransport`` over ``shoal._ext.h2client``) against real cluster
ports on loopback, served by both server transports: what a Distro call sees (answers, the member
and identity headers, concurrency on one connection, big messages, deadlines, refused and restarted
peers, error statuses, TLS), and the same errors as the grpc.aio client where they must agree.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.distro.transport import MEMBER_HEADER, PeerError, PeerUnavailable
from shoal.testing import wait_until
from shoal.testing.certs import make_pki
from shoal.testing.peers import CLUSTER_OFFSET, ClusterPort
from shoal.transport.grpc.native_peer_client import NativePeerTransport
from shoal.transport.grpc.peer_client import GrpcPeerTransport

pytestmark = pytest.mark.c_extension

SELF = "127.0.0.1:18848"
IDENTITY = ("shoal-identity", "s3cret")
MiB = 1024 * 1024


class Peer:
    """What the far end saw: senders and identity headers per request type."""

    def __init__(self) -> None:
        self.senders: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def dispatch(self, sender: str, type_name: str, body: bytes) -> tuple[str, bytes]:
        self.senders.append(sender)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if type_name == "Sleep":
                await asyncio.sleep(float(body))
            elif type_name == "Yield":
                await asyncio.sleep(0.05)
            elif type_name == "Grow":
                return "GrowResponse", body * 4
            return f"{type_name}Response", body
        finally:
            self.in_flight -= 1


@pytest.fixture(params=["native", "grpcio"])
async def port(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ClusterPort, Peer]]:
    peer = Peer()
    served = await ClusterPort(peer.dispatch, request.param, cluster_identity_key=IDENTITY[0],
                               cluster_identity_value=IDENTITY[1],
                               cluster_max_inbound_message_size=16 * MiB).start()
    yield served, peer
    await served.stop()


def _client() -> NativePeerTransport:
    return NativePeerTransport(SELF, CLUSTER_OFFSET, IDENTITY)


async def test_a_call_is_answered_and_names_its_sender(port: tuple[ClusterPort, Peer]) -> None:
    served, peer = port
    client = _client()
    try:
        assert await client.call(served.address, "Echo", b"hello", 2000) == ("EchoResponse", b"hello")
        assert await client.call(served.address, "Echo", b"", 2000) == ("EchoResponse", b"")
    finally:
        await client.close()
    assert peer.senders == [SELF, SELF]


async def test_a_wrong_identity_is_refused_by_the_peer_as_the_grpc_client_sees_it(
        port: tuple[ClusterPort, Peer]) -> None:
    served, _ = port
    answers = []
    for client in (NativePeerTransport(SELF, CLUSTER_OFFSET, (IDENTITY[0], "wrong")),
                   GrpcPeerTransport(SELF, CLUSTER_OFFSET, (IDENTITY[0], "wrong"))):
        try:
            answers.append(await client.call(served.address, "Echo", b"x", 2000))
        finally:
            await client.close()
    assert answers[0] == answers[1] and answers[0][0] == "ErrorResponse" and b"403" in answers[0][1]


async def test_concurrent_calls_share_one_connection(port: tuple[ClusterPort, Peer]) -> None:
    served, peer = port
    client = _client()
    try:
        bodies = [str(i).encode() * (i % 50 + 1) for i in range(300)]
        answers = await asyncio.gather(*(client.call(served.address, "Yield", b, 5000) for b in bodies))
        assert [a[1] for a in answers] == bodies
        assert len(client._connections) == 1
    finally:
        await client.close()
    assert peer.most_in_flight > 50  # really multiplexed, not one after the other


async def test_big_messages_travel_both_ways(port: tuple[ClusterPort, Peer]) -> None:
    served, _ = port
    client = _client()
    try:
        big = bytes(range(256)) * (5 * MiB // 256)  # three at once stay within the peer's 16 MiB read budget
        answers = await asyncio.gather(*(client.call(served.address, "Echo", big[i:], 10_000) for i in range(3)))
        assert [a[1] for a in answers] == [big[i:] for i in range(3)]
    finally:
        await client.close()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_a_snapshot_sized_page_arrives(transport: str) -> None:
    page = bytes(range(256)) * (48 * MiB // 256)

    async def snapshot(sender: str, type_name: str, body: bytes) -> tuple[str, bytes]:
        return "DistroSnapshotResponse", page

    served = await ClusterPort(snapshot, transport).start()  # the default limits: 64 MiB messages
    client = _client()
    try:
        started = time.monotonic()
        reply_type, body = await client.call(served.address, "DistroSnapshotRequest", b"{}", 30_000)
        assert reply_type == "DistroSnapshotResponse" and body == page
        assert time.monotonic() - started < 10
    finally:
        await client.close()
        await served.stop()


async def test_a_message_over_the_peers_limit_is_a_peer_error_and_the_connection_goes_on(
        port: tuple[ClusterPort, Peer]) -> None:
    served, _ = port
    client = _client()
    try:
        with pytest.raises(PeerError, match="RESOURCE_EXHAUSTED"):
            await client.call(served.address, "Echo", b"x" * (17 * MiB), 10_000)
        assert await client.call(served.address, "Echo", b"after", 2000) == ("EchoResponse", b"after")
    finally:
        await client.close()


async def test_messages_over_the_clients_own_limit_are_refused_and_the_connection_goes_on(
        port: tuple[ClusterPort, Peer]) -> None:
    served, _ = port
    client = NativePeerTransport(SELF, CLUSTER_OFFSET, IDENTITY, max_message=4096)
    try:
        with pytest.raises(PeerError, match="RESOURCE_EXHAUSTED"):  # the request: never sent
            await client.call(served.address, "Echo", b"x" * 5000, 2000)
        with pytest.raises(PeerError, match="RESOURCE_EXHAUSTED answer of"):  # the answer: refused from its prefix
            await client.call(served.address, "Grow", b"x" * 2000, 2000)
        assert await client.call(served.address, "Grow", b"ab", 2000) == ("GrowResponse", b"abababab")
    finally:
        await client.close()


async def test_no_answer_within_the_timeout_is_a_timeout_and_the_connection_goes_on(
        port: tuple[ClusterPort, Peer], caplog: pytest.LogCaptureFixture) -> None:
    served, _ = port
    client = _client()
    caplog.set_level(logging.INFO, logger="shoal.transport.grpc.native_peer_client")
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="timed out after 200 ms"):
            await client.call(served.address, "Sleep", b"3", 200)
        assert time.monotonic() - started < 1.5
        conn = client._connections[served.address]
        assert await client.call(served.address, "Echo", b"again", 2000) == ("EchoResponse", b"again")
        assert client._connections[served.address] is conn and not conn.pending
    finally:
        await client.close()
    messages = [r.getMessage() for r in caplog.records]
    assert f"peer {served.address} is not answering: no answer within 200 ms" in messages
    assert f"peer {served.address} answers again" in messages


async def test_a_refused_port_is_unavailable_and_refused() -> None:
    port = ClusterPort(Peer().dispatch)  # never started: nothing listens
    client = _client()
    try:
        with pytest.raises(PeerUnavailable, match="connection refused") as caught:
            await client.call(port.address, "Echo", b"x", 2000)
        assert caught.value.refused
        assert not client._connections  # the failed connection is forgotten
    finally:
        await client.close()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_a_restarted_peer_is_reached_at_once_and_logged_once_each_way(
        transport: str, caplog: pytest.LogCaptureFixture) -> None:
    peer = Peer()
    served = await ClusterPort(peer.dispatch, transport).start()
    client = _client()
    try:
        with caplog.at_level(logging.INFO, logger="shoal.transport.grpc.native_peer_client"):
            assert await client.call(served.address, "Echo", b"1", 2000) == ("EchoResponse", b"1")
            slow = asyncio.ensure_future(client.call(served.address, "Sleep", b"5", 10_000))
            await asyncio.sleep(0.1)
            await served.stop(grace_s=0.1)  # the call in flight fails with the connection
            with pytest.raises(PeerUnavailable):
                await slow
            for _ in range(3):
                with pytest.raises(PeerUnavailable) as caught:
                    await client.call(served.address, "Echo", b"2", 2000)
                assert caught.value.refused
            await served.start()
            started = time.monotonic()
            assert await client.call(served.address, "Echo", b"3", 2000) == ("EchoResponse", b"3")
            assert time.monotonic() - started < 1.0  # no reconnect back-off
    finally:
        await client.close()
        await served.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1 and warnings[0].startswith(f"peer {served.address} is not answering")
    assert infos == [f"peer {served.address} answers again"]


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_a_peer_stopping_gracefully_finishes_the_calls_in_flight(transport: str) -> None:
    peer = Peer()
    served = await ClusterPort(peer.dispatch, transport).start()
    client = _client()
    try:
        assert await client.call(served.address, "Echo", b"1", 2000) == ("EchoResponse", b"1")
        in_flight = asyncio.ensure_future(client.call(served.address, "Sleep", b"0.5", 5000))
        await wait_until(lambda: peer.in_flight == 1, 3.0, "the call to reach the peer")
        await served.stop(grace_s=3.0)  # GOAWAY: the call in flight goes on, new ones go elsewhere
        assert await in_flight == ("SleepResponse", b"0.5")
        with pytest.raises(PeerUnavailable) as caught:
            await client.call(served.address, "Echo", b"2", 2000)
        assert caught.value.refused
    finally:
        await client.close()
        await served.stop()


async def test_calls_in_flight_fail_unavailable_when_the_client_closes(port: tuple[ClusterPort, Peer]) -> None:
    served, _ = port
    client = _client()
    slow = asyncio.ensure_future(client.call(served.address, "Sleep", b"5", 10_000))
    await asyncio.sleep(0.1)
    await client.close()
    with pytest.raises(PeerUnavailable, match="transport closed"):
        await slow


async def test_a_cancelled_caller_resets_its_stream(port: tuple[ClusterPort, Peer]) -> None:
    served, peer = port
    client = _client()
    try:
        slow = asyncio.ensure_future(client.call(served.address, "Sleep", b"5", 10_000))
        await asyncio.sleep(0.1)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert not client._connections[served.address].pending
        await wait_until(lambda: peer.in_flight == 0, 3.0, "the peer's handler cancelled by the reset")
        assert await client.call(served.address, "Echo", b"x", 2000) == ("EchoResponse", b"x")
    finally:
        await client.close()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_tls_with_mutual_auth(transport: str, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    settings = {"peer_tls_enabled": True, "peer_tls_cert_chain_file": str(pki.server.cert),
                "peer_tls_cert_private_key": str(pki.server.key),
                "peer_tls_trust_collection_cert_file": str(pki.ca), "peer_tls_mutual_auth_enable": True}
    served = await ClusterPort(Peer().dispatch, transport, **settings).start()
    client = NativePeerTransport(SELF, CLUSTER_OFFSET, tls=served.tls)
    plain = NativePeerTransport(SELF, CLUSTER_OFFSET)
    try:
        assert await client.call(served.address, "Echo", b"secret", 5000) == ("EchoResponse", b"secret")
        with pytest.raises((PeerUnavailable, TimeoutError)):  # plaintext to a TLS port gets no answer
            await plain.call(served.address, "Echo", b"x", 1000)
    finally:
        await client.close()
        await plain.close()
        await served.stop()


async def test_a_peer_with_an_untrusted_certificate_is_unavailable(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    served = await ClusterPort(Peer().dispatch, "native", peer_tls_enabled=True,
                               peer_tls_cert_chain_file=str(pki.stranger.cert),
                               peer_tls_cert_private_key=str(pki.stranger.key)).start()
    trusting = ClusterPort(Peer().dispatch, "native", peer_tls_enabled=True,  # only its TLS settings are used
                           peer_tls_cert_chain_file=str(pki.server.cert),
                           peer_tls_cert_private_key=str(pki.server.key),
                           peer_tls_trust_collection_cert_file=str(pki.ca))
    client = NativePeerTransport(SELF, CLUSTER_OFFSET, tls=trusting.tls)
    try:
        with pytest.raises(PeerUnavailable, match="TLS handshake failed"):
            await client.call(served.address, "Echo", b"x", 5000)
    finally:
        await client.close()
        await served.stop()


async def test_both_clients_agree_on_the_sender_header(port: tuple[ClusterPort, Peer]) -> None:
    served, peer = port
    for client in (_client(), GrpcPeerTransport(SELF, CLUSTER_OFFSET, IDENTITY)):
        try:
            assert await client.call(served.address, "Echo", b"same", 2000) == ("EchoResponse", b"same")
        finally:
            await client.close()
    assert peer.senders == [SELF, SELF]
    assert MEMBER_HEADER == "shoal-member"
