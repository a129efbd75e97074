"""Snapshot writer/reader: schema round trips, bounded batches, atomic publish, validation, rotation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from shoal.export import schema as S
from shoal.export.reader import SnapshotError, SnapshotVersionError, find_snapshots, read_manifest, read_snapshot
from shoal.export.writer import SnapshotWriter, rotate, snapshot_dir_name, write_snapshot

NODE = "10.0.0.1:8848"
T0 = 1_700_000_000_000


def inst(i: int, **over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "namespace": "public", "group": "DEFAULT_GROUP", "service": f"svc-{i % 3}", "cluster": "DEFAULT",
        "ip": f"10.0.1.{i}", "port": 8080 + i, "weight": 1.0 + i / 10, "healthy": i % 2 == 0,
        "enabled": True, "ephemeral": i % 3 != 0, "metadata": {"app": f"a{i}", "zone": "z"} if i % 4 else {},
        "instance_id": f"id-{i}" if i % 5 else None, "client_id": f"10.0.1.{i}:{8080 + i}#true",
        "owner_node": NODE if i % 2 else None, "client_revision": i * 3,
        "last_beat_ms": T0 + i if i % 2 else None, "last_renew_ms": None,
    }
    row.update(over)
    return row


def as_tuple(row: dict[str, object], table: str = "instances") -> tuple[object, ...]:
    return tuple(row[f.name] for f in S.TABLES[table] if f.name != "node")


def expected_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    out = []
    for r in rows:
        e = dict(r, node=NODE)
        if "metadata" in e:
            e["metadata"] = sorted(e["metadata"].items())  # type: ignore[union-attr]
        out.append(e)
    return out


def normalise(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    for r in rows:
        if "metadata" in r:
            r["metadata"] = sorted(r["metadata"])  # type: ignore[arg-type]
    return rows


def test_round_trip_all_tables_tuples_dicts_and_columns(tmp_path: Path) -> None:
    rows = [inst(i) for i in range(23)]
    clients = [
        {"client_id": "c1", "kind": "connection", "native": True, "owner_node": NODE, "revision": 4,
         "client_ip": "10.0.9.1", "connected_at_ms": T0, "last_active_ms": T0 + 5, "last_renew_ms": None,
         "published_services": 2, "subscribed_services": 1},
        {"client_id": "10.0.1.1:8081#true", "kind": "ip_port", "native": False, "owner_node": "10.0.0.2:8848",
         "revision": 9, "client_ip": "10.0.1.1", "connected_at_ms": T0, "last_active_ms": T0,
         "last_renew_ms": T0 + 9, "published_services": 1, "subscribed_services": 0},
    ]
    services = [{"namespace": "public", "group": "DEFAULT_GROUP", "service": "svc-0", "ephemeral": True,
                 "protect_threshold": 0.0, "metadata": {"k": "v"}, "instance_count": 8, "healthy_count": 4,
                 "subscriber_count": 2, "cluster_count": 1, "last_change_ms": None}]
    events = [{"ts_ms": T0, "kind": "health_flip", "namespace": "public", "group": "DEFAULT_GROUP",
               "service": "svc-0", "client_id": "x", "ip": "10.0.1.2", "port": 8082, "healthy": False,
               "detail": "beat timeout"},
              {"ts_ms": T0 + 1, "kind": "client_connected", "client_id": "c1"}]

    with SnapshotWriter(tmp_path, NODE, T0, batch_rows=5) as w:
        w.add_instances(as_tuple(r) for r in rows[:10])  # tuples
        w.write_chunk("instances", rows[10:15])  # dicts
        cols = {f.name: [r[f.name] for r in rows[15:]] for f in S.INSTANCES if f.name != "node"}
        w.write_columns("instances", cols)  # a column chunk
        w.add_clients(as_tuple(c, "clients") for c in clients)
        w.add_services(services)
        w.add_events(events)
    snap = tmp_path / snapshot_dir_name(NODE, T0)
    assert snap.name == f"10.0.0.1_8848-{T0}"
    tables = read_snapshot(snap)

    assert normalise(tables["instances"].to_pylist()) == expected_rows(rows)
    assert tables["clients"].to_pylist() == [dict(c, node=NODE) for c in clients]
    assert normalise(tables["services"].to_pylist()) == expected_rows(services)
    full_events = [{f.name: e.get(f.name) for f in S.EVENTS if f.name != "node"} for e in events]
    assert tables["events"].to_pylist() == [dict(e, node=NODE) for e in full_events]
    for name, table in tables.items():
        assert table.schema.equals(S.TABLES[name], check_metadata=False)
        meta = table.schema.metadata
        assert meta[b"schema_version"] == str(S.SCHEMA_VERSION).encode()
        assert meta[b"node"] == NODE.encode() and meta[b"taken_at_ms"] == str(T0).encode()
        assert meta[b"table"] == name.encode()
    manifest = json.loads((snap / "manifest.json").read_text())
    assert manifest["schema_version"] == S.SCHEMA_VERSION and manifest["node"] == NODE
    assert manifest["taken_at_ms"] == T0
    assert {k: v["rows"] for k, v in manifest["tables"].items()} == {
        "instances": 23, "clients": 2, "services": 1, "events": 2}
    assert sorted(os.listdir(snap)) == sorted([*S.FILE_NAMES.values(), "manifest.json"])


def test_record_batches_are_bounded(tmp_path: Path) -> None:
    info = write_snapshot(tmp_path, NODE, T0, instances=[as_tuple(inst(i)) for i in range(23)], batch_rows=5)
    with pa.memory_map(str(info.path / "instances.arrow")) as src:
        reader = pa.ipc.open_file(src)
        sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
    assert sizes == [5, 5, 5, 5, 3]
    assert info.rows["instances"] == 23


def test_snapshot_is_published_atomically_and_abort_leaves_nothing(tmp_path: Path) -> None:
    w = SnapshotWriter(tmp_path, NODE, T0, batch_rows=2)
    w.write_chunk("instances", [as_tuple(inst(i)) for i in range(5)])
    assert not w.final_dir.exists()
    assert [p.name.startswith(".tmp-") for p in tmp_path.iterdir()] == [True]
    with pytest.raises(SnapshotError):
        find_snapshots([tmp_path])  # a temp dir is not a snapshot
    w.close()
    assert w.final_dir.is_dir() and [p.name for p in tmp_path.iterdir()] == [w.final_dir.name]

    with pytest.raises(RuntimeError, match="boom"), SnapshotWriter(tmp_path, NODE, T0 + 1) as w2:
        w2.add_instances([as_tuple(inst(1))])
        raise RuntimeError("boom")
    assert [p.name for p in tmp_path.iterdir()] == [w.final_dir.name]
    with pytest.raises(FileExistsError):
        SnapshotWriter(tmp_path, NODE, T0).open()


@pytest.mark.parametrize(
    ("table", "rows", "message"),
    [
        ("instances", [as_tuple(inst(1, service=None))], "instances.service must not be null"),
        ("instances", [as_tuple(inst(1))[:-1]], "rows must have 17 values"),
        ("instances", [as_tuple(inst(1, port="http"))], "instances.port"),
        ("clients", [("c", "websocket", True, None, 1, "ip", 0, 0, None, 0, 0)], "unknown value 'websocket'"),
        ("events", [(1, "exploded", None, None, None, None, None, None, None, None)], "unknown value 'exploded'"),
    ],
)
def test_writer_rejects_invalid_rows(tmp_path: Path, table: str, rows: list[tuple[object, ...]],
                                     message: str) -> None:
    w = SnapshotWriter(tmp_path, NODE, T0)
    with pytest.raises(ValueError, match=message):
        w.write_chunk(table, rows)
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_write_columns_rejects_unknown_and_missing_columns(tmp_path: Path) -> None:
    w = SnapshotWriter(tmp_path, NODE, T0)
    cols = {f.name: [inst(1)[f.name]] for f in S.INSTANCES if f.name != "node"}
    with pytest.raises(ValueError, match="unknown columns"):
        w.write_columns("instances", {**cols, "colour": ["red"]})
    with pytest.raises(ValueError, match="'ip' is required"):
        w.write_columns("instances", {k: v for k, v in cols.items() if k != "ip"})
    with pytest.raises(KeyError, match="unknown snapshot table"):
        w.write_chunk("widgets", [])
    w.abort()


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    return write_snapshot(tmp_path / "in", NODE, T0, instances=[as_tuple(inst(i)) for i in range(4)]).path


def test_reader_rejects_newer_schema_version(snapshot: Path) -> None:
    m = json.loads((snapshot / "manifest.json").read_text())
    m["schema_version"] = S.SCHEMA_VERSION + 1
    (snapshot / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SnapshotVersionError, match=f"schema_version {S.SCHEMA_VERSION + 1}"):
        read_snapshot(snapshot)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
        (lambda p: (p / "manifest.json").write_text("{not json"), "unreadable manifest"),
        (lambda p: (p / "clients.arrow").unlink(), "clients.arrow listed in the manifest is missing"),
        (lambda p: (p / "events.arrow").write_bytes(b"garbage"), "not a readable Arrow IPC file"),
    ],
)
def test_reader_rejects_damaged_snapshots(snapshot: Path, damage: object, message: str) -> None:
    damage(snapshot)  # type: ignore[operator]
    with pytest.raises(SnapshotError, match=message):
        read_snapshot(snapshot)


def test_reader_rejects_row_count_and_schema_mismatch(snapshot: Path) -> None:
    m = json.loads((snapshot / "manifest.json").read_text())
    m["tables"]["instances"]["rows"] = 5
    (snapshot / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SnapshotError, match="4 rows, manifest says 5"):
        read_snapshot(snapshot, ["instances"])
    m["tables"]["instances"]["rows"] = 4
    (snapshot / "manifest.json").write_text(json.dumps(m))
    wrong = pa.schema([pa.field("namespace", pa.int64())], metadata={b"schema_version": b"1", b"node": NODE.encode()})
    with pa.OSFile(str(snapshot / "services.arrow"), "wb") as sink, pa.ipc.new_file(sink, wrong):
        pass
    with pytest.raises(SnapshotError, match="columns differ"):
        read_snapshot(snapshot, ["services"])
    assert read_snapshot(snapshot, ["instances"])["instances"].num_rows == 4


def test_find_snapshots_accepts_snapshot_dirs_and_parents(tmp_path: Path) -> None:
    a = write_snapshot(tmp_path / "x", "10.0.0.1:8848", T0).path
    b = write_snapshot(tmp_path / "x", "10.0.0.2:8848", T0).path
    c = write_snapshot(tmp_path / "y", "10.0.0.3:8848", T0).path
    (tmp_path / "x" / "notes").mkdir()
    assert find_snapshots([tmp_path / "x", c, a]) == [a, b, c]
    assert read_manifest(c).node == "10.0.0.3:8848"
    (tmp_path / "empty").mkdir()
    with pytest.raises(SnapshotError, match="no snapshot directories"):
        find_snapshots([tmp_path / "empty"])
    with pytest.raises(SnapshotError, match="not a directory"):
        find_snapshots([tmp_path / "missing"])


def test_rotate_keeps_newest_per_node(tmp_path: Path) -> None:
    # names sort differently from ages (taken_at_ms 9_000 < 10_000 but "9000" > "10000")
    times = [9_000, 10_000, 11_000, 8_000, 12_000]
    for t in times:
        write_snapshot(tmp_path, "10.0.0.1:8848", t)
    write_snapshot(tmp_path, "10.0.0.2:8848", 1_000)
    (tmp_path / ".tmp-in-progress").mkdir()
    (tmp_path / "other").mkdir()
    removed = rotate(tmp_path, keep=2)
    assert [p.name for p in removed] == ["10.0.0.1_8848-8000", "10.0.0.1_8848-9000", "10.0.0.1_8848-10000"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".tmp-in-progress", "other", "10.0.0.1_8848-11000", "10.0.0.1_8848-12000", "10.0.0.2_8848-1000"])
    assert rotate(tmp_path, keep=2) == []
    with pytest.raises(ValueError):
        rotate(tmp_path, keep=-1)
