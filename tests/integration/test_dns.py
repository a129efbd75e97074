"""The built-in DNS (Nacos 3.3; docs/protocol.md §8) against real nodes, asked by real `dig` and by
dnspython's resolver: A/AAAA/SRV, weights, what is left out, truncation and TCP, NXDOMAIN,
REFUSED, the per-source rate, garbage, and a 3-node cluster."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.resolver
import pytest

from shoal.testing import OPEN, ServerProcess, free_port_block, free_port_blocks, kill, poll_until, start_server
from shoal.testing.rawclient import RawClient

SUFFIX = "shoal.test"
RATE = 100  # queries per second per source address on the shared node


def dns_args(dns_port: int, *extra: str) -> list[str]:
    return ["-D", "nacos.naming.dns.enabled=true", "-D", f"nacos.naming.dns.port={dns_port}",
            "-D", f"nacos.naming.dns.domain-suffix={SUFFIX}", "-D", f"shoal.dns.rate-limit={RATE}", *extra]


@pytest.fixture(scope="module")
def port() -> int:
    """The shared node's DNS port (UDP and TCP)."""
    return free_port_block(offsets=(0,))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, port: int) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("dns"), dns_args(port), auth=OPEN)
    yield server
    kill(server)


@pytest.fixture
async def registrar() -> AsyncIterator[Callable[..., Any]]:
    """Registers instances through a raw gRPC connection per call (closed at teardown)."""
    clients: list[RawClient] = []

    async def register(server: ServerProcess, service: str, instances: list[dict[str, Any]],
                       group: str = "DEFAULT_GROUP") -> RawClient:
        client = RawClient(server.grpc_port)
        clients.append(client)
        await client.connect()
        full = [{"weight": 1.0, "healthy": True, "enabled": True, "ephemeral": True, "clusterName": "DEFAULT",
                 "metadata": {}, **inst} for inst in instances]
        _, reply = await client.call("BatchInstanceRequest", {
            "headers": {}, "namespace": "public", "serviceName": service, "groupName": group, "module": "naming",
            "type": "batchRegisterInstance", "instances": full})
        assert reply["resultCode"] == 200, reply
        return client

    yield register
    for client in clients:
        await client.close()


def dig(port: int, *args: str) -> str:
    result = subprocess.run(["dig", "@127.0.0.1", "-p", str(port), "+time=2", "+tries=1", *args],
                            capture_output=True, text=True, timeout=30, check=False)
    return result.stdout


async def adig(port: int, *args: str) -> str:
    return await asyncio.to_thread(dig, port, *args)


def short(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def status(output: str) -> str:
    for line in output.splitlines():
        if "status:" in line:
            return line.split("status:")[1].split(",")[0].strip()
    raise AssertionError(f"no status in dig output:\n{output}")


def resolver(port: int) -> dns.resolver.Resolver:
    res = dns.resolver.Resolver(configure=False)
    res.nameservers = ["127.0.0.1"]
    res.port = port
    res.lifetime = 5
    return res


def ask(port: int, name: str, rdtype: str = "A", source: str = "127.0.0.1", tcp: bool = False,
        use_edns: bool = False, timeout: float = 5) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype, use_edns=use_edns)
    if tcp:
        return dns.query.tcp(query, "127.0.0.1", timeout=timeout, port=port, source=source)
    return dns.query.udp(query, "127.0.0.1", timeout=timeout, port=port, source=source, ignore_trailing=True)


def answers(message: dns.message.Message) -> list[str]:
    return [rd.to_text() for rrset in message.answer for rd in rrset]


