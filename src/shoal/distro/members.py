"""Cluster membership (Nacos ServerMemberManager, MemberUtil, MemberInfoReportTask), both sides.

Operators list *nodes*: ``--members ip:port,...`` or a Nacos ``cluster.conf`` (one ``ip[:port]``
per line, ``#`` comments, reloaded when it changes). A node run with ``--workers N`` is N Distro
members, one per worker, each named ``ip:private_port`` (``shoal.workers.placement``): a worker's
own node's workers are members from the start; another node's are *discovered* from the member
reports, which say which node the sender belongs to and its workers (docs/protocol.md §6.1).
Until then that node is a member under its node address (its public cluster port answers from
any of its workers), as a single-process node always is. Distro, its transport and the HTTP
forwarder see only members; :meth:`MemberManager.nodes` is the one-member-per-node view that
Nacos APIs, operators and the CP store see. Each node reports itself to every peer every
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from shoal import jsonfast
from shoal.distro.transport import NODE_HEADER, WORKERS_HEADER, PeerTransport, PeerUnavailable
from shoal.errors import ConfigError
from shoal.tasks import run_blocking

if TYPE_CHECKING:
    from shoal.clock import Clock
    from shoal.config import Config
    from shoal.workers.placement import WorkerPlacement

log = logging.getLogger(__name__)

DEFAULT_PORT = 8848
REPORT_REQUEST = "MemberReportRequest"
REPORT_RESPONSE = "MemberReportResponse"
#: The key of a report (and of its answer) between two workers of one node: the sender's figures
#: its siblings need (its SDK connections, so the connection limits hold for the node).
WORKER_LOAD_KEY = "workerLoad"


class SiblingExchange(Protocol):
    """What the workers of one node tell each other in their member reports (the gRPC transport's
    ``SiblingConnections`` fits): sent only to and read only from this node's other workers."""

    def outgoing(self) -> dict[str, Any]: ...

    def received(self, member: str, figures: Any) -> None: ...


def worker_load(body: bytes) -> Any:
    """The ``workerLoad`` of a report or its answer (None when absent or the body is no JSON object)."""
    try:
        doc = jsonfast.loads(body) if body else None
    except ValueError:
        return None
    return doc.get(WORKER_LOAD_KEY) if isinstance(doc, dict) else None


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


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """What a member report (or its answer) says about the process that sent it."""

    member: str  #: the sending process's member name (``ip:port``, a worker's ``ip:private_port``)
    node: str  #: the node it belongs to (``ip:port``, the node's public main port)
    workers: tuple[int, ...]  #: the node's workers' private ports, sorted; () for a single-process node


def parse_report(body: bytes) -> NodeLayout | None:
    """The sender's layout from a report body or its answer (docs/protocol.md §6.2); None when the
    body does not say who sent it. A body without ``nodeAddress`` (an older Shoal node) is a
    single-process node named by its Member JSON."""
    try:
        doc = jsonfast.loads(body) if body else None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    node_json = doc.get("node")
    if not isinstance(node_json, dict):
        return None
    member = node_json.get("address")
    if not isinstance(member, str) or not member:
        ip, port = node_json.get("ip"), node_json.get("port")
        if not isinstance(ip, str) or isinstance(port, bool) or not isinstance(port, int):
            return None
        member = f"{ip}:{port}"
    node = doc.get("nodeAddress") or member
    workers = doc.get("workers") or []
    if not isinstance(node, str) or not isinstance(workers, list):
        return None
    if any(isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536 for p in workers):
        return None
    return NodeLayout(member, node, tuple(sorted(set(workers))))


