"""Real Shoal clusters whose CP store is etcd: managed members (one per node on port - 1000) or
an external etcd cluster the nodes point at (``--cp-endpoints``), plus small HTTP helpers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shoal.testing import AuthMode, ServerProcess, free_port_blocks, kill, poll_until, start_server

ETCD = shutil.which("etcd") or "/usr/bin/etcd"

IDENTITY = ["-D", "nacos.core.auth.server.identity.key=shoal-test",
            "-D", "nacos.core.auth.server.identity.value=shoal-test-secret"]
FAST = ["-D", "shoal.member.report-interval-ms=300",
        "-D", "nacos.core.protocol.distro.data.load.timeoutMs=8000",
        "-D", "nacos.core.protocol.distro.data.load.retryDelayMs=300"]
#: Main port, SDK gRPC, cluster gRPC, managed etcd client and peer ports.
OFFSETS = (0, 1000, 1001, -1000, -999)


def free_blocks(count: int, offsets: Sequence[int] = OFFSETS) -> list[int]:
    """``count`` main ports whose port+offset are all free now and do not overlap."""
    return free_port_blocks(count, offsets)


class CpCluster:
    """``size`` nodes on one member list; ``extra`` arguments go to every node; ``auth`` says
    whether they run open or with the secure defaults (they share :data:`IDENTITY` either way)."""

    def __init__(self, root: Path, size: int, extra: Sequence[str] = (), *, auth: AuthMode) -> None:
        self.auth = auth
        self.root = root
        self.ports = free_blocks(size)
        self.members = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.extra = list(extra)
        self.nodes: list[ServerProcess | None] = [None] * size

    def start_all(self, timeout: float = 60) -> None:
        for i in range(len(self.ports)):
            self.start(i, wait=False)
        for node in self.nodes:
            assert node is not None
            node.wait_ready(timeout)

    def start(self, i: int, wait: bool = True) -> ServerProcess:
        node = start_server(self.root, ["--members", self.members, *IDENTITY, *FAST, *self.extra],
                            port=self.ports[i], wait=False, auth=self.auth)
        self.nodes[i] = node
        if wait:
            node.wait_ready(60)
        return node

    def node(self, i: int) -> ServerProcess:
        node = self.nodes[i]
        assert node is not None
        return node

    def kill_all(self) -> None:
        """SIGKILL every node and its managed etcd member."""
        for node in self.nodes:
            if node is not None:
                kill(node)
                for pid in etcd_pids(node.data_dir):
                    kill_pid(pid)

    def stop_all(self) -> None:
        for node in self.nodes:
            if node is not None and node.alive():
                try:
                    node.stop()
                except Exception:
                    kill(node)
        self.kill_all()


def call(method: str, url: str, params: dict[str, str] | None = None,
         data: dict[str, str] | None = None) -> tuple[int, str]:
    """One HTTP call: (status, body text); error statuses are answers, not exceptions."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url + query, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def call_json(method: str, url: str, params: dict[str, str] | None = None,
              data: dict[str, str] | None = None, status: int = 200) -> Any:
    code, text = call(method, url, params, data)
    assert code == status, f"{method} {url}: {code} {text}"
    return json.loads(text)


def etcd_pids(data_dir: Path) -> list[int]:
    """The etcd members a node under ``data_dir`` spawned (they run in sessions of their own, so
    they outlive a SIGKILLed node): found by their ``--data-dir`` argument."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"etcd") and any(str(data_dir).encode() in arg for arg in argv):
            found.append(int(proc.name))
    return found


class ExternalEtcd:
    """One etcd process on free loopback ports (the ``--cp-endpoints`` mode)."""

    def __init__(self, root: Path) -> None:
        client = free_blocks(1, (0, 1))[0]
        peer = client + 1
        self.client_port = client
        self.data_dir = root / "etcd"
        self.endpoint = f"127.0.0.1:{client}"
        self.args = [ETCD, "--name", "e1", "--data-dir", str(self.data_dir),
                     "--listen-client-urls", f"http://127.0.0.1:{client}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client}",
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", f"e1=http://127.0.0.1:{peer}", "--log-level", "error"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ExternalEtcd:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir.parent / "etcd.log", "ab") as log_file:
            self.proc = subprocess.Popen(self.args, stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        poll_until(lambda: _health(self.endpoint), timeout=30, what="etcd answering")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _health(endpoint: str) -> bool:
    try:
        return call("GET", f"http://{endpoint}/health")[0] == 200
    except OSError:
        return False


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
