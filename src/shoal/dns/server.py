"""The built-in DNS port: UDP and TCP on the node's event loop (docs/protocol.md §8).

UDP datagrams are answered at once (a truncated answer sets TC, and the client retries over
TCP); TCP carries length-prefixed queries, several per connection, each answered in full (up
to 65535 bytes). Every query, on either transport, spends one token of its source address's
bucket (``shoal.dns.rate-limit`` per second, a burst of as many); a query past it is dropped
(UDP) or ends the connection (TCP), and one log line per interval counts them. TCP
connections are bounded in number and closed after an idle while.

The workers of a node (``--workers N``) share the DNS port with ``SO_REUSEPORT``. The kernel's
own choice of a socket hashes the 4-tuple, so a resolver that sends each query from a new source
port (as RFC 5452 asks) would be spread over the workers and get N times the rate. Each worker's
sockets therefore carry a classic BPF program (:func:`steer_by_source`) that picks the socket
by the source *address* alone: one source always meets the same worker, whose bucket is then the
node's. Where the program cannot be attached (not Linux), the limit stays per worker (logged).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, cast

from shoal.config import Config
from shoal.dns.resolver import DnsResolver, Prepared
from shoal.logutil import RateLimitedLog
from shoal.service_layer import NamingService
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

#: TCP connections served at once (more are closed on accept), and how long one may idle.
MAX_TCP_CONNECTIONS = 256
TCP_IDLE_S = 10.0
#: A TCP answer of more records than this is encoded in a worker thread, not on the loop.
INLINE_RECORDS = 64
#: Source addresses whose buckets are remembered (least recently seen forgotten first).
MAX_SOURCES = 65536


#: Linux ``setsockopt(SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF)``: the program a reuseport group runs.
SO_ATTACH_REUSEPORT_CBPF = 51
#: Classic BPF's offset of the network (IP) header, and the instructions used below.
_SKF_NET_OFF = -0x100000
_LD_B_ABS, _LD_W_ABS, _RSH_K, _MOD_K, _JEQ_K, _JA, _RET_A = 0x30, 0x20, 0x74, 0x94, 0x15, 0x05, 0x16


def source_steering_program(workers: int) -> list[tuple[int, int, int, int]]:
    """The cBPF program that returns, for a packet, the index of the group's socket to take: the
    last 32 bits of the source address (IPv4 or IPv6) modulo ``workers``."""
    return [
        (_LD_B_ABS, 0, 0, _SKF_NET_OFF & 0xFFFFFFFF),  # A = the IP header's first byte
        (_RSH_K, 0, 0, 4),  # A = the IP version
        (_JEQ_K, 2, 0, 6),  # IPv6: to the load of its source's last word
        (_LD_W_ABS, 0, 0, (_SKF_NET_OFF + 12) & 0xFFFFFFFF),  # IPv4 source address
        (_JA, 0, 0, 1),
        (_LD_W_ABS, 0, 0, (_SKF_NET_OFF + 20) & 0xFFFFFFFF),  # IPv6 source address, bytes 12..15
        (_MOD_K, 0, 0, workers),
        (_RET_A, 0, 0, 0),
    ]


def steer_by_source(sock: Any, workers: int) -> bool:
    """Attach :func:`source_steering_program` to the reuseport group of ``sock`` (a socket or an
    event loop's socket wrapper); False where the kernel offers no such thing."""
    if not sys.platform.startswith("linux") or workers < 2:
        return False
    import ctypes

    code = b"".join(struct.pack("HBBI", *insn) for insn in source_steering_program(workers))
    filters = ctypes.create_string_buffer(code, len(code))
    program = struct.pack("HP", len(code) // 8, ctypes.addressof(filters))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, program)
    except OSError as exc:
        log.warning("DNS: cannot steer queries by source address (%s): the rate limit is per worker", exc)
        return False
    return True


class RateLimiter:
    """A token bucket per source address: ``rate`` tokens a second, holding at most ``rate``."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic, max_sources: int = MAX_SOURCES) -> None:
        self.rate = float(rate)
        self.clock = clock
        self.max_sources = max_sources
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def allow(self, source: str) -> bool:
        """Spend one token of ``source``; False when it has none left."""
        now = self.clock()
        tokens, last = self._buckets.pop(source, (self.rate, now))
        tokens = min(self.rate, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return allowed


class DnsServer:
    """The DNS listeners of one node (Nacos 3.3's DNS module), started by ``Node``."""

    def __init__(self, config: Config, naming: NamingService, serving: Callable[[], bool] = lambda: True,
                 reuse_port: bool = False, workers: int = 1) -> None:
        self.host = config.dns_bind_address
        #: a worker's: the DNS port shared with the node's ``workers`` (SO_REUSEPORT), each source
        #: address steered to one of them (:func:`steer_by_source`), so its bucket is the node's
        self.reuse_port = reuse_port
        self.workers = workers
        self.port = config.dns_port
        self.resolver = DnsResolver(config, naming, serving=serving)
        self.limiter = RateLimiter(config.dns_rate_limit)
        self.limited = RateLimitedLog(log)
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tcp_tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind UDP and TCP; a port that cannot be bound is an OSError naming the setting."""
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(lambda: _UdpProtocol(self),
                                                               local_addr=(self.host, self.port),
                                                               reuse_port=self.reuse_port or None)
            self._udp = transport
            self._tcp = await asyncio.start_server(self._serve_tcp, self.host, self.port,
                                                   reuse_port=self.reuse_port or None)
            if self.reuse_port:
                for sock in (transport.get_extra_info("socket"), *self._tcp.sockets):
                    steer_by_source(sock, self.workers)
        except OSError as exc:
            await self.stop()
            raise OSError(exc.errno, f"cannot bind the DNS port {self.host}:{self.port} (nacos.naming.dns.port, "
                                     f".bind-address): {exc.strerror or exc}") from None
        log.info("DNS serving %s on %s:%d (UDP and TCP)", self.resolver.suffix, self.host, self.port)

    async def stop(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            for task in list(self._tcp_tasks):
                task.cancel()
            await asyncio.gather(*self._tcp_tasks, return_exceptions=True)
            await self._tcp.wait_closed()
            self._tcp = None

    def allow(self, source: str) -> bool:
        if self.limiter.allow(source):
            return True
        self.limited.warning("dns-rate", "DNS queries from %s over shoal.dns.rate-limit: dropped", source)
        return False

    def answer(self, data: bytes, max_size: int | None) -> bytes | None:
        """Never raises: an unexpected failure is logged (rate-limited) and nothing is sent."""
        try:
            return self.resolver.answer(data, max_size)
        except Exception:
            self._unexpected()
            return None

    async def answer_tcp(self, data: bytes) -> bytes | None:
        """:meth:`answer` for TCP, whose answers may hold thousands of records: the model is read
        on the loop, a big answer is encoded off it (dnspython spends ~30 us a record)."""
        try:
            prepared = self.resolver.prepare(data, None)
            if not isinstance(prepared, Prepared):
                return prepared
            if prepared.records <= INLINE_RECORDS:
                return prepared.render()
            return await run_blocking(prepared.render)
        except Exception:
            self._unexpected()
            return None

    def _unexpected(self) -> None:
        self.resolver.garbage.log(logging.ERROR, "dns-unexpected", "unexpected failure answering a DNS query",
                                  exc_info=True)

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or len(self._tcp_tasks) >= MAX_TCP_CONNECTIONS:
            writer.close()
            return
        self._tcp_tasks.add(task)
        source = str((writer.get_extra_info("peername") or ("?",))[0])
        try:
            while True:
                async with asyncio.timeout(TCP_IDLE_S):
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    data = await reader.readexactly(size)
                if not self.allow(source):
                    break
                answer = await self.answer_tcp(data)
                if answer is None:
                    break  # garbage without a header: nothing sensible to say on this stream
                writer.write(len(answer).to_bytes(2, "big") + answer)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # idle, closed by the client mid-message, or reset: just end it
        finally:
            self._tcp_tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: DnsServer) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's is no subclass of it

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.transport is None or not self.server.allow(str(addr[0])):
            return
        answer = self.server.answer(data, 512)
        if answer is not None:
            self.transport.sendto(answer, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("DNS UDP socket error: %s", exc)
