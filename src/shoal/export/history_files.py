"""The history log's files: append-only JSON-lines segments, rotated by size, bounded in total.

Blocking code: the node calls it through ``tasks.run_blocking`` (one call at a time, the
history log serialises them), never on the event loop.

Why JSON lines and not Arrow IPC: a row is appended in small batches all day long and a node
may be killed between two of them. A JSON-lines segment is valid up to its last complete line
(a torn tail is one bad line, skipped on read), needs no schema shared between rows of
different kinds, is read by ``grep`` in an incident and by Spark's JSON reader as it is, and
its size is known exactly when the bound is enforced. Arrow would compress better but needs a
footer or a stream that ends cleanly.

Layout: ``<dir>/history-<seq>.jsonl``, ``seq`` counting up. A starting node reads what is
there (sizes only) and opens a new segment, so a restart keeps the older history and never
appends to a file a crash may have torn. The bound is strict: before a line is written the
oldest segments are deleted until the total, that line included, is within ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from shoal import jsonfast
from shoal.export.history_rows import PUSH

log = logging.getLogger(__name__)

PREFIX = "history-"
SUFFIX = ".jsonl"


def list_digest(payload: str) -> str:
    """The revision of a pushed list: a digest of the ServiceInfo JSON without its ``lastRefTime``
    value (fresh on every push), so equal lists pushed twice share one digest."""
    start = payload.find('"lastRefTime":')
    if start >= 0:
        end = payload.find(",", start)
        payload = payload[:start] + (payload[end:] if end >= 0 else "")
    return hashlib.blake2b(payload.encode(), digest_size=8).hexdigest()


def hosts_of(payload: str) -> list[dict[str, Any]]:
    """The instances of a pushed ServiceInfo JSON, with the fields a subscriber acts on."""
    info = jsonfast.loads(payload)
    return [{"ip": h.get("ip"), "port": h.get("port"), "cluster": h.get("clusterName"), "weight": h.get("weight"),
             "healthy": h.get("healthy"), "enabled": h.get("enabled"), "metadata": h.get("metadata") or {}}
            for h in info.get("hosts") or ()]


class HistoryFiles:
    """Segments under one directory. Not thread-safe: one caller at a time."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.sizes: dict[int, int] = {}  # seq → bytes, oldest first
        self.dropped = 0  # lines larger than the whole bound
        self.deleted_segments = 0
        self._file: IO[bytes] | None = None
        self._seq = 0
        self._lists: set[str] = set()  # digests whose hosts the current segment holds
        self._opened = False

    # --- writing ----------------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.directory.glob(f"{PREFIX}*{SUFFIX}")):
            seq = _seq_of(path)
            if seq is not None:
                self.sizes[seq] = path.stat().st_size
        self.sizes = dict(sorted(self.sizes.items()))
        self._seq = max(self.sizes, default=0)
        self._opened = True
        self._rotate()

    def _path(self, seq: int) -> Path:
        return self.directory / f"{PREFIX}{seq:010d}{SUFFIX}"

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
        self._seq += 1
        self._file = open(self._path(self._seq), "ab")  # noqa: SIM115 - kept open across batches
        self.sizes[self._seq] = 0
        self._lists = set()

    def append(self, rows: list[dict[str, Any]]) -> int:
        """Write rows (push rows still carry their ``payload``); returns how many were written."""
        if not self._opened:
            self._open()
        assert self._file is not None
        written = 0
        chunks: list[bytes] = []
        for row in rows:
            payload = row.pop("payload", None) if row.get("kind") == PUSH else None
            if payload is not None:
                row["digest"] = list_digest(payload)
            line = self._encode(row, payload)
            if self.sizes[self._seq] + len(line) > self.segment_bytes and self.sizes[self._seq] > 0:
                self._file.write(b"".join(chunks))
                chunks = []
                self._rotate()
                line = self._encode(row, payload)  # a new segment holds no list yet
            while self.total_bytes + len(line) > self.max_bytes and len(self.sizes) > 1:
                self._delete_oldest()
            if self.total_bytes + len(line) > self.max_bytes:
                self.dropped += 1
                continue
            if payload is not None and "hosts" in row:
                self._lists.add(row["digest"])
            chunks.append(line)
            self.sizes[self._seq] += len(line)
            written += 1
        self._file.write(b"".join(chunks))
        self._file.flush()
        return written

    def _encode(self, row: dict[str, Any], payload: str | None) -> bytes:
        """One line; a push row carries its list's hosts unless this segment has them already
        (only then is the pushed JSON decoded)."""
        if payload is not None:
            if row["digest"] in self._lists:
                row.pop("hosts", None)
            elif "hosts" not in row:
                try:
                    row["hosts"] = hosts_of(payload)
                except (ValueError, AttributeError):
                    row["hosts"] = []
        return jsonfast.dumps(row) + b"\n"

    def _delete_oldest(self) -> None:
        seq = next(iter(self.sizes))
        if seq == self._seq:
            return
        del self.sizes[seq]
        with contextlib.suppress(FileNotFoundError):
            self._path(seq).unlink()
        self.deleted_segments += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # --- reading ----------------------------------------------------------------------
    def segments(self) -> list[Path]:
        """The segment files, oldest first (what is on disk, also before the first write)."""
        paths = [(seq, p) for p in self.directory.glob(f"{PREFIX}*{SUFFIX}") if (seq := _seq_of(p)) is not None]
        return [p for _, p in sorted(paths)]

    def rows(self, needle: str = "") -> Iterator[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]:
        """Every row, oldest first, with the lists its segment held so far (digest → hosts).
        ``needle``: only lines containing it are decoded (a cheap prefilter)."""
        if self._file is not None:
            self._file.flush()
        for path in self.segments():
            yield from read_segment(path, needle)


def read_segment(path: Path, needle: str = "") -> Iterator[tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]]:
    """The rows of one segment file, skipping lines that do not decode (a torn tail)."""
    lists: dict[str, list[dict[str, Any]]] = {}
    raw_needle = needle.encode()
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below; the file may vanish under rotation
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            has_hosts = b'"hosts":' in line
            if raw_needle and raw_needle not in line and not has_hosts:
                continue
            try:
                row = jsonfast.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            if has_hosts and isinstance(row.get("hosts"), list):
                lists[str(row.get("digest"))] = row["hosts"]
            if raw_needle and raw_needle not in line:
                continue
            yield row, lists


def _seq_of(path: Path) -> int | None:
    digits = path.name[len(PREFIX):-len(SUFFIX)]
    return int(digits) if digits.isdigit() else None


def directory_bytes(directory: Path) -> int:
    """The size of every segment under ``directory`` (tests and the bench check the bound)."""
    return sum(os.path.getsize(p) for p in directory.glob(f"{PREFIX}*{SUFFIX}"))
