"""Arrow snapshots out of real nodes: the admin endpoint, `shoal export`, auth, and the
consistency job naming a real divergence between two nodes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import RegisterInstanceParam

from shoal.config import TestHooks
from shoal.distro.sync import SYNC_REQUEST
from shoal.export.reader import find_snapshots, read_snapshot
from shoal.testing import OPEN, ServerProcess, free_port_block, http_get, kill, poll_until, start_server, wait_until
from shoal.testing.http import call_json


def shoal(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=timeout)


async def test_export_cli_writes_arrow_files_of_the_live_registry(server: ServerProcess, sdk: Any,
                                                                  tmp_path: Path) -> None:
    client = await sdk(server.addr)
    await client.register_instance(RegisterInstanceParam(service_name="exported", group_name="EXP", ip="10.50.0.1",
                                                         port=7001, weight=2.5, metadata={"tier": "gold"}))
    out = tmp_path / "out"
    result = await asyncio.to_thread(shoal, "export", "--addr", server.addr, "--out", str(out))
    assert result.returncode == 0, result.stderr
    [snapshot] = find_snapshots([out])
    tables = read_snapshot(snapshot)
    [row] = tables["instances"].to_pylist()
    assert (row["service"], row["group"], row["ip"], row["port"], row["weight"]) == ("exported", "EXP", "10.50.0.1",
                                                                                     7001, 2.5)
    assert dict(row["metadata"]) == {"tier": "gold"} and row["node"].endswith(f":{server.port}")
    assert "register" in {e["kind"] for e in tables["events"].to_pylist()}
    assert tables["services"].num_rows == 1 and tables["clients"].num_rows == 1


def test_export_needs_an_admin_when_auth_is_on(servers: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = servers("--auth")
    status, _ = http_get(server.url("/nacos/v1/shoal/export"))
    assert status == 403
    admin = call_json("POST", server.url("/nacos/v1/auth/users/admin"), data={"password": "s3cret-pass"})
    assert admin["username"] == "nacos"
    password = tmp_path / "pw"
    password.write_text("s3cret-pass\n")
    result = shoal("export", "--addr", server.addr, "--out", str(tmp_path / "snap"), "--username", "nacos",
                   "--password-file", str(password))
    assert result.returncode == 0, result.stderr
    assert len(find_snapshots([tmp_path / "snap"])) == 1
    denied = shoal("export", "--addr", server.addr, "--out", str(tmp_path / "no"))
    assert denied.returncode == 1 and "403" in denied.stderr


@pytest.mark.timeout(480)  # a real Spark job; on a loaded 2-core box it can take minutes
async def test_consistency_job_names_a_real_divergence(tmp_path: Path, sdk: Any) -> None:
    ports = [free_port_block(), free_port_block()]
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    common = ["--members", members, "-D", "shoal.cp.mode=embedded",  # AP only: no etcd members
              "-D", "nacos.core.protocol.distro.data.verify.intervalMs=600000",
              "-D", "shoal.member.report-interval-ms=300"]
    a = start_server(tmp_path, common, port=ports[0], wait=False, auth=OPEN)
    b = start_server(tmp_path, common, env=TestHooks(drop_incoming_sync=1).to_env(), port=ports[1], wait=False,
                     auth=OPEN)
    try:
        await asyncio.to_thread(a.wait_ready)
        await asyncio.to_thread(b.wait_ready)
        writer = await sdk(a.addr)
        await writer.register_instance(RegisterInstanceParam(service_name="lost-on-b", ip="10.60.0.1", port=6001))
        # B answered (and dropped) the first sync batch, so the next registration travels alone
        await wait_until(lambda: b.metric("requests_total", transport="cluster", type=SYNC_REQUEST) >= 1,
                         what="B to lose the first batch")
        # another client: a later change of the first one would carry its whole state to B again
        other = await sdk(a.addr)
        await other.register_instance(RegisterInstanceParam(service_name="everywhere", ip="10.60.0.2", port=6002))
        await wait_until(lambda: "everywhere" in http_get(b.url("/nacos/v1/ns/service/list?pageNo=1&pageSize=10"))[1],
                       what="the second registration on B")
        snaps = tmp_path / "snaps"
        for node in (a, b):
            result = await asyncio.to_thread(shoal, "export", "--addr", node.addr, "--out", str(snaps))
            assert result.returncode == 0, result.stderr
        report = tmp_path / "report"
        result = await asyncio.to_thread(shoal, "analytics", "consistency", "--input", str(snaps), "--out",
                                         str(report), "--quiet")
        assert result.returncode == 0, result.stderr + result.stdout
        summary = (report / "summary.txt").read_text()
        assert "lost-on-b" in summary and "10.60.0.1:6001" in summary and f"127.0.0.1:{ports[1]}" in summary
        assert "everywhere" not in summary
        assert (report / "consistency.png").stat().st_size > 0
    finally:
        kill(a)
        kill(b)


def test_periodic_export_rotates(servers: Callable[..., ServerProcess], tmp_path: Path) -> None:

    export_dir = tmp_path / "periodic"
    server = servers("-D", f"shoal.export.dir={export_dir}", "-D", "shoal.export.interval-ms=300",
                     "-D", "shoal.export.keep=2")

    def names() -> set[str]:  # published snapshots (temporary directories start with ".")
        return {m.parent.name for m in export_dir.glob("[!.]*/manifest.json")}

    first = poll_until(lambda: names() if len(names()) == 2 else None, 20, what="two snapshots")
    later = poll_until(lambda: names() if names() and not names() & first else None, 20,
                       what="newer snapshots replacing the first two")
    assert len(later) <= 2  # never more than shoal.export.keep
    read_snapshot(export_dir / sorted(later)[-1])  # a complete, readable snapshot
    assert server.proc.poll() is None


def test_export_from_an_unreachable_node_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port_block()
    result = shoal("export", "--addr", f"127.0.0.1:{port}", "--out", str(tmp_path / "x"), "--timeout", "5")
    assert result.returncode == 1 and "shoal export:" in result.stderr and "Traceback" not in result.stderr