async def test_a_aaaa_and_srv_answers(node: ServerProcess, port: int, registrar: Callable[..., Any]) -> None:
    await registrar(node, "web", [{"ip": "10.1.0.1", "port": 80, "weight": 1.0},
                                  {"ip": "10.1.0.2", "port": 81, "weight": 2.5},
                                  {"ip": "fd00::7", "port": 82}])
    await registrar(node, "web", [{"ip": "10.2.0.1", "port": 90}], group="blue")

    assert sorted(short(await adig(port, "+short", f"web.{SUFFIX}", "A"))) == ["10.1.0.1", "10.1.0.2"]
    assert short(await adig(port, "+short", f"web.{SUFFIX}", "AAAA")) == ["fd00::7"]
    assert short(await adig(port, "+short", f"web.blue.{SUFFIX}", "A")) == ["10.2.0.1"]
    answer = await adig(port, "+noall", "+answer", f"web.{SUFFIX}", "A")
    assert all(line.split()[1] == "60" for line in short(answer)), answer  # nacos.naming.dns.ttl

    srv = sorted(short(await adig(port, "+short", f"web.{SUFFIX}", "SRV")))
    assert srv == sorted([f"10 100 80 0a010001.addr.{SUFFIX}.", f"10 250 81 0a010002.addr.{SUFFIX}.",
                          f"10 100 82 fd000000000000000000000000000007.addr.{SUFFIX}."])
    # an SRV target resolves, and comes in the additional section too
    assert short(await adig(port, "+short", f"0a010002.addr.{SUFFIX}", "A")) == ["10.1.0.2"]
    full = await adig(port, "+noall", "+additional", f"web.{SUFFIX}", "SRV")
    assert "10.1.0.1" in full and "fd00::7" in full

    # the Python resolver library agrees
    res = resolver(port)
    got = await asyncio.to_thread(res.resolve, f"web.{SUFFIX}", "A")
    assert sorted(r.to_text() for r in got) == ["10.1.0.1", "10.1.0.2"]
    got = await asyncio.to_thread(res.resolve, f"web.blue.{SUFFIX}", "SRV")
    assert [(r.port, r.weight, r.target.to_text()) for r in got] == [(90, 100, f"0a020001.addr.{SUFFIX}.")]


async def test_only_healthy_enabled_weighted_instances(node: ServerProcess, port: int,
                                                       registrar: Callable[..., Any]) -> None:
    await registrar(node, "mixed", [{"ip": "10.3.0.1", "port": 80},
                                    {"ip": "10.3.0.2", "port": 80, "healthy": False},
                                    {"ip": "10.3.0.3", "port": 80, "enabled": False},
                                    {"ip": "10.3.0.4", "port": 80, "weight": 0.0}])
    assert short(await adig(port, "+short", f"mixed.{SUFFIX}", "A")) == ["10.3.0.1"]
    assert len(short(await adig(port, "+short", f"mixed.{SUFFIX}", "SRV"))) == 1
    # a service with nothing to answer exists: NOERROR and no records, not NXDOMAIN
    await registrar(node, "down", [{"ip": "10.3.1.1", "port": 80, "healthy": False}])
    out = await adig(port, f"down.{SUFFIX}", "A")
    assert status(out) == "NOERROR" and "ANSWER: 0" in out, out


async def test_weight_shapes_the_order(node: ServerProcess, port: int, registrar: Callable[..., Any]) -> None:
    """A and AAAA answers come in a weighted random order: weight 9 against 1 comes first about
    nine times in ten (the bound below is many standard deviations from both 90% and 50%)."""
    await registrar(node, "heavy", [{"ip": "10.4.0.9", "port": 80, "weight": 9.0},
                                    {"ip": "10.4.0.1", "port": 80, "weight": 1.0}])
    firsts: list[str] = []
    for i in range(200):  # four source addresses, 50 queries each: under each one's rate
        reply = await asyncio.to_thread(ask, port, f"heavy.{SUFFIX}", "A", f"127.0.0.{20 + i % 4}")
        assert len(answers(reply)) == 2
        firsts.append(answers(reply)[0])
    assert firsts.count("10.4.0.9") >= 140, firsts.count("10.4.0.9")
    assert firsts.count("10.4.0.1") >= 1


