"""gRPC connections (Nacos ConnectionManager + GrpcConnection).

A connection is one HTTP/2 transport, identified by the peer address gRPC reports for every
call on it (``ipv4:ip:port``): the unary ServerCheck and the bi stream of one client share it,
in whatever order they arrive (docs/protocol.md §2.1, §2.2). The id is ``<epochMillis>_<ip>_<port>``.
A connection is *registered* once ConnectionSetupRequest arrived on its stream; only then are
naming requests served (else 301). Server→client requests (pushes, probes) travel on the
stream with a process-wide request id and are matched to the client's response by that id.

Last-active stamps live in one int64 array indexed by a per-connection slot, so the keep-alive
scan is a single call of the expiry kernel over the whole table.

Messages to a client go through its stream's :class:`StreamSink`, which the transport
provides (grpc.aio or native). A sink never blocks: it queues serialized Payload bytes, one
stream write at a time, bounded by ``shoal.remote.outbound-queue-bytes``; a sink whose queue
is over that bound, or whose peer has read nothing for ``shoal.remote.write-stall-timeout-ms``,
asks the manager to close the connection (one log line, from :meth:`ConnectionManager.unregister`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shoal import jsonfast
from shoal.clock import Clock
from shoal.config import Config
from shoal.errors import GrpcStatus
from shoal.kernels import expiry
from shoal.kernels import payload as payload_codec
from shoal.logutil import RateLimitedLog
from shoal.transport.grpc import codec
from shoal.transport.grpc._proto import Payload
from shoal.transport.grpc.limits import LimitRuleFile, SiblingConnections

log = logging.getLogger(__name__)


class ConnectionGone(Exception):
    """The connection was unregistered or its stream is closed."""


#: gRPC status the server ends a client's stream with when it drops the connection.
UNAVAILABLE = GrpcStatus.UNAVAILABLE


class StreamSink(Protocol):
    """The server→client half of one bi stream, as a transport provides it."""

    def send(self, data: bytes) -> None:
        """Queue one serialized Payload; raises ConnectionGone if the stream is over or full."""

    def close(self, status: int, message: str) -> None:
        """End the stream with this gRPC status (idempotent)."""


@dataclass(eq=False, slots=True)
class Connection:
    """One client transport and, once set up, its metadata (Nacos ConnectionMeta)."""

    connection_id: str
    peer: str
    remote_ip: str
    remote_port: int
    slot: int
    created_ms: int
    created_mono_ms: int
    seq: int = 0
    registered: bool = False
    client_ip: str = ""
    client_version: str = ""
    tenant: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    app: str = "-"
    source: str = "sdk"
    stream: StreamSink | None = None
    pending: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    expelled_at_ms: int | None = None
    closed: bool = False

    @property
    def module(self) -> str:
        return self.labels.get("module", "")

    def describe(self) -> str:
        return f"{self.connection_id} ({self.client_ip or self.remote_ip}, {self.client_version or '?'})"


class ConnectionListener(Protocol):
    """Nacos ClientConnectionEventListener: told of every registration and removal."""

    def connected(self, conn: Connection) -> None: ...

    def disconnected(self, conn: Connection, reason: str) -> None: ...


def _share(mine: int, others: int, limit: int) -> int:
    """How many of ``mine`` to expel when ``mine + others`` may hold ``limit``: this worker's
    share of the excess, in proportion to what it holds, rounded up (all of it when alone)."""
    excess = mine + others - limit
    if excess <= 0 or mine <= 0:
        return 0
    return min(mine, -(-excess * mine // (mine + others)))


class ConnectionManager:
    """All gRPC connections of one server (SDK or cluster port)."""

    def __init__(self, config: Config, clock: Clock, limits: LimitRuleFile | None = None,
                 source: str = "sdk", listeners: Iterable[ConnectionListener] = (),
                 on_unregister: Iterable[Callable[[Connection, str], None]] = (),
                 siblings: SiblingConnections | None = None) -> None:
        self.config = config
        self.clock = clock
        self.limits = limits
        #: a worker's sibling workers' connections (the limits hold for the node): None alone
        self.siblings = siblings
        self.source = source
        self.by_peer: dict[str, Connection] = {}
        self.by_id: dict[str, Connection] = {}
        self.listeners: list[ConnectionListener] = list(listeners)
        self._stamps = array("q")
        self._slot_owner: list[Connection | None] = []
        self._free: list[int] = []
        self._per_ip: dict[str, int] = {}
        self._request_ids = itertools.count(1)
        self._seq = itertools.count(1)
        self.on_unregister_hooks: list[Callable[[Connection, str], None]] = list(on_unregister)
        self.garbage = RateLimitedLog(log)  # malformed responses: one line per interval

    # --- lookup and lifecycle -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, connection_id: str) -> Connection | None:
        return self.by_id.get(connection_id)

    def for_peer(self, peer: str) -> Connection | None:
        return self.by_peer.get(peer)

    def registered_count(self) -> int:
        return sum(1 for c in self.by_id.values() if c.registered)

    def own_counts(self) -> tuple[int, dict[str, int]]:
        """Registered connections, in all and per client ip (what a worker reports to its siblings)."""
        return self.registered_count(), self._per_ip

    def ensure(self, peer: str) -> Connection:
        """The connection of this transport, created (unregistered) on first sight."""
        conn = self.by_peer.get(peer)
        if conn is not None:
            return conn
        ip, port = parse_peer(peer)
        now = self.clock.now_ms()
        slot = self._take_slot()
        conn_id = f"{now}_{ip}_{port}"
        while conn_id in self.by_id:  # two transports from one ip:port in one ms cannot happen,
            now += 1                  # but a reused port after a fast reconnect can.
            conn_id = f"{now}_{ip}_{port}"
        conn = Connection(conn_id, peer, ip, port, slot, now, self.clock.monotonic_ms(), next(self._seq))
        self._slot_owner[slot] = conn
        self._stamps[slot] = conn.created_mono_ms
        self.by_peer[peer] = conn
        self.by_id[conn_id] = conn
        return conn

    def touch(self, conn: Connection) -> None:
        """Refresh last-active (every unary request and every response on the stream)."""
        if not conn.closed:
            self._stamps[conn.slot] = self.clock.monotonic_ms()

    def last_active_ms(self, conn: Connection) -> int:
        return self._stamps[conn.slot]

    def check_limit(self, client_ip: str, app: str) -> str | None:
        """Why a new SDK connection from this ip/app is over the limit rules, or None."""
        if self.limits is None or self.source != "sdk":
            return None
        rule, siblings = self.limits.rule, self.siblings
        if 0 <= rule.count_limit <= self.registered_count() + (siblings.total() if siblings is not None else 0):
            return f"total connection limit {rule.count_limit} reached"
        per_ip = rule.limit_for(client_ip, app)
        if 0 <= per_ip <= self._per_ip.get(client_ip, 0) + (siblings.per_ip(client_ip) if siblings is not None else 0):
            return f"connection limit {per_ip} for client ip {client_ip} (app {app}) reached"
        return None

    def register(self, conn: Connection) -> None:
        """Mark the connection set up and tell the listeners (naming creates its client)."""
        if conn.registered or conn.closed:
            return
        conn.registered = True
        self._per_ip[conn.client_ip] = self._per_ip.get(conn.client_ip, 0) + 1
        self.touch(conn)
        log.info("connection registered: %s labels=%s tenant=%r", conn.describe(), conn.labels, conn.tenant)
        for listener in self.listeners:
            try:
                listener.connected(conn)
            except Exception:
                log.exception("connection listener failed on register of %s", conn.connection_id)

    def unregister(self, connection_id: str, reason: str) -> bool:
        """Remove the connection, fail its pending requests, close its stream, tell listeners."""
        conn = self.by_id.pop(connection_id, None)
        if conn is None:
            return False
        conn.closed = True
        if self.by_peer.get(conn.peer) is conn:
            del self.by_peer[conn.peer]
        self._stamps[conn.slot] = -1
        self._slot_owner[conn.slot] = None
        self._free.append(conn.slot)
        for future in conn.pending.values():
            if not future.done():
                future.set_exception(ConnectionGone(reason))
        conn.pending.clear()
        if conn.stream is not None:  # ended UNAVAILABLE so the client reconnects
            conn.stream.close(UNAVAILABLE, f"connection unregistered by server: {reason}")
        if conn.registered:
            count = self._per_ip.get(conn.client_ip, 1) - 1
            if count > 0:
                self._per_ip[conn.client_ip] = count
            else:
                self._per_ip.pop(conn.client_ip, None)
            log.info("connection unregistered: %s (%s)", conn.describe(), reason)
            for listener in self.listeners:
                try:
                    listener.disconnected(conn, reason)
                except Exception:
                    log.exception("connection listener failed on unregister of %s", conn.connection_id)
        for hook in self.on_unregister_hooks:
            hook(conn, reason)
        return True

    def close_all(self, reason: str) -> None:
        for conn_id in list(self.by_id):
            self.unregister(conn_id, reason)

    # --- keep-alive support --------------------------------------------------------------
    def idle_connections(self, idle_ms: int) -> list[Connection]:
        """Connections whose last activity is at least ``idle_ms`` old (one kernel call)."""
        slots = expiry.idle_slots(self._stamps, self.clock.monotonic_ms(), idle_ms)
        owners = self._slot_owner
        return [conn for conn in (owners[s] for s in slots) if conn is not None]

    def over_limit(self) -> list[Connection]:
        """Connections to expel under the current rules (per-ip excess first, then total),
        newest first so long-lived clients keep their place (ConnectionManager's ejector).

        A worker counts its siblings' connections too (the rule is the node's) and expels its
        share of the node's excess, in proportion to what it holds, rounded up."""
        if self.limits is None or self.source != "sdk":
            return []
        rule = self.limits.rule
        registered = [c for c in self.by_id.values() if c.registered and c.source == "sdk"]
        registered.sort(key=lambda c: c.seq, reverse=True)
        expel: list[Connection] = []
        chosen: set[str] = set()
        by_ip: dict[str, list[Connection]] = {}
        for conn in registered:
            by_ip.setdefault(conn.client_ip, []).append(conn)
        siblings = self.siblings
        for ip, conns in by_ip.items():
            limit = rule.limit_for(ip, conns[0].app)
            if limit >= 0:
                for conn in conns[: _share(len(conns), siblings.per_ip(ip) if siblings is not None else 0, limit)]:
                    expel.append(conn)
                    chosen.add(conn.connection_id)
        if rule.count_limit >= 0:
            excess = _share(len(registered) - len(expel), siblings.total() if siblings is not None else 0,
                            rule.count_limit)
            for conn in registered:
                if excess <= 0:
                    break
                if conn.connection_id not in chosen:
                    expel.append(conn)
                    excess -= 1
        return expel

    # --- server → client requests ---------------------------------------------------------
    def next_request_id(self) -> str:
        return str(next(self._request_ids))

    def send(self, conn: Connection, data: bytes) -> None:
        """Queue one serialized Payload on the connection's stream (never blocks)."""
        stream = conn.stream
        if conn.closed or stream is None:
            raise ConnectionGone(f"connection {conn.connection_id} has no open stream")
        stream.send(data)

    async def write(self, conn: Connection, data: bytes) -> None:
        """:meth:`send` for callers that await (kept for the probe/reset paths)."""
        self.send(conn, data)

    async def request(self, connection_id: str, type_name: str, fields: Mapping[str, Any],
                      timeout_ms: int, raw: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Send a server request on the connection's stream and await the client's response.

        Raises ConnectionGone, or TimeoutError when no response arrives within ``timeout_ms``.
        """
        conn = self.by_id.get(connection_id)
        if conn is None or not conn.registered:
            raise ConnectionGone(f"connection {connection_id} is not registered")
        request_id = self.next_request_id()
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        conn.pending[request_id] = future
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                self.send(conn, payload_codec.encode(
                    type_name, codec.server_request(fields, request_id, raw)))
                return await future
        finally:
            conn.pending.pop(request_id, None)

    def on_response(self, conn: Connection, type_name: str, raw_body: bytes) -> None:
        """A response the client sent on its stream: refresh activity, resolve its request.

        A body that is not a JSON object (or is nested too deeply) is dropped with a
        rate-limited line; the stream stays, and the request it answered times out."""
        self.touch(conn)
        try:
            body = jsonfast.loads(raw_body) if raw_body else {}
        except ValueError as exc:
            self.garbage.warning("bad-response", "dropped %s on the stream of %s: body is not JSON (%s)",
                                 type_name, conn.connection_id, exc)
            return
        if not isinstance(body, dict):
            self.garbage.warning("bad-response", "dropped %s on the stream of %s: body is not a JSON object",
                                 type_name, conn.connection_id)
            return
        raw_id = body.get("requestId")
        request_id = str(raw_id) if isinstance(raw_id, str | int) else ""  # never str() of a nested value
        future = conn.pending.get(request_id)
        if future is None:
            log.debug("response for unknown request id %r from %s", request_id, conn.connection_id)
            return
        if not future.done():
            future.set_result(body)

    # --- slots ---------------------------------------------------------------------------
    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        self._stamps.append(-1)
        self._slot_owner.append(None)
        return len(self._stamps) - 1


def parse_peer(peer: str) -> tuple[str, int]:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` → (ip, port); anything else → (peer, 0)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and rest:
        host, _, port = rest.rpartition(":")
        host = host.strip("[]")
        try:
            return host, int(port)
        except ValueError:
            return host, 0
    return peer, 0


def is_success(body: Mapping[str, Any]) -> bool:
    return body.get("resultCode") == 200


__all__ = ["Connection", "ConnectionGone", "ConnectionListener", "ConnectionManager", "Payload", "StreamSink",
           "is_success"]
