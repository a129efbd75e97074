"""Snapshot serving and loading, both sides, paged so there is no size cliff.

Nacos answers SNAPSHOT with one gRPC message holding every client, which breaks past the
10 MiB message cap. Here the first request opens a session (the client ids in the manager's
order, held for a minute, ``snapshot.session-ttl-ms``) and every request returns one page:
groups of (owner address, syncser batch), so the loader knows whose copy each client is.

A loader that asks for a *stream* (``"stream": true``, what :class:`SnapshotLoader` sends) gets
the session's groups as one byte stream cut into pages of at most ``snapshot.chunk-bytes``,
whatever the size of a client: a connection client may publish a hundred thousand instances
(10 MB encoded), and a page of whole clients was that large, so serving it held the event loop
for every copy of it (joining the page, the Payload around it, the socket write): 60-160 ms per
page at 1,000,000 instances in 8 clients (``bench/distro/snapshot_load.py --gc-log``). A stream
page is bounded, so is every step of serving it; the loader keeps the tail of a group cut by a
page until the next page completes it. A request without ``stream`` (a loader of an older
version) gets pages of whole clients, as before.

Serving never holds the event loop for long: the session's id list is a plain copy of the
manager's keys (no sort, no filter: persistent clients, which come from the CP store, are
skipped while paging), and each client's record is encoded straight to bytes a slice of
:data:`INSTANCES_PER_SLICE` instances at a time with a yield to the loop in between; a group is
those bytes in batches of at most :data:`CLIENTS_PER_GROUP` clients. No per-instance tuple
outlives its slice, so serving a large snapshot gives the collector nothing to scan or promote
(building whole records left a page's worth of tuples alive across collections, and a large
heap's collections stalled the loop). The loader walks the pages of the first peer that answers
and applies each group as synced data; each page request waits at most
``snapshot.request-timeout-ms``, so a hung peer costs one such wait before the next peer is
asked. Peers known DOWN are not asked, UP ones before SUSPICIOUS ones; after a round without
success it waits ``load.retryDelayMs`` and tries again, until ``load.timeoutMs``.

:class:`SnapshotServer` answers page requests; :class:`SnapshotLoader` walks a peer's pages.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.clock import Clock
from shoal.config import Config
from shoal.distro import records
from shoal.distro.members import MemberManager, MemberState, failure_text
from shoal.distro.records import ClientRecord
from shoal.distro.transport import PeerError, PeerTransport, PeerUnavailable
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

SNAPSHOT_REQUEST = "DistroSnapshotRequest"
SNAPSHOT_RESPONSE = "DistroSnapshotResponse"
#: Clients per encoded (owner, batch) group of a page.
CLIENTS_PER_GROUP = 2000
#: Stream groups close at about this many bytes (or at a client's end, whatever its size): the
#: loader decodes a group in one call, in a thread that holds the GIL throughout.
GROUP_BYTES = 256 * 1024
#: Instances (or clients) turned into records between two yields to the event loop.
INSTANCES_PER_SLICE = 2000

#: Applies a decoded batch as the copies held for ``owner``; returns how many clients changed.
ApplyBatch = Callable[[str, list[ClientRecord]], int]


@dataclass
class _Session:
    ids: list[str]
    expires_ms: int
    #: Stream sessions: the next client to encode, the stream bytes answered so far, the encoded
    #: stream bytes not answered yet (at most a group), and whether a page is being built.
    position: int = 0
    sent: int = 0
    pending: deque[bytes] = field(default_factory=deque)
    busy: bool = False


class SnapshotServer:
    """The serving side: pages of every client this node holds, in a session per loader."""

    def __init__(self, clock: Clock, clients: ClientManager, self_address: str, chunk_bytes: int,
                 session_ttl_ms: int, is_loaded: Callable[[], bool] = lambda: True) -> None:
        self.clock = clock
        self.is_loaded = is_loaded
        self.clients = clients
        self.self_address = self_address
        self.chunk_bytes = chunk_bytes
        self.session_ttl_ms = session_ttl_ms
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)

    async def handle(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroSnapshotRequest with one page."""
        return SNAPSHOT_RESPONSE, await self.page(body)

    async def page(self, body: bytes) -> bytes:
        """Answer one page request: JSON header line, newline, binary page."""
        request = json.loads(body) if body else {}
        now = self.clock.monotonic_ms()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires_ms > now}
        session_id = str(request.get("session") or "")
        session = self._sessions.get(session_id)
        if session is None:
            session_id = str(next(self._ids))
            # the keys only (no sort, no filter: the loop is not held); non-replicated ones are skipped later
            session = self._sessions[session_id] = _Session(list(self.clients.clients), 0)
        session.expires_ms = now + self.session_ttl_ms
        offset = int(request.get("offset") or 0)
        if request.get("stream") is True:
            return await self._stream_page(session_id, session, offset)
        grouped: dict[str, list[list[bytes]]] = defaultdict(list)
        size = 0
        position = offset
        budget = [INSTANCES_PER_SLICE]  # instances until the next yield to the loop
        while position < len(session.ids) and size < self.chunk_bytes:
            client = self.clients.get(session.ids[position])
            position += 1
            if client is None or not client.replicated:
                await _spend(budget, 1)
                continue
            owner = self.self_address if client.native else client.owner
            record = await _encoded_record(client, budget)
            grouped[owner].append(record)
            size += sum(len(part) for part in record)
        done = position >= len(session.ids)
        if done:
            self._sessions.pop(session_id, None)
        header = json.dumps({"session": session_id, "next": position, "done": done, "total": len(session.ids),
                             "loading": not self.is_loaded()})
        return b"".join([header.encode(), b"\n", *_page_pieces(grouped)])  # the page's only copy

    async def _stream_page(self, session_id: str, session: _Session, offset: int) -> bytes:
        """The next at most ``chunk_bytes`` of the session's group stream; ``offset`` must be the
        stream bytes answered so far (a page is answered once: a loader that lost one starts over)."""
        if offset != session.sent or session.busy:
            raise ValueError(f"snapshot session {session_id}: offset {offset} is not the stream's {session.sent}"
                             " (or a page of it is being built)")
        session.busy = True
        try:
            out: list[bytes] = []
            size = 0
            budget = [INSTANCES_PER_SLICE]
            while size < self.chunk_bytes:
                if not session.pending:
                    if session.position >= len(session.ids):
                        break
                    await self._next_group(session, budget)
                    continue
                piece = session.pending.popleft()
                room = self.chunk_bytes - size
                if len(piece) > room:  # pieces are a slice of instances at most (~100 KB): cheap to cut
                    session.pending.appendleft(piece[room:])
                    piece = piece[:room]
                out.append(piece)
                size += len(piece)
            session.sent += size
        finally:
            session.busy = False
        done = session.position >= len(session.ids) and not session.pending
        if done:
            self._sessions.pop(session_id, None)
        header = json.dumps({"session": session_id, "next": session.sent, "done": done, "total": len(session.ids),
                             "loading": not self.is_loaded(), "stream": True})
        return b"".join([header.encode(), b"\n", *out])

    async def _next_group(self, session: _Session, budget: list[int]) -> None:
        """Encode the session's next group (consecutive clients of one owner, at most
        :data:`CLIENTS_PER_GROUP` of them and about :data:`GROUP_BYTES`) onto its pending stream."""
        owner = ""
        recs: list[list[bytes]] = []
        size = 0
        limit = min(self.chunk_bytes, GROUP_BYTES)
        while session.position < len(session.ids) and len(recs) < CLIENTS_PER_GROUP and size < limit:
            client = self.clients.get(session.ids[session.position])
            if client is None or not client.replicated:
                session.position += 1
                await _spend(budget, 1)
                continue
            client_owner = self.self_address if client.native else client.owner
            if recs and client_owner != owner:
                break
            owner = client_owner
            session.position += 1
            record = await _encoded_record(client, budget)
            recs.append(record)
            size += sum(len(part) for part in record)
        if recs:
            session.pending.extend(records.page_pieces([(owner, recs)]))


