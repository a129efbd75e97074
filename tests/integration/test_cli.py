"""The `shoal` command: help texts, bad configuration, busy ports, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from shoal.config import TestHooks
from shoal.testing import OPEN, ServerProcess, free_port_block, http_get


def run_cli(*args: str, timeout: float = 30, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_help_explains_commands_and_settings() -> None:
    top = run_cli("--help")
    assert top.returncode == 0 and "server" in top.stdout
    server = run_cli("server", "--help")
    assert server.returncode == 0
    for needle in ("--port", "--data-dir", "--config", "--log-level", "-D PROPERTY=VALUE",
                   "nacos.naming.push.pushTaskDelay", "nacos.remote.server.connection.keep-alive-ms"):
        assert needle in server.stdout
    assert "shoal.test." not in server.stdout  # test hooks are not settings


def test_malformed_test_hooks_stop_the_node_before_it_serves(tmp_path: Path) -> None:
    port = free_port_block()
    result = run_cli("server", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path),
                     env={TestHooks.ENV: '{"drop_incoming_sync": -1}'})
    assert result.returncode == 2 and TestHooks.ENV in result.stderr and "Traceback" not in result.stderr


def test_bad_configuration_is_reported_without_traceback(tmp_path: Path) -> None:
    result = run_cli("server", "--port", "70000", "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "invalid configuration" in result.stderr and "server.port" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("server", "-D", "nacos.naming.push.pushTaskDelay=soon", "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "pushTaskDelay" in result.stderr and "Traceback" not in result.stderr


def test_bad_cluster_membership_is_reported_without_traceback(tmp_path: Path) -> None:
    port = free_port_block()
    common = ["server", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path), *OPEN.value]
    not_listed = run_cli(*common, "--members", "10.9.9.9:8848,10.9.9.10:8848")
    assert not_listed.returncode == 2 and "not in the member list" in not_listed.stderr
    missing = run_cli(*common, "--cluster-conf", str(tmp_path / "no-such-cluster.conf"))
    assert missing.returncode == 2 and "cannot read cluster.conf" in missing.stderr
    bad = tmp_path / "cluster.conf"
    bad.write_text("10.0.0.1:notaport\n")
    garbled = run_cli(*common, "--cluster-conf", str(bad))
    assert garbled.returncode == 2 and "bad cluster member" in garbled.stderr
    for result in (not_listed, missing, garbled):
        assert "Traceback" not in result.stderr


def test_a_peer_client_that_cannot_run_stops_the_node_before_it_serves(tmp_path: Path) -> None:
    port = free_port_block()
    members = f"127.0.0.1:{port},127.0.0.1:{port + 10}"
    common = ["server", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path), *OPEN.value,
              "--members", members]
    unknown = run_cli(*common, "-D", "shoal.cluster.client.transport=quic")
    assert unknown.returncode == 2 and "shoal.cluster.client.transport" in unknown.stderr
    unbuilt = run_cli(*common, "-D", "shoal.cluster.client.transport=native", env={"SHOAL_NO_EXTENSIONS": "1"})
    assert unbuilt.returncode == 2 and "needs the h2client extension" in unbuilt.stderr
    for result in (unknown, unbuilt):
        assert "Traceback" not in result.stderr


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port_block()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port + 1000))
        blocker.listen()
        result = run_cli("server", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert "cannot start" in result.stderr and "Traceback" not in result.stderr


def test_sigint_stops_gracefully(servers: Callable[..., ServerProcess]) -> None:
    server = servers()
    assert http_get(server.url("/nacos/v1/console/health/liveness")) == (200, "OK")
    assert http_get(server.url("/nacos/no/such/path"))[0] == 404
    server.signal(signal.SIGINT)
    assert server.proc.wait(5) == 0
