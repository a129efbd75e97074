"""The instance history log (issue 23 item 5) in process: its segment files' rotation and bound,
a restart reading what is there, the pushed lists kept once per segment, and the rows the model's
events become, with their reasons."""

from __future__ import annotations

import json
from pathlib import Path

from shoal.export import history_rows as hr
from shoal.export.history import HistoryLog
from shoal.export.history_files import HistoryFiles, directory_bytes
from shoal.model.events import no_beat_for
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import Registry

SERVICE = ServiceKey("public", "DEFAULT_GROUP", "orders")


def row(i: int, pad: int = 60) -> dict[str, object]:
    return {"ts": i, "node": "n1", "kind": hr.REGISTER, "ns": "public", "group": "DEFAULT_GROUP",
            "service": "orders", "ip": "10.0.0.1", "port": i, "reason": "x" * pad}


def payload(*ports: int, ref: int = 1) -> str:
    hosts = [{"ip": "10.0.0.9", "port": p, "weight": 1.0, "healthy": True, "enabled": True, "clusterName": "DEFAULT",
              "metadata": {}} for p in ports]
    return json.dumps({"name": "orders", "lastRefTime": ref, "hosts": hosts})


def test_segments_rotate_and_the_total_stays_within_the_bound(tmp_path: Path) -> None:
    files = HistoryFiles(tmp_path, max_bytes=4000, segment_bytes=1000)
    written = 0
    for batch in range(50):
        written += files.append([row(batch * 10 + i) for i in range(10)])
        assert directory_bytes(tmp_path) <= 4000
        assert files.total_bytes == directory_bytes(tmp_path)
    assert written == 500
    assert files.deleted_segments > 0
    assert all(size <= 1000 for size in files.sizes.values())
    kept = [r["port"] for r, _ in files.rows()]
    assert kept == sorted(kept) and kept[-1] == 499  # the newest rows, in order
    assert len(files.segments()) == len(files.sizes) >= 4


def test_a_restart_keeps_the_old_segments_and_opens_a_new_one(tmp_path: Path) -> None:
    first = HistoryFiles(tmp_path, max_bytes=100_000, segment_bytes=10_000)
    first.append([row(i) for i in range(5)])
    first.close()
    with open(first.segments()[-1], "ab") as torn:  # a crash mid-line
        torn.write(b'{"ts": 99, "kind": "reg')
    second = HistoryFiles(tmp_path, max_bytes=100_000, segment_bytes=10_000)
    second.append([row(i) for i in range(5, 8)])
    assert len(second.segments()) == 2
    assert [r["port"] for r, _ in second.rows()] == list(range(8))


def test_a_line_larger_than_the_bound_is_dropped_and_counted(tmp_path: Path) -> None:
    files = HistoryFiles(tmp_path, max_bytes=400, segment_bytes=200)
    assert files.append([row(1, pad=500), row(2)]) == 1
    assert files.dropped == 1
    assert directory_bytes(tmp_path) <= 400


def test_a_pushed_list_is_stored_once_per_segment(tmp_path: Path) -> None:
    files = HistoryFiles(tmp_path, max_bytes=100_000, segment_bytes=10_000)
    push = {"ts": 1, "node": "n1", "kind": hr.PUSH, "ns": "public", "group": "DEFAULT_GROUP", "service": "orders",
            "client": "c1", "sent": 1, "acked": 2, "result": "success"}
    files.append([{**push, "payload": payload(1, 2)}, {**push, "ts": 3, "payload": payload(1, 2, ref=7)},
                  {**push, "ts": 4, "payload": payload(1)}])
    lines = files.segments()[0].read_text().splitlines()
    assert '"hosts":' in lines[0] and '"hosts":' not in lines[1]  # the same list again (a fresh lastRefTime)
    assert '"hosts":' in lines[2]
    (first, _), (second, lists), (third, _) = list(files.rows())
    assert first["digest"] == second["digest"] != third["digest"]
    assert [h["port"] for h in lists[second["digest"]]] == [1, 2]


async def test_events_become_rows_with_their_reasons(tmp_path: Path, cp_registry: Registry) -> None:
    reg = cp_registry  # an operator's edit is kept in the CP store
    history = HistoryLog(reg.bus, reg.clock, reg.clients, "10.0.0.100:8848", tmp_path, 1_000_000, 100_000, 1000)
    ip_port = reg.naming.ip_port
    ip_port.register(SERVICE, InstanceInfo("10.0.0.9", 8080))
    await reg.naming.instance_ops.update(SERVICE, "10.0.0.9", 8080, "DEFAULT", ephemeral=True, weight=3.0)
    ip_port.deregister(SERVICE, "10.0.0.9", 8080)
    ip_port.register(SERVICE, InstanceInfo("10.0.0.9", 8081))
    client = reg.clients.get("10.0.0.9:8081#true")
    assert client is not None
    reg.naming.beats.expire(client, SERVICE, no_beat_for(31_000))
    reg.connect("conn-1")
    reg.naming.ephemeral.register_instance("conn-1", SERVICE, InstanceInfo("10.0.0.10", 9090))
    reg.naming.connections.release_client("conn-1", "stream closed by client")
    assert await history.flush() == 7
    rows = await history.instance_rows(("public", "DEFAULT_GROUP", "orders"), "", 0, 100)
    steps = [(r["kind"], r["port"], r["source"], r["reason"]) for r in rows]
    assert steps == [
        ("register", 8080, "http", ""),
        ("edit", 8080, "operator", "weight=3.0"),
        ("deregister", 8080, "http", "deregistered by its client"),
        ("register", 8081, "http", ""),
        ("expire", 8081, "http", "no beat for 31 s"),
        ("register", 9090, "grpc", ""),
        ("deregister", 9090, "grpc", "connection closed: stream closed by client"),
    ]
    assert rows[-1]["owner"] == "10.0.0.100:8848" and rows[-1]["client"] == "conn-1"
    text = hr.render(rows)
    assert "expired at" in text and "no beat for 31 s" in text and "registered by client 10.0.0.9:8080#true" in text
    assert await history.instance_rows(("public", "DEFAULT_GROUP", "orders"), "10.0.0.10", 0, 100) == rows[-2:]
    await history.close()