async def _spend(budget: list[int], items: int) -> None:
    """Count ``items`` against the slice budget; yield to the loop when it is spent."""
    budget[0] -= items
    if budget[0] <= 0:
        budget[0] = INSTANCES_PER_SLICE
        await asyncio.sleep(0)  # other requests (health checks, pushes) run in between


async def _encoded_record(client: Client, budget: list[int]) -> list[bytes]:
    """The client's encoded sync record (as pieces), made a slice of instances at a time with a yield to
    the loop whenever ``budget[0]`` instances have been encoded (a client may publish a hundred
    thousand). Only encoded bytes outlive a slice: no per-instance tuple survives to be scanned
    and promoted by the collector while the page is built."""
    revision = client.revision
    publications = list(client.publications.items())  # replaced, never mutated, by the model writer
    parts: list[bytes] = []
    for instances, part in records.client_record_parts(client.client_id, revision, publications,
                                                       INSTANCES_PER_SLICE):
        parts.append(part)
        await _spend(budget, 1 + instances)
    return parts


def _page_pieces(grouped: dict[str, list[list[bytes]]]) -> list[bytes]:
    """The page: per owner, batches of at most :data:`CLIENTS_PER_GROUP` encoded records."""
    return records.page_pieces((owner, recs[start:start + CLIENTS_PER_GROUP])
                               for owner, recs in grouped.items()
                               for start in range(0, len(recs), CLIENTS_PER_GROUP))


def split_page(body: bytes) -> tuple[dict[str, object], list[tuple[str, bytes]]]:
    """A page answer of whole groups → (JSON header, [(owner, encoded batch)])."""
    header, page = split_header(body)
    return header, records.decode_page(page)


def split_header(body: bytes) -> tuple[dict[str, object], bytes]:
    """A page answer → (JSON header, page bytes)."""
    head, sep, page = body.partition(b"\n")
    if not sep:
        raise ValueError("snapshot answer has no header line")
    header = json.loads(head)
    if not isinstance(header, dict):
        raise ValueError("snapshot answer's header is no JSON object")
    return header, page


class _PeerLoading(Exception):
    """The peer is itself still loading its snapshot."""


