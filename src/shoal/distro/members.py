"""Cluster membership (Nacos ServerMemberManager, MemberUtil, MemberInfoReportTask), both sides.

Members come from ``--members ip:port,...`` or a Nacos ``cluster.conf`` (one ``ip[:port]`` per
line, ``#`` comments, reloaded when it changes). Each node reports itself to every peer every
``report-interval-ms``; a successful exchange marks the peer UP, a failure SUSPICIOUS, and more
than ``fail-access-cnt`` consecutive failures (or a refused connection) DOWN — suspicion comes
before death, as in Nacos. The Distro mapper's healthy list is UP + SUSPICIOUS, sorted by address.

A peer's state follows *our outgoing calls* to it (reports, sync, verify, snapshot pages,
forwarded writes), never what it sends us: a peer that can still send but cannot be reached
(an asymmetric partition) must go DOWN, so a report received from it does not reset its
failure count. Unlike Nacos, a report from a peer we hold SUSPICIOUS or DOWN makes us report
back at once, so a restarted peer is UP again after one round trip. A failure of a call that
started before the peer's last success is stale (a call in flight across the peer's restart,
or one refused by a channel still in its reconnect back-off) and is not counted.

:class:`MemberManager` holds the list and the states; :class:`MemberReporter` sends the reports
and answers them; :class:`ClusterConfWatcher` re-reads ``cluster.conf`` when it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from shoal.distro.transport import PeerTransport, PeerUnavailable
from shoal.errors import ConfigError
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

DEFAULT_PORT = 8848
REPORT_REQUEST = "MemberReportRequest"
REPORT_RESPONSE = "MemberReportResponse"


class MemberState(StrEnum):
    """A member's state as Nacos names it (NodeState)."""

    STARTING = "STARTING"
    UP = "UP"
    SUSPICIOUS = "SUSPICIOUS"
    DOWN = "DOWN"
    ISOLATION = "ISOLATION"


@dataclass
class Member:
    """One node of the cluster, identified by ``ip:port`` of its main (HTTP) port."""

    ip: str
    port: int
    state: MemberState = MemberState.UP
    fail_count: int = 0
    last_seen_ms: int = 0
    #: Successful outgoing exchanges so far: a call's failure counts only if none succeeded since it began.
    successes: int = 0
    extend: dict[str, str] = field(default_factory=dict)
    #: The last counted failure of an outgoing call to this peer: wall time (0 = none) and why.
    last_failure_ms: int = 0
    last_failure: str = ""

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def to_nacos(self) -> dict[str, Any]:
        """Nacos's Member JSON shape (docs/protocol.md §6.2)."""
        return {
            "ip": self.ip,
            "port": self.port,
            "state": self.state.value,
            "extendInfo": {"raftPort": str(self.port - 1000), "version": "shoal", **self.extend},
            "address": self.address,
            "failAccessCnt": self.fail_count,
            "abilities": {"remoteAbility": {"supportRemoteConnection": True, "grpcReportEnabled": True}},
            "grpcReportEnabled": True,
        }


def failure_text(what: str, exc: BaseException | None = None) -> str:
    """``what`` (the kind of call) and why it failed, for a member's last failure."""
    if exc is None:
        return f"{what}: no answer"
    return f"{what}: {str(exc) or type(exc).__name__}"


def parse_member(text: str) -> tuple[str, int]:
    """``ip[:port][?raft_port=N]`` → (ip, port); the port defaults to 8848 as in cluster.conf.

    Nacos's member entries may carry ``?raft_port=N`` (MEMBER_LIST, cluster.conf): accepted, not used.
    """
    item = text.split("?", 1)[0].strip()
    host, sep, port = item.rpartition(":")
    if not sep:
        host, port = item, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad cluster member {text!r}: expected ip[:port][?raft_port=N]")
    return host, int(port)


def parse_member_list(text: str) -> list[tuple[str, int]]:
    """Comma- or newline-separated ``ip[:port]`` items."""
    return [parse_member(part) for part in text.replace("\n", ",").split(",") if part.strip()]


def read_cluster_conf(path: Path) -> list[tuple[str, int]]:
    """cluster.conf: one ``ip[:port]`` per line (or comma-separated), ``#`` starts a comment."""
    members: list[tuple[str, int]] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            members.extend(parse_member_list(line))
    return members


def local_addresses(extra: Iterable[str] = ()) -> set[str]:
    """IPs that name this host: loopback, the hostname's addresses and configured ones."""
    found = {"127.0.0.1", "localhost", "::1", *[e for e in extra if e and e != "0.0.0.0"]}
    with contextlib.suppress(OSError):
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return found


