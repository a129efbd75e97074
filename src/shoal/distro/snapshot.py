"""Snapshot serving and loading, paged so there is no size cliff.

Nacos answers SNAPSHOT with one gRPC message holding every client, which breaks past the
10 MiB message cap. Here the first request opens a session (the sorted client ids, held for a
minute) and every request returns one page of at most ``snapshot.chunk-bytes``: groups of
(owner address, syncser batch), so the loader knows whose copy each client is. A page is
encoded off the event loop. The loader walks the pages of the first peer that answers and
applies each as synced data; it retries the other peers, then all of them after
``load.retryDelayMs``, until ``load.timeoutMs``.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from shoal.clock import Clock
from shoal.distro import records
from shoal.distro.records import ClientRecord
from shoal.model.clients import ClientManager
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

SNAPSHOT_REQUEST = "DistroSnapshotRequest"
SESSION_TTL_MS = 60_000
CLIENTS_PER_GROUP = 2000


@dataclass
class _Session:
    ids: list[str]
    expires_ms: int


class SnapshotServer:
    def __init__(self, clock: Clock, clients: ClientManager, self_address: str, chunk_bytes: int,
                 is_loaded: Callable[[], bool] = lambda: True) -> None:
        self.clock = clock
        self.is_loaded = is_loaded
        self.clients = clients
        self.self_address = self_address
        self.chunk_bytes = chunk_bytes
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)

    async def page(self, body: bytes) -> bytes:
        """Answer one page request: JSON header line, newline, binary page."""
        request = json.loads(body) if body else {}
        now = self.clock.monotonic_ms()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires_ms > now}
        session_id = str(request.get("session") or "")
        session = self._sessions.get(session_id)
        if session is None:
            session_id = str(next(self._ids))
            session = self._sessions[session_id] = _Session(sorted(self.clients.clients), 0)
        session.expires_ms = now + SESSION_TTL_MS
        offset = int(request.get("offset") or 0)
        grouped: dict[str, list[ClientRecord]] = defaultdict(list)
        size = 0
        position = offset
        while position < len(session.ids) and size < self.chunk_bytes:
            client = self.clients.get(session.ids[position])
            position += 1
            if client is None:
                continue
            record = records.client_record(client)
            owner = self.self_address if client.native else client.owner
            grouped[owner].append(record)
            size += records.estimated_size(record)
        groups = list(grouped.items())
        page = await run_blocking(_encode_groups, groups)
        done = position >= len(session.ids)
        if done:
            self._sessions.pop(session_id, None)
        header = json.dumps({"session": session_id, "next": position, "done": done, "total": len(session.ids),
                             "loading": not self.is_loaded()})
        return header.encode() + b"\n" + page


def _encode_groups(groups: list[tuple[str, list[ClientRecord]]]) -> bytes:
    encoded: list[tuple[str, bytes]] = []
    for owner, recs in groups:
        for start in range(0, len(recs), CLIENTS_PER_GROUP):
            encoded.append((owner, records.encode(recs[start:start + CLIENTS_PER_GROUP])))
    return records.encode_page(encoded)


def split_page(body: bytes) -> tuple[dict[str, object], list[tuple[str, bytes]]]:
    head, sep, page = body.partition(b"\n")
    if not sep:
        raise ValueError("snapshot answer has no header line")
    return json.loads(head), records.decode_page(page)