class SnapshotLoader:
    """The loading side: every client from the first peer that answers, page by page.

    Peers that finished their own load are preferred; when every reachable peer is itself
    loading (a cluster starting cold) one of those is taken. It retries every
    ``load.retryDelayMs`` until a load succeeds, then calls ``on_loaded(peer, count)``.
    """

    def __init__(self, config: Config, clients: ClientManager, members: MemberManager, transport: PeerTransport,
                 apply: ApplyBatch, enqueue: Callable[[str, int], None], is_loaded: Callable[[], bool],
                 on_loaded: Callable[[str, int], None]) -> None:
        self.config = config
        self.clients = clients
        self.members = members
        self.transport = transport
        self.apply = apply
        self.enqueue = enqueue
        self.is_loaded = is_loaded
        self.on_loaded = on_loaded

    def _candidates(self) -> list[str]:
        """Peers to ask, UP ones first, then SUSPICIOUS ones; DOWN ones are not asked (a report
        from one brings it back, and it is asked in the next round)."""
        peers = [m for m in self.members.peer_list() if m.state is not MemberState.DOWN]
        return [m.address for m in sorted(peers, key=lambda m: m.state is not MemberState.UP)]

    async def load(self) -> None:
        """Retry the peers until one load succeeds (or someone else marks this node loaded)."""
        while not self.is_loaded():
            loading_peers: list[str] = []
            for accept_loading in (False, True):
                candidates = loading_peers if accept_loading else self._candidates()
                for address in candidates:
                    attempt = self.members.attempt(address)
                    try:
                        count = await self.load_from(address, accept_loading)
                    except _PeerLoading:
                        loading_peers.append(address)
                        continue
                    except (PeerUnavailable, TimeoutError) as exc:
                        # the transport logs the peer's state once; our own failed call counts
                        log.debug("snapshot load from %s failed: %s", address, exc)
                        self.members.report_failed(address, refused=isinstance(exc, PeerUnavailable) and exc.refused,
                                                   attempt=attempt, reason=failure_text("snapshot load", exc))
                        continue
                    except (PeerError, ValueError) as exc:
                        log.warning("snapshot load from %s failed: %s", address, exc)
                        continue
                    self.on_loaded(address, count)
                    return
            await asyncio.sleep(self.config.load_retry_delay_ms / 1000)

    async def load_from(self, target: str, accept_loading: bool = True) -> int:
        """Walk every page of ``target``'s snapshot; returns the number of clients applied."""
        session: object = ""
        offset: object = 0
        total = 0
        tail = b""  # stream pages: the start of a group the next page completes
        while True:
            request = json.dumps({"session": session, "offset": offset, "stream": True}).encode()
            kind, body = await self.transport.call(target, SNAPSHOT_REQUEST, request,
                                                   self.config.snapshot_request_timeout_ms)
            if kind != SNAPSHOT_RESPONSE:
                raise PeerError(f"{target} answered {kind}: {body[:200]!r}")
            header, page = split_header(body)
            if header.get("loading") and not accept_loading:
                raise _PeerLoading(target)
            if header.get("stream") is True:
                groups, tail = await run_blocking(records.take_groups, tail, page)
            else:  # a server of an older version: pages of whole groups
                groups = await run_blocking(records.decode_page, page)
            del body, page
            for owner, batch in groups:
                if owner == self.members.self_address and self._live_native(records.sole_client_id(batch)):
                    continue  # our own live client (kept as is below): its copy is not even decoded
                decoded = await run_blocking(records.decode, batch)
                if owner == self.members.self_address:
                    decoded = self._forget_previous_life(decoded)
                self.apply(owner, decoded)
                total += len(decoded)
                await asyncio.sleep(0)  # let the loop breathe between groups
            if header.get("done"):
                if tail:
                    raise PeerError(f"{target}'s snapshot stream ended inside a group ({len(tail)} bytes)")
                return total
            session, offset = header["session"], header["next"]

    def _live_native(self, client_id: str | None) -> bool:
        """Whether ``client_id`` is one of this node's own live clients. Its copy in a peer's
        snapshot is dropped anyway; a node that serves while it still loads (its load timed out)
        gets its own large clients back, and decoding one (~70 ms for 100,000 instances, in a thread
        that holds the GIL throughout) would stall its loop."""
        live = self.clients.get(client_id) if client_id is not None else None
        return live is not None and live.native

    def _forget_previous_life(self, batch: list[ClientRecord]) -> list[ClientRecord]:
        """Peers' copies of connection clients we owned before a restart: those connections died
        with the old process, so, as their owner, send the DELETE; ip:port clients are kept."""
        kept = []
        for record in batch:
            _op, client_id, _revision, _services = record
            live = self.clients.get(client_id)
            if live is not None and live.native:
                continue  # ours and alive (this node served before its load finished): keep it
            if records.kind_of(client_id) is ClientKind.CONNECTION:
                self.enqueue(client_id, records.OP_DELETE)
            else:
                kept.append(record)
        dropped = len(batch) - len(kept)
        if dropped:
            log.info("deleting %d connection clients of this node's previous run from its peers", dropped)
        return kept