class MemberManager:
    """The member list, this node's place in it, and every peer's state."""

    def __init__(self, self_ip: str, self_port: int, now_ms: Callable[[], int], fail_access_cnt: int = 3) -> None:
        self.self_member = Member(self_ip, self_port, MemberState.UP)
        self.now_ms = now_ms
        self.fail_access_cnt = fail_access_cnt
        self.peers: dict[str, Member] = {}
        self.listeners: list[Callable[[], None]] = []
        self._healthy_cache: list[str] | None = None

    @classmethod
    def from_list(cls, members: list[tuple[str, int]], port: int, now_ms: Callable[[], int],
                  self_ip: str = "", host: str = "", fail_access_cnt: int = 3) -> MemberManager:
        """Find this node in ``members`` (port match, then an ip of this host) and build."""
        candidates = [(ip, p) for ip, p in members if p == port]
        if self_ip:
            chosen = next(((ip, p) for ip, p in candidates if ip == self_ip), (self_ip, port))
        else:
            mine = local_addresses([host])
            matches = [(ip, p) for ip, p in candidates if ip in mine]
            if not matches:
                raise ConfigError(
                    f"this node (port {port}) is not in the member list {members}; "
                    "set nacos.inetutils.ip-address to the ip peers know it by"
                )
            chosen = matches[0]
        chosen_ip, chosen_port = chosen
        manager = cls(chosen_ip, chosen_port, now_ms, fail_access_cnt)
        manager.set_members(members)
        return manager

    # --- views ----------------------------------------------------------------------------
    @property
    def self_address(self) -> str:
        return self.self_member.address

    def all_members(self) -> list[Member]:
        return sorted([self.self_member, *self.peers.values()], key=lambda m: m.address)

    def peer_list(self) -> list[Member]:
        return sorted(self.peers.values(), key=lambda m: m.address)

    def healthy_addresses(self) -> list[str]:
        """UP + SUSPICIOUS members (self included), sorted: the Distro mapper's list."""
        if self._healthy_cache is None:
            self._healthy_cache = sorted(
                m.address for m in self.all_members() if m.state in (MemberState.UP, MemberState.SUSPICIOUS)
            )
        return self._healthy_cache

    def is_clustered(self) -> bool:
        """True when this node has peers."""
        return bool(self.peers)

    # --- changes --------------------------------------------------------------------------
    def set_members(self, members: Iterable[tuple[str, int]]) -> bool:
        """Replace the list (keeping the state of members already known); True if it changed."""
        wanted = {f"{ip}:{port}": (ip, port) for ip, port in members}
        wanted.pop(self.self_address, None)
        changed = False
        for address in list(self.peers):
            if address not in wanted:
                del self.peers[address]
                changed = True
                log.info("member %s left the list", address)
        for address, (ip, port) in wanted.items():
            if address not in self.peers:
                # a new peer is presumed UP until a report fails, so Distro syncs to it at once
                self.peers[address] = Member(ip, port, MemberState.UP, last_seen_ms=self.now_ms())
                changed = True
                log.info("member %s joined the list", address)
        if changed:
            self._changed()
        return changed

    def attempt(self, address: str) -> int:
        """A token to pass to :meth:`report_failed` for a call to ``address`` starting now."""
        member = self.peers.get(address)
        return member.successes if member is not None else 0

    def answering(self, address: str) -> bool:
        """True while our calls to ``address`` succeed (UP); False once one failed or it is not a member."""
        member = self.peers.get(address)
        return member is not None and member.state is MemberState.UP

    def report_succeeded(self, address: str, info: dict[str, Any] | None = None) -> None:
        """An outgoing exchange with ``address`` worked: it is UP and its failure count resets."""
        member = self.peers.get(address)
        if member is None:
            return
        member.fail_count = 0
        member.successes += 1
        member.last_seen_ms = self.now_ms()
        if member.state is not MemberState.UP:
            log.info("member %s is %s -> UP", address, member.state)
            member.state = MemberState.UP
            self._changed()

    def heard_from(self, address: str) -> bool:
        """A peer sent us something (its report): it is alive, which says nothing about whether
        *we* reach it. True when it is not UP here, i.e. worth an immediate report back."""
        member = self.peers.get(address)
        if member is None:
            return False
        member.last_seen_ms = self.now_ms()
        return member.state is not MemberState.UP

    def report_failed(self, address: str, refused: bool = False, attempt: int | None = None,
                      reason: str = "") -> None:
        """An outgoing exchange with ``address`` failed: UP → SUSPICIOUS, DOWN past
        fail-access-cnt or at once when the connection was refused. ``attempt`` (from
        :meth:`attempt` when the call began) makes a failure stale once a later call succeeded.
        ``reason`` (:func:`failure_text`) is kept with the time as the peer's last failure."""
        member = self.peers.get(address)
        if member is None:
            return
        if attempt is not None and attempt != member.successes:
            log.debug("ignoring a failed call to %s that began before its last success", address)
            return
        member.fail_count += 1
        member.last_failure_ms = self.now_ms()
        member.last_failure = reason or "call failed"
        new_state = member.state
        if refused or member.fail_count > self.fail_access_cnt:
            new_state = MemberState.DOWN
        elif member.state is MemberState.UP:
            new_state = MemberState.SUSPICIOUS
        if new_state is not member.state:
            log.warning("member %s is %s -> %s after %d failed reports", address, member.state, new_state,
                        member.fail_count)
            member.state = new_state
            self._changed()

    def _changed(self) -> None:
        self._healthy_cache = None
        for listener in self.listeners:
            try:
                listener()
            except Exception:
                log.exception("member change listener failed")