def introduced_by(sender: str, headers: Mapping[str, str]) -> NodeLayout | None:
    """The layout a cluster request's headers (lower-cased) give for its sender: a worker's
    name its node and the node's workers (:meth:`MemberManager.introduction`); None otherwise."""
    node, workers = headers.get(NODE_HEADER, ""), headers.get(WORKERS_HEADER, "")
    if not sender or not node or not workers:
        return None
    try:
        ports = tuple(sorted({int(p) for p in workers.split(",")}))
    except ValueError:
        return None
    if not all(0 < p < 65536 for p in ports):
        return None
    return NodeLayout(sender, node, ports)


#: The worst of a node's workers' states when none is UP or SUSPICIOUS, worst first.
_WORST_FIRST = (MemberState.DOWN, MemberState.ISOLATION, MemberState.STARTING, MemberState.SUSPICIOUS,
                MemberState.UP)


class MemberManager:
    """The member list, this process's place in it, and every peer's state.

    Members are Distro's: one per process (a multi-worker node's workers each, a single-process
    node or a node whose workers are not known yet under its node address). The configured list
    and :meth:`nodes` are per node."""

    def __init__(self, self_ip: str, self_port: int, now_ms: Callable[[], int], fail_access_cnt: int = 3,
                 node_port: int = 0, worker_ports: Sequence[int] = ()) -> None:
        """``self_port`` names this process; ``node_port`` (its node's public port, default
        ``self_port``) and ``worker_ports`` (every worker's private port, this one's included)
        place a worker in its node."""
        self.self_member = Member(self_ip, self_port, MemberState.UP)
        self.self_node = (self_ip, node_port or self_port)
        self.self_workers: tuple[int, ...] = tuple(sorted(set(worker_ports)))
        if self.self_workers and self_port not in self.self_workers:
            raise ConfigError(f"worker port {self_port} is not among the node's worker ports {self.self_workers}")
        self.now_ms = now_ms
        self.fail_access_cnt = fail_access_cnt
        self.peers: dict[str, Member] = {}
        self.listeners: list[Callable[[], None]] = []
        self._healthy_cache: list[str] | None = None
        #: the configured nodes by address (this node always among them)
        self._nodes: dict[str, tuple[str, int]] = {self.self_node_address: self.self_node}
        #: each node's workers as far as known: absent = not known yet, () = a single-process node
        self._layouts: dict[str, tuple[int, ...]] = {self.self_node_address: self.self_workers}
        #: every member's node
        self._node_of: dict[str, str] = {self.self_address: self.self_node_address}

    @classmethod
    def from_list(cls, members: list[tuple[str, int]], port: int, now_ms: Callable[[], int],
                  self_ip: str = "", host: str = "", fail_access_cnt: int = 3,
                  placement: WorkerPlacement | None = None) -> MemberManager:
        """Find this node in ``members`` (port match, then an ip of this host) and build. With a
        ``placement`` this process is the worker ``ip:placement.private_port`` of that node and
        its siblings are members from the start; a node of workers with no list is alone with them."""
        candidates = [(ip, p) for ip, p in members if p == port]
        if self_ip:
            chosen = next(((ip, p) for ip, p in candidates if ip == self_ip), (self_ip, port))
        elif not members and placement is not None:
            chosen = (host if host not in ("", "0.0.0.0", "::") else "127.0.0.1", port)
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
        if placement is None:
            manager = cls(chosen_ip, chosen_port, now_ms, fail_access_cnt)
        else:
            manager = cls(chosen_ip, placement.private_port, now_ms, fail_access_cnt, node_port=chosen_port,
                          worker_ports=placement.ports)
        manager.set_members(members)
        return manager

    # --- views ----------------------------------------------------------------------------
    @property
    def self_address(self) -> str:
        """This process's member name (a worker's ``ip:private_port``)."""
        return self.self_member.address

    @property
    def self_node_address(self) -> str:
        """This process's node's ``ip:port`` (its own address unless it is a worker)."""
        return f"{self.self_node[0]}:{self.self_node[1]}"

    def introduction(self) -> dict[str, str]:
        """The headers a worker's cluster requests carry besides its name: its node and the
        node's workers (:func:`introduced_by` reads them); none for a single-process node."""
        if not self.self_workers:
            return {}
        return {NODE_HEADER: self.self_node_address, WORKERS_HEADER: ",".join(map(str, self.self_workers))}

    def all_members(self) -> list[Member]:
        """Every Distro member, this process included, sorted by address."""
        return sorted([self.self_member, *self.peers.values()], key=lambda m: m.address)

    def peer_list(self) -> list[Member]:
        """Every other Distro member (this node's sibling workers included)."""
        return sorted(self.peers.values(), key=lambda m: m.address)

    def sibling_addresses(self) -> tuple[str, ...]:
        """This worker's sibling workers (``ip:private_port`` each); () for a single-process node."""
        ip, port = self.self_member.ip, self.self_member.port
        return tuple(f"{ip}:{p}" for p in self.self_workers if p != port)

    def healthy_addresses(self) -> list[str]:
        """UP + SUSPICIOUS members (self included), sorted: the Distro mapper's list."""
        if self._healthy_cache is None:
            self._healthy_cache = sorted(
                m.address for m in self.all_members() if m.state in (MemberState.UP, MemberState.SUSPICIOUS)
            )
        return self._healthy_cache

    def is_clustered(self) -> bool:
        """True when this process has peers (other nodes or sibling workers)."""
        return bool(self.peers)

    def is_member(self, address: str) -> bool:
        """True for this process and every peer."""
        return address == self.self_address or address in self.peers

    def node_of(self, address: str) -> str | None:
        """The node a member belongs to (None: not a member)."""
        return self._node_of.get(address)

    def workers_of(self, node: str) -> tuple[int, ...] | None:
        """A node's workers' private ports: None while not known, () for a single-process node."""
        return self._layouts.get(node)

    def nodes(self) -> list[Member]:
        """One Member per configured node, sorted, for Nacos APIs, operators and the CP store.

        This node is UP. Another node is its member's copy while it is one process (or its
        workers are not known yet); a node of workers is UP while any worker is UP or
        SUSPICIOUS, else its workers' worst state. ``extend`` carries ``workers`` (the count,
        once known) and, for a node of workers, ``workerStates`` (``ip:port=STATE,...``)."""
        by_node: dict[str, list[Member]] = {}
        for member in self.all_members():
            by_node.setdefault(self._node_of.get(member.address, member.address), []).append(member)
        out: list[Member] = []
        for node, (ip, port) in sorted(self._nodes.items()):
            workers = by_node.get(node, [])
            layout = self._layouts.get(node)
            extend = {"workers": str(len(layout) or 1)} if layout is not None else {}
            if layout:
                extend["workerStates"] = ",".join(f"{m.address}={m.state.value}" for m in workers)
            if node == self.self_node_address:
                out.append(Member(ip, port, MemberState.UP, extend=extend))
            elif len(workers) == 1 and workers[0].address == node:
                out.append(replace(workers[0], extend={**workers[0].extend, **extend}))
            elif workers:
                alive = any(m.state in (MemberState.UP, MemberState.SUSPICIOUS) for m in workers)
                state = MemberState.UP if alive else min((m.state for m in workers), key=_WORST_FIRST.index)
                last = max(workers, key=lambda m: m.last_failure_ms)
                out.append(Member(ip, port, state, fail_count=min(m.fail_count for m in workers),
                                  last_seen_ms=max(m.last_seen_ms for m in workers),
                                  successes=sum(m.successes for m in workers), extend=extend,
                                  last_failure_ms=last.last_failure_ms, last_failure=last.last_failure))
        return out

    def self_node_member(self) -> Member:
        """This node's entry of :meth:`nodes`."""
        return next(m for m in self.nodes() if m.address == self.self_node_address)

    # --- changes --------------------------------------------------------------------------
    def set_members(self, members: Iterable[tuple[str, int]]) -> bool:
        """Replace the list of nodes (keeping the state of members already known, and the
        workers of nodes that stay); True if the members changed."""
        nodes = {f"{ip}:{port}": (ip, port) for ip, port in members}
        nodes[self.self_node_address] = self.self_node
        for gone in set(self._layouts) - set(nodes):
            del self._layouts[gone]  # a node leaving the list takes its workers with it
        self._nodes = nodes
        return self._rebuild()

    def learn(self, layout: NodeLayout, via: str | None = None) -> bool:
        """A report (or, ``via`` the member we called, its answer) told us a node's workers: its
        members become those workers (its node address while it reports none). Only a listed
        node other than this one is learnt, and only from one of the processes it names (and,
        for an answer, from a call to a member of that node). True when the members changed."""
        node = self._nodes.get(layout.node)
        if node is None or layout.node == self.self_node_address:
            return False
        names = {f"{node[0]}:{p}" for p in layout.workers} if layout.workers else {layout.node}
        if layout.member not in names or (via is not None and self._node_of.get(via) != layout.node):
            return False
        if self._layouts.get(layout.node) == layout.workers:
            return False
        log.info("node %s runs %s", layout.node,
                 f"{len(layout.workers)} workers {sorted(names)}" if layout.workers else "one process")
        self._layouts[layout.node] = layout.workers
        return self._rebuild()

    def _rebuild(self) -> bool:
        """The members from the nodes and their known workers; True (and listeners told) if they changed."""
        wanted: dict[str, tuple[str, int, str]] = {}
        for node, (ip, port) in self._nodes.items():
            workers = self._layouts.get(node)
            for member_port in workers or (port,):
                wanted.setdefault(f"{ip}:{member_port}", (ip, member_port, node))
        wanted.pop(self.self_address, None)
        self._node_of = {address: node for address, (_, _, node) in wanted.items()}
        self._node_of[self.self_address] = self.self_node_address
        changed = False
        for address in list(self.peers):
            if address not in wanted:
                del self.peers[address]
                changed = True
                log.info("member %s left the list", address)
        for address, (ip, port, _node) in wanted.items():
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
    """Both sides of the member report: send this process's Member JSON, its node and the node's
    workers to every peer (the answer, or its absence, drives that peer's state; the answer says
    the same of the answering side, so both directions learn) and answer a peer's report."""

    def __init__(self, members: MemberManager, transport: PeerTransport, timeout_ms: int,
                 siblings: SiblingExchange | None = None) -> None:
        self.members = members
        self.transport = transport
        self.timeout_ms = timeout_ms
        #: what a worker exchanges with its sibling workers (None: nothing beyond the layout)
        self.siblings = siblings
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._in_flight: set[asyncio.Task[None]] = set()

    def _report_body(self, sibling: bool = False) -> bytes:
        """``node`` (this process's Member JSON) as ever; ``nodeAddress`` and ``workers`` say which
        node it belongs to and the node's workers (docs/protocol.md §6.2); to a sibling worker,
        ``workerLoad`` too."""
        members = self.members
        doc: dict[str, Any] = {"node": members.self_member.to_nacos(), "nodeAddress": members.self_node_address,
                               "workers": list(members.self_workers)}
        if sibling and self.siblings is not None:
            doc[WORKER_LOAD_KEY] = self.siblings.outgoing()
        return json.dumps(doc).encode()

    def _is_sibling(self, address: str) -> bool:
        """True for another worker of this process's node."""
        members = self.members
        return (self.siblings is not None and address != members.self_address
                and members.node_of(address) == members.self_node_address)

    def _bodies(self) -> Callable[[str], bytes]:
        """The body for each peer of one round (built at most twice: for siblings and for the others)."""
        built: dict[bool, bytes] = {}

        def body(address: str) -> bytes:
            sibling = self._is_sibling(address)
            if sibling not in built:
                built[sibling] = self._report_body(sibling)
            return built[sibling]
        return body

    async def report_round(self) -> None:
        """Report to every peer at once and wait for every answer (or its timeout)."""
        body = self._bodies()
        await asyncio.gather(*(self._report(m.address, body(m.address)) for m in self.members.peer_list()))

    async def report_tick(self) -> None:
        """The periodic round: report to every peer without waiting for the answers, so a peer
        that does not answer is counted once per interval, not once per interval + timeout
        (at most timeout / interval + 1 reports per peer are in flight)."""
        body = self._bodies()
        loop = asyncio.get_running_loop()
        for member in self.members.peer_list():
            task = loop.create_task(self._report(member.address, body(member.address)),
                                    name=f"member-report-{member.address}")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _report(self, address: str, body: bytes) -> None:
        attempt = self.members.attempt(address)
        try:
            kind, answer = await self.transport.call(address, REPORT_REQUEST, body, self.timeout_ms)
        except PeerUnavailable as exc:
            self.members.report_failed(address, refused=exc.refused, attempt=attempt,
                                       reason=failure_text("member report", exc))
            return
        except TimeoutError as exc:
            self.members.report_failed(address, attempt=attempt, reason=failure_text("member report", exc))
            return
        if kind == REPORT_RESPONSE:
            self.members.report_succeeded(address)
            layout = parse_report(answer)
            if layout is not None:
                self.members.learn(layout, via=address)
            if self.siblings is not None and self._is_sibling(address):
                self.siblings.received(address, worker_load(answer))
        else:
            self.members.report_failed(address, attempt=attempt, reason=f"member report: answered {kind}")

    def admit(self, sender: str, body: bytes) -> bool:
        """Learn the sender's node and workers from its report; True when the sender is a member
        then (a worker of a listed node we did not know yet becomes one here)."""
        layout = parse_report(body)
        if layout is not None and layout.member == sender:
            self.members.learn(layout)
        return self.members.is_member(sender)

    async def handle(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a MemberReportRequest with this process's Member JSON, node and workers, having
        learnt the sender's. The sender is alive, but only our own calls say whether we reach it:
        when it is not UP here, report back now."""
        self.admit(sender, body)
        if self.members.heard_from(sender):
            self._probe(sender)
        sibling = self._is_sibling(sender)
        if sibling and self.siblings is not None:
            self.siblings.received(sender, worker_load(body))
        return REPORT_RESPONSE, self._report_body(sibling)

    def _probe(self, address: str) -> None:
        """One immediate report to ``address`` (at most one in flight per peer)."""
        running = self._probes.get(address)
        if running is not None and not running.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - handle() always runs on the loop
            return
        task = loop.create_task(self._report(address, self._report_body(self._is_sibling(address))),
                                name=f"member-probe-{address}")
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


def build_members(config: Config, clock: Clock, placement: WorkerPlacement | None = None) -> MemberManager | None:
    """The member list (``nacos.member.list``, else cluster.conf); None: standalone. A worker of a
    standalone node is a member among its sibling workers, ``ip:private_port`` each. (Here, not in
    app.py, so that a node's supervisor checks the list as its workers will without importing them.)"""
    member_list = parse_member_list(config.members)
    if not member_list and config.cluster_conf:
        try:
            member_list = read_cluster_conf(Path(config.cluster_conf))
        except OSError as exc:
            raise ConfigError(f"cannot read cluster.conf {config.cluster_conf}: {exc.strerror}") from None
    if placement is not None and not member_list:  # a standalone node of workers: they are its members
        from shoal.workers.worker import worker_ip

        return MemberManager.from_list([], config.port, clock.now_ms, self_ip=worker_ip(config),
                                       fail_access_cnt=config.member_fail_access_cnt, placement=placement)
    if not member_list:
        return None
    return MemberManager.from_list(member_list, config.port, clock.now_ms, self_ip=config.self_address,
                                   host=config.host, fail_access_cnt=config.member_fail_access_cnt,
                                   placement=placement)