async def test_truncation_and_tcp_fallback(node: ServerProcess, port: int, registrar: Callable[..., Any]) -> None:
    await registrar(node, "big", [{"ip": f"10.5.0.{i}", "port": 8000 + i} for i in range(1, 81)])
    udp = await adig(port, "+noedns", "+ignore", f"big.{SUFFIX}", "A")
    flags = next(line for line in udp.splitlines() if "flags:" in line).split("flags:")[1].split(";")[0].split()
    assert "tc" in flags, udp
    assert len(short(await adig(port, "+noedns", "+ignore", "+short", f"big.{SUFFIX}", "A"))) < 80
    # dig retries a truncated answer over TCP by itself, and gets everything
    assert len(short(await adig(port, "+noedns", "+short", f"big.{SUFFIX}", "A"))) == 80
    assert len(short(await adig(port, "+tcp", "+short", f"big.{SUFFIX}", "SRV"))) == 80
    reply = await asyncio.to_thread(ask, port, f"big.{SUFFIX}", "A", "127.0.0.1", True)
    assert not reply.flags & dns.flags.TC and len(answers(reply)) == 80
    # and so does the Python resolver (its TCP fallback on TC)
    got = await asyncio.to_thread(resolver(port).resolve, f"big.{SUFFIX}", "A")
    assert len(got) == 80


async def test_nxdomain_inside_refused_outside(node: ServerProcess, port: int) -> None:
    assert status(await adig(port, f"nosuch.{SUFFIX}", "A")) == "NXDOMAIN"
    assert status(await adig(port, f"nosuch.nogroup.{SUFFIX}", "SRV")) == "NXDOMAIN"
    assert status(await adig(port, f"a.b.c.{SUFFIX}", "A")) == "NXDOMAIN"
    assert status(await adig(port, "example.com", "A")) == "REFUSED"
    assert status(await adig(port, "+tcp", "example.com", "A")) == "REFUSED"
    with pytest.raises(dns.resolver.NXDOMAIN):
        await asyncio.to_thread(resolver(port).resolve, f"nosuch.{SUFFIX}", "A")
    reply = await asyncio.to_thread(ask, port, "shoal.example.org", "A")
    assert reply.rcode() == dns.rcode.REFUSED and not reply.answer


async def test_rate_is_bounded_per_source(node: ServerProcess, port: int, registrar: Callable[..., Any]) -> None:
    await registrar(node, "limited", [{"ip": "10.6.0.1", "port": 80}])
    wire = dns.message.make_query(f"limited.{SUFFIX}", "A", use_edns=False)
    sent = 4 * RATE

    def burst() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.50", 0))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            for i in range(sent):
                wire.id = i
                sock.sendto(wire.to_wire(), ("127.0.0.1", port))
            got = 0
            sock.settimeout(1.0)  # the collection window: answers to a burst arrive at once
            try:
                while True:
                    sock.recv(4096)
                    got += 1
            except TimeoutError:
                return got

    def tcp_burst() -> int:
        """Pipelined queries on one TCP connection: answered up to the bucket, then closed."""
        with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.52", 0)) as sock:
            frame = wire.to_wire()
            sock.sendall((len(frame).to_bytes(2, "big") + frame) * sent)
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass  # closed with our unread queries still in its buffer: a reset after the answers
        got = 0
        while len(data) >= 2:
            size = int.from_bytes(data[:2], "big")
            data = data[2 + size:]
            got += 1
        return got

    answered = await asyncio.to_thread(burst)
    assert 0 < answered < sent, answered
    answered = await asyncio.to_thread(tcp_burst)
    assert 0 < answered < sent, answered
    # another source is not held back by that one
    assert answers(await asyncio.to_thread(ask, port, f"limited.{SUFFIX}", "A", "127.0.0.51")) == ["10.6.0.1"]
    # and the limited source is answered again once its bucket refills

    def answered_again() -> bool:
        try:
            return answers(ask(port, f"limited.{SUFFIX}", "A", "127.0.0.50")) == ["10.6.0.1"]
        except dns.exception.Timeout:
            return False

    await asyncio.to_thread(poll_until, answered_again, 10)