class MemberReporter:
    """Both sides of the member report: send this node's Member JSON to every peer (the answer,
    or its absence, drives that peer's state) and answer a peer's report (it is UP)."""

    def __init__(self, members: MemberManager, transport: PeerTransport, timeout_ms: int) -> None:
        self.members = members
        self.transport = transport
        self.timeout_ms = timeout_ms
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._in_flight: set[asyncio.Task[None]] = set()

    def _report_body(self) -> bytes:
        return json.dumps({"node": self.members.self_member.to_nacos()}).encode()

    async def report_round(self) -> None:
        """Report to every peer at once and wait for every answer (or its timeout)."""
        body = self._report_body()
        await asyncio.gather(*(self._report(m.address, body) for m in self.members.peer_list()))

    async def report_tick(self) -> None:
        """The periodic round: report to every peer without waiting for the answers, so a peer
        that does not answer is counted once per interval, not once per interval + timeout
        (at most timeout / interval + 1 reports per peer are in flight)."""
        body = self._report_body()
        loop = asyncio.get_running_loop()
        for member in self.members.peer_list():
            task = loop.create_task(self._report(member.address, body), name=f"member-report-{member.address}")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _report(self, address: str, body: bytes) -> None:
        attempt = self.members.attempt(address)
        try:
            kind, _ = await self.transport.call(address, REPORT_REQUEST, body, self.timeout_ms)
        except PeerUnavailable as exc:
            self.members.report_failed(address, refused=exc.refused, attempt=attempt,
                                       reason=failure_text("member report", exc))
            return
        except TimeoutError as exc:
            self.members.report_failed(address, attempt=attempt, reason=failure_text("member report", exc))
            return
        if kind == REPORT_RESPONSE:
            self.members.report_succeeded(address)
        else:
            self.members.report_failed(address, attempt=attempt, reason=f"member report: answered {kind}")

    async def handle(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a MemberReportRequest with this node's Member JSON. The sender is alive, but
        only our own calls say whether we reach it: when it is not UP here, report back now."""
        if self.members.heard_from(sender):
            self._probe(sender)
        return REPORT_RESPONSE, self._report_body()

    def _probe(self, address: str) -> None:
        """One immediate report to ``address`` (at most one in flight per peer)."""
        running = self._probes.get(address)
        if running is not None and not running.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - handle() always runs on the loop
            return
        task = loop.create_task(self._report(address, self._report_body()), name=f"member-probe-{address}")
        self._probes[address] = task
        task.add_done_callback(self._probe_done)

    def _probe_done(self, task: asyncio.Task[None]) -> None:
        for address, running in list(self._probes.items()):
            if running is task:
                del self._probes[address]

    async def stop(self) -> None:
        """Cancel the reports in flight."""
        tasks = [*self._probes.values(), *self._in_flight]
        self._probes.clear()
        self._in_flight.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ClusterConfWatcher:
    """Re-reads ``cluster.conf`` when its mtime changes; an invalid file keeps the current list."""

    def __init__(self, path: Path, members: MemberManager) -> None:
        self.path = path
        self.members = members
        self._mtime_ns: int | None = None

    async def reload(self) -> None:
        """One check (stat and read run off the event loop)."""
        path = self.path
        try:
            mtime = (await run_blocking(path.stat)).st_mtime_ns
        except OSError as exc:
            log.warning("cannot read cluster.conf %s: %s", path, exc)
            return
        if mtime == self._mtime_ns:
            return
        self._mtime_ns = mtime
        try:
            members = await run_blocking(read_cluster_conf, path)
        except (OSError, ValueError) as exc:
            log.error("cluster.conf %s is invalid, keeping the current members: %s", path, exc)
            return
        if self.members.set_members(members):
            log.info("cluster.conf reloaded: %s", [a for a, _ in members])
