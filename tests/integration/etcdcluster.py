"""A real three-member etcd cluster on loopback for the ``--cp-endpoints`` mode, and small probes
of one member's own state through etcd's v3 JSON gateway (issue 12's member-loss proofs)."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
from pathlib import Path

from shoal.testing import ServerProcess, poll_until

from .cpcluster import ETCD, call, free_blocks, kill_pid


class EtcdMemberProcess:
    """One member of :class:`ExternalEtcdCluster`; restartable on its own data dir."""

    def __init__(self, root: Path, name: str, client_port: int, initial_cluster: str) -> None:
        self.name = name
        self.endpoint = f"127.0.0.1:{client_port}"
        self.data_dir = root / name
        peer = client_port + 1
        self.args = [ETCD, "--name", name, "--data-dir", str(self.data_dir),
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
    """``size`` etcd members (client port P, peer port P+1) forming one cluster."""

    def __init__(self, root: Path, size: int = 3) -> None:
        ports = free_blocks(size, (0, 1))
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
    request = urllib.request.Request(f"http://{endpoint}/v3/kv/range", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=3) as resp:
            return int(json.loads(resp.read())["header"]["revision"])
    except (OSError, ValueError, KeyError):
        return -1


def register_persistent(node: ServerProcess, service: str, ip: str, port: int = 7000) -> tuple[int, str]:
    """POST one persistent instance to ``node``'s v1 Open API: (status, body)."""
    return call("POST", node.url("/nacos/v1/ns/instance"),
                {"serviceName": service, "ip": ip, "port": str(port), "ephemeral": "false"})


def listed_ips(node: ServerProcess, service: str) -> set[str]:
    """The IPs ``node`` lists for ``service`` (empty when it answers an error)."""
    status, text = call("GET", node.url("/nacos/v1/ns/instance/list"), {"serviceName": service})
    return {h["ip"] for h in json.loads(text)["hosts"]} if status == 200 else set()