async def test_garbage_leaves_the_node_healthy(node: ServerProcess, port: int, registrar: Callable[..., Any]) -> None:
    await registrar(node, "sturdy", [{"ip": "10.7.0.1", "port": 80}])
    rng = random.Random(24)
    header_only = bytes.fromhex("abcd0100000500000000000000")  # a query header claiming 5 questions, no body
    as_answer = dns.message.make_response(dns.message.make_query(f"sturdy.{SUFFIX}", "A")).to_wire()

    def send_garbage() -> bytes:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.60", 0))
            for blob in [b"", b"\x00", b"\xff" * 11, as_answer, os.urandom(3000)] + [
                    bytes(rng.getrandbits(8) for _ in range(rng.randint(12, 600))) for _ in range(50)]:
                sock.sendto(blob, ("127.0.0.1", port))
            sock.sendto(header_only, ("127.0.0.1", port))
            sock.settimeout(5)
            while True:  # FORMERR comes back for the header-only query (random blobs may answer too)
                reply = sock.recv(4096)
                if reply[:2] == header_only[:2]:
                    return reply

    def tcp_garbage() -> None:
        for blob in [b"\x00", b"\x00\x00", b"\x00\x10abc", b"\xff\xff" + os.urandom(200), os.urandom(5000)]:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(blob)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(4096):
                    pass

    formerr = dns.message.from_wire(await asyncio.to_thread(send_garbage))
    assert formerr.rcode() == dns.rcode.FORMERR
    await asyncio.to_thread(tcp_garbage)
    assert short(await adig(port, "+short", f"sturdy.{SUFFIX}", "A")) == ["10.7.0.1"]
    assert short(await adig(port, "+tcp", "+short", f"sturdy.{SUFFIX}", "A")) == ["10.7.0.1"]
    assert node.ready()
    assert "Traceback" not in node.log()


async def test_instance_registered_on_a_resolves_on_b(tmp_path: Path, registrar: Callable[..., Any]) -> None:
    ports = free_port_blocks(3)
    dns_ports = free_port_blocks(3, offsets=(0,), avoid=ports)
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    nodes = [start_server(tmp_path, ["--members", members, "-D", "shoal.member.report-interval-ms=300",
                                     *dns_args(d)], port=p, wait=False, auth=OPEN)
             for p, d in zip(ports, dns_ports, strict=True)]
    try:
        for n in nodes:
            n.wait_ready(timeout=30)
        await registrar(nodes[0], "spread", [{"ip": "10.8.0.1", "port": 80}, {"ip": "fd00::8", "port": 81}])

        def resolved_on(i: int) -> bool:
            return short(dig(dns_ports[i], "+short", f"spread.{SUFFIX}", "A")) == ["10.8.0.1"]

        await asyncio.to_thread(poll_until, lambda: resolved_on(1) and resolved_on(2), 20)
        assert short(await adig(dns_ports[1], "+short", f"spread.{SUFFIX}", "AAAA")) == ["fd00::8"]
        assert len(short(await adig(dns_ports[2], "+tcp", "+short", f"spread.{SUFFIX}", "SRV"))) == 2
    finally:
        for n in nodes:
            kill(n)


def test_dns_is_off_unless_enabled(tmp_path: Path) -> None:
    """A node without nacos.naming.dns.enabled binds no DNS port (its configured port stays free)."""
    dns_port = free_port_block(offsets=(0,))
    server = start_server(tmp_path, ["-D", f"nacos.naming.dns.port={dns_port}"], auth=OPEN)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", dns_port))  # raises EADDRINUSE were the node listening on it
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", dns_port)) != 0
    finally:
        kill(server)


def test_a_dns_port_in_use_stops_the_node_cleanly(tmp_path: Path) -> None:
    dns_port = free_port_block(offsets=(0,))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", dns_port))
        server = start_server(tmp_path, dns_args(dns_port), wait=False, auth=OPEN)
        try:
            poll_until(lambda: not server.alive(), 30, what="the node to give up")
            assert server.proc.returncode != 0
            assert "Traceback" not in server.log()
        finally:
            kill(server)


def test_a_starting_node_answers_servfail_not_nxdomain(tmp_path: Path) -> None:
    dns_port = free_port_block(offsets=(0,))
    server = start_server(tmp_path, dns_args(dns_port, "-D", "shoal.startup.delay-ms=60000"), wait=False, auth=OPEN)
    try:
        def status_of(name: str) -> str | None:
            try:
                return dns.rcode.to_text(ask(dns_port, name, timeout=0.5).rcode())
            except (dns.exception.Timeout, ConnectionError):
                return None  # not listening yet

        assert poll_until(lambda: status_of(f"anything.{SUFFIX}"), 30) == "SERVFAIL"
        assert not server.ready()
        assert status_of("example.com") == "REFUSED"  # outside the zone: the same answer as ever
    finally:
        kill(server)
