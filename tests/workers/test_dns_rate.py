"""The DNS rate limit of a node of workers is per source address for the node, not per worker
(issue 21): a resolver sending each query from a new source port meets one worker all the same."""

from __future__ import annotations

import socket
from collections.abc import Callable

import dns.message
import pytest

from shoal.testing import ServerProcess, free_port_block
from shoal.testing.openapi import register

pytestmark = pytest.mark.integration

RATE = 40
SUFFIX = "shoal.test"


def burst_from_many_ports(port: int, source: str, sockets: int, each: int) -> int:
    """``sockets`` × ``each`` queries from ``source``, each socket its own source port, sent at
    once; the answers that come back within a second."""
    wire = dns.message.make_query(f"rated.{SUFFIX}", "A", use_edns=False).to_wire()
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(sockets)]
    try:
        for sock in senders:
            sock.bind((source, 0))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 18)
        for _ in range(each):
            for sock in senders:
                sock.sendto(wire, ("127.0.0.1", port))
        got = 0
        for sock in senders:
            sock.settimeout(1.0 if sock is senders[0] else 0.05)  # all answers are there by then
            try:
                while True:
                    sock.recv(4096)
                    got += 1
            except TimeoutError:
                pass
        return got
    finally:
        for sock in senders:
            sock.close()


def test_a_source_spread_over_ports_gets_the_nodes_rate_once(two_workers: Callable[..., ServerProcess]) -> None:
    port = free_port_block(offsets=(0,))
    node = two_workers("-D", "nacos.naming.dns.enabled=true", "-D", f"nacos.naming.dns.port={port}",
                       "-D", f"nacos.naming.dns.domain-suffix={SUFFIX}", "-D", f"shoal.dns.rate-limit={RATE}")
    assert register(node, "rated", "10.21.5.1", 80)[0] == 200
    answered = burst_from_many_ports(port, "127.0.0.71", 16, 4 * RATE // 16)
    # one bucket of RATE (plus what refills while the burst is read); per worker it was about 2 * RATE
    assert RATE // 2 <= answered <= RATE * 5 // 4, answered
