"""Read snapshot directories written by :mod:`shoal.export.writer`, refusing anything unexpected.

Offline tools see snapshots from many nodes and many versions of Shoal, copied around by hand, so
every read checks the manifest, the schema version, the files it names and each file's schema, and
fails with a :class:`SnapshotError` that says which directory and what is wrong rather than handing
mismatched columns to a Spark job. Files are memory-mapped, so reading a large snapshot is cheap
until its columns are touched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from shoal.export import schema as S

__all__ = [
    "Manifest",
    "SnapshotError",
    "SnapshotVersionError",
    "find_snapshots",
    "read_manifest",
    "read_snapshot",
    "read_table",
]


class SnapshotError(ValueError):
    """A snapshot directory is missing, incomplete or not what its manifest says."""


class SnapshotVersionError(SnapshotError):
    """A snapshot was written with a schema version this reader does not understand."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """A validated ``manifest.json``: who took the snapshot and when, and for each table its
    file name and row count."""

    path: Path
    schema_version: int
    node: str
    taken_at_ms: int
    files: dict[str, str]
    rows: dict[str, int]


def read_manifest(snapshot_dir: str | os.PathLike[str]) -> Manifest:
    """Parse and validate ``manifest.json`` of ``snapshot_dir``."""
    path = Path(snapshot_dir)
    if not path.is_dir():
        raise SnapshotError(f"{path}: not a directory")
    mpath = path / S.MANIFEST_NAME
    try:
        data: Any = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise SnapshotError(
            f"{path}: no {S.MANIFEST_NAME} (not a snapshot, or still being written)"
        ) from None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{mpath}: unreadable manifest: {exc}") from exc
    if not isinstance(data, dict):
        raise SnapshotError(f"{mpath}: manifest must be a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int):
        raise SnapshotError(f"{mpath}: missing or non-integer schema_version")
    if version != S.SCHEMA_VERSION:
        raise SnapshotVersionError(
            f"{path}: snapshot schema_version {version}, this reader understands {S.SCHEMA_VERSION}; "
            "use a Shoal version matching the node that wrote it"
        )
    node, taken_at = data.get("node"), data.get("taken_at_ms")
    if not isinstance(node, str) or not node:
        raise SnapshotError(f"{mpath}: missing node")
    if not isinstance(taken_at, int):
        raise SnapshotError(f"{mpath}: missing or non-integer taken_at_ms")
    tables = data.get("tables")
    if not isinstance(tables, dict):
        raise SnapshotError(f"{mpath}: missing tables")
    files: dict[str, str] = {}
    rows: dict[str, int] = {}
    for name in S.TABLE_NAMES:
        entry = tables.get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not isinstance(
            entry.get("rows"), int
        ):
            raise SnapshotError(f"{mpath}: table {name!r} missing or without file/rows")
        if Path(entry["file"]).name != entry["file"]:
            raise SnapshotError(f"{mpath}: table {name!r} file must be a plain file name")
        files[name] = entry["file"]
        rows[name] = entry["rows"]
    return Manifest(path, version, node, taken_at, files, rows)


def read_table(
    snapshot_dir: str | os.PathLike[str], table: str, *, manifest: Manifest | None = None
) -> pa.Table:
    """One validated table of a snapshot (memory-mapped)."""
    m = manifest if manifest is not None else read_manifest(snapshot_dir)
    expected = S.schema_for(table)
    fpath = m.path / m.files[table]
    if not fpath.is_file():
        raise SnapshotError(f"{m.path}: {m.files[table]} listed in the manifest is missing")
    try:
        with pa.memory_map(str(fpath), "r") as source:
            result = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise SnapshotError(f"{fpath}: not a readable Arrow IPC file: {exc}") from exc
    meta = result.schema.metadata or {}
    version = meta.get(S.META_SCHEMA_VERSION, b"").decode()
    if version != str(S.SCHEMA_VERSION):
        raise SnapshotVersionError(
            f"{fpath}: schema_version {version or '(none)'}, expected {S.SCHEMA_VERSION}"
        )
    if not result.schema.equals(expected, check_metadata=False):
        raise SnapshotError(
            f"{fpath}: columns differ from schema v{S.SCHEMA_VERSION} {table}: "
            f"{_diff(result.schema, expected)}"
        )
    writer_node = meta.get(S.META_NODE, b"").decode()
    if writer_node != m.node:
        raise SnapshotError(f"{fpath}: written by {writer_node!r}, manifest says {m.node!r}")
    if result.num_rows != m.rows[table]:
        raise SnapshotError(f"{fpath}: {result.num_rows} rows, manifest says {m.rows[table]}")
    return result


def read_snapshot(
    snapshot_dir: str | os.PathLike[str], tables: Iterable[str] | None = None
) -> dict[str, pa.Table]:
    """``{table: pa.Table}`` for ``tables`` (default: all four) of one snapshot directory."""
    m = read_manifest(snapshot_dir)
    names = S.TABLE_NAMES if tables is None else tuple(tables)
    return {name: read_table(m.path, name, manifest=m) for name in names}


def find_snapshots(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Snapshot directories named by ``paths``: each path is a snapshot directory itself or a
    directory whose (non-hidden) subdirectories include snapshots. Order: as given, then by name;
    duplicates are dropped. A path that is neither raises :class:`SnapshotError`."""
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise SnapshotError(f"{path}: not a directory")
        if (path / S.MANIFEST_NAME).is_file():
            candidates = [path]
        else:
            candidates = sorted(
                c for c in path.iterdir()
                if c.is_dir() and not c.name.startswith(".") and (c / S.MANIFEST_NAME).is_file()
            )
            if not candidates:
                raise SnapshotError(f"{path}: no snapshot directories (with {S.MANIFEST_NAME}) found")
        for c in candidates:
            key = c.resolve()
            if key not in seen:
                seen.add(key)
                found.append(c)
    return found


def _diff(got: pa.Schema, expected: pa.Schema) -> str:
    g = {f.name: f for f in got}
    e = {f.name: f for f in expected}
    parts = [f"missing {sorted(set(e) - set(g))}"] if set(e) - set(g) else []
    if set(g) - set(e):
        parts.append(f"unexpected {sorted(set(g) - set(e))}")
    for name in e.keys() & g.keys():
        if not g[name].equals(e[name]):
            parts.append(f"{name}: {g[name].type}{'' if g[name].nullable else ' not null'} "
                         f"!= {e[name].type}{'' if e[name].nullable else ' not null'}")
    if not parts and got.names != expected.names:
        parts.append("column order differs")
    return "; ".join(sorted(parts)) or "metadata only"
