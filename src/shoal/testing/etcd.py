"""Real etcd for the CP tests: the binary, the members a node's supervisor would run, external
clusters for the ``--cp-endpoints`` mode, the members a node spawned, and probes of one member's
own state through etcd's v3 JSON gateway."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from shoal.cp.supervisor import EtcdMember, EtcdSupervisor, plan_members
from shoal.testing.http import call
from shoal.testing.procs import free_port_blocks
from shoal.testing.wait import poll_until

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def require_etcd() -> str:
    """The etcd binary; a missing one is a broken test machine, not a reason to skip."""
    if not Path(ETCD).exists():
        raise RuntimeError("etcd is not installed: run ci/setup.sh as root (Debian package etcd-server)")
    return ETCD


def managed_cluster(data_root: Path, size: int, **kw: Any) -> list[EtcdSupervisor]:
    """Supervisors of ``size`` members planned from one member list, as every node plans them
    (not started); ``kw`` goes to each :class:`EtcdSupervisor`."""
    mains = free_port_blocks(size, (0, -1000, -999))
    planned: list[EtcdMember] = plan_members([("127.0.0.1", port) for port in mains])
    return [EtcdSupervisor(me, planned, data_root / f"node{i}", require_etcd(), **kw)
            for i, me in enumerate(planned)]


class EtcdMemberProcess:
    """One member of :class:`ExternalEtcdCluster`; restartable on its own data dir."""

    def __init__(self, root: Path, name: str, client_port: int, initial_cluster: str) -> None:
        self.name = name
        self.endpoint = f"127.0.0.1:{client_port}"
        self.data_dir = root / name
        peer = client_port + 1
        self.args = [require_etcd(), "--name", name, "--data-dir", str(self.data_dir),
                     "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", initial_cluster, "--initial-cluster-token", f"shoal-test-{root.name}",
                     "--initial-cluster-state", "new", "--log-level", "error"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Spawn the member; with an existing data dir etcd rejoins with its own state."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir.parent / f"{self.name}.log", "ab") as log_file:
            self.proc = subprocess.Popen(self.args, stdout=log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def kill(self) -> None:
        """SIGKILL, as a crashed member."""
        if self.proc is not None and self.proc.poll() is None:
            kill_pid(self.proc.pid)
            self.proc.wait()


class ExternalEtcdCluster:
    """``size`` etcd members (client port P, peer port P+1) forming one cluster: the external
    store of the ``--cp-endpoints`` mode (one member is enough where members are not the point)."""

    def __init__(self, root: Path, size: int = 3) -> None:
        ports = free_port_blocks(size, (0, 1))
        initial = ",".join(f"e{i}=http://127.0.0.1:{p + 1}" for i, p in enumerate(ports))
        self.members = [EtcdMemberProcess(root / "etcd", f"e{i}", p, initial) for i, p in enumerate(ports)]

    @property
    def endpoints(self) -> str:
        """The ``--cp-endpoints`` value naming every member."""
        return ",".join(m.endpoint for m in self.members)

    def start(self) -> ExternalEtcdCluster:
        for member in self.members:
            member.start()
        for member in self.members:
            poll_until(lambda m=member: healthy(m.endpoint), 30, 0.1,  # type: ignore[misc]
                       f"etcd member {member.name} healthy")
        return self

    def stop(self) -> None:
        for member in self.members:
            member.kill()


def healthy(endpoint: str) -> bool:
    """The member answers /health with a leader in sight."""
    try:
        return call("GET", f"http://{endpoint}/health")[0] == 200
    except OSError:
        return False


def revision(endpoint: str, serializable: bool) -> int:
    """The store revision ``endpoint`` reports: its own applied state when ``serializable``, the
    cluster's (through the leader) otherwise; -1 when it does not answer."""
    everything = base64.b64encode(b"\0").decode()
    body = json.dumps({"key": everything, "range_end": everything, "count_only": True,
                       "serializable": serializable}).encode()
    try:
        status, text = call("POST", f"http://{endpoint}/v3/kv/range", body=body,
                            headers={"Content-Type": "application/json"}, timeout=3)
        return int(json.loads(text)["header"]["revision"]) if status == 200 else -1
    except (OSError, ValueError, KeyError):
        return -1


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


def kill_pid(pid: int) -> None:
    """SIGKILL ``pid`` if it still exists."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
