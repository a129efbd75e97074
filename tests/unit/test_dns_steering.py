"""The DNS port's workers share it with SO_REUSEPORT; a BPF program steers each source address to
one of them, whatever its source port, so the per-source rate is the node's (issue 21)."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from contextlib import ExitStack

from shoal.dns.server import steer_by_source

SOURCES = ["127.0.0.61", "127.0.0.62", "127.0.0.63", "127.0.0.64"]


def _group(stack: ExitStack, count: int, steer: bool) -> list[socket.socket]:
    """``count`` UDP sockets sharing one loopback port, as a node's workers share its DNS port."""
    group: list[socket.socket] = []
    port = 0
    for _ in range(count):
        sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        port = sock.getsockname()[1]
        group.append(sock)
    if steer:
        assert all(steer_by_source(sock, count) for sock in group)
    return group


def _receivers(group: list[socket.socket], source: str, ports: int) -> Iterator[int]:
    """Which socket of ``group`` each of ``ports`` datagrams from ``source`` (each from a new port) reaches."""
    target = group[0].getsockname()
    for i in range(ports):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.bind((source, 0))
            sender.sendto(b"q%d" % i, target)
        ready, _, _ = select.select(group, [], [], 2.0)
        assert len(ready) == 1, f"datagram {i} from {source} reached {len(ready)} sockets"
        ready[0].recv(64)
        yield group.index(ready[0])


def test_every_port_of_one_source_reaches_the_same_socket() -> None:
    with ExitStack() as stack:
        group = _group(stack, 2, steer=True)
        seen = {source: set(_receivers(group, source, 24)) for source in SOURCES}
    assert all(len(indexes) == 1 for indexes in seen.values()), seen
    assert set().union(*seen.values()) == {0, 1}, seen  # and the sources are spread over both


def test_without_steering_one_source_is_spread() -> None:
    # the kernel's 4-tuple hash: the reason the rate was per worker (24 ports on one socket: 2**-23)
    with ExitStack() as stack:
        group = _group(stack, 2, steer=False)
        assert set(_receivers(group, SOURCES[0], 24)) == {0, 1}


def test_one_worker_needs_no_program() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        assert steer_by_source(sock, 1) is False
