"""Clusters of real ``shoal server`` processes: one family for every test that needs several nodes.

:class:`NodeCluster` starts ``size`` nodes on one member list, each on its own loopback address
(127.0.0.1 unless told) and free ports, and kills every one of them (a stopped one included,
and the etcd members they spawned) in :meth:`kill_all`, however the test ended. Its two presets:

* :class:`CpCluster`: nodes whose CP store is etcd (a managed member each, on port - 1000, or
  an external cluster given with ``--cp-endpoints``), with the cluster identity and fast member
  reports;
* :class:`FaultCluster`: nodes on 127.0.0.2, 127.0.0.3, ... (so iptables can cut one off by
  address) with an embedded CP store, for the AP fault tests.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shoal.testing.etcd import etcd_pids, kill_pid
from shoal.testing.http import http_get
from shoal.testing.procs import HOST, OPEN, AuthMode, ServerProcess, free_port_block

#: The cluster identity every node of a :class:`CpCluster` proves on the cluster port.
IDENTITY = ["-D", "nacos.core.auth.server.identity.key=shoal-test",
            "-D", "nacos.core.auth.server.identity.value=shoal-test-secret"]
#: Member reports every 300 ms and a short snapshot-load timeout, for tests whose subject is not
#: those timings.
FAST = ["-D", "shoal.member.report-interval-ms=300",
        "-D", "nacos.core.protocol.distro.data.load.timeoutMs=8000",
        "-D", "nacos.core.protocol.distro.data.load.retryDelayMs=300"]
#: Fast member failure detection (a report every 300 ms, DOWN after 2 failed ones), for fault tests
#: whose fault is not about those timings (several are: they keep Nacos's defaults).
FAST_MEMBERS = ["-D", "shoal.member.report-interval-ms=300", "-D", "nacos.core.member.fail-access-cnt=2"]


class NodeCluster:
    """``size`` real nodes sharing one member list; ``base`` are arguments every node gets,
    ``hosts`` one loopback address per node (default: all on 127.0.0.1); ``auth`` says whether
    they run open (:data:`~shoal.testing.procs.OPEN`) or on the secure defaults; ``workers`` is
    each node's ``--workers`` (default: :func:`~shoal.testing.procs.default_workers`), and a node
    of several workers is ready once every worker is (:meth:`ServerProcess.wait_ready`)."""

    def __init__(self, root: Path, size: int, base: Sequence[str] = (), *, auth: AuthMode,
                 hosts: Sequence[str] | None = None, ready_timeout: float = 20.0,
                 workers: int | None = None) -> None:
        self.root = root
        self.workers = workers
        self.auth = auth
        self.base = list(base)
        self.hosts = list(hosts) if hosts is not None else [HOST] * size
        self.ports = [free_port_block(host=h) for h in self.hosts]
        self.members = ",".join(f"{h}:{p}" for h, p in zip(self.hosts, self.ports, strict=True))
        self.ready_timeout = ready_timeout
        self.nodes: dict[int, ServerProcess] = {}
        self.retired: list[ServerProcess] = []  #: earlier processes of restarted nodes

    def __len__(self) -> int:
        return len(self.ports)

    def addr(self, i: int) -> str:
        return f"{self.hosts[i]}:{self.ports[i]}"

    def node(self, i: int) -> ServerProcess:
        """Node ``i``'s current process (it must have been started)."""
        return self.nodes[i]

    def all(self) -> list[ServerProcess]:
        """The current process of every started node, in order."""
        return [self.nodes[i] for i in sorted(self.nodes)]

    def ports_of(self, i: int) -> tuple[int, int, int]:
        """Node ``i``'s HTTP, gRPC SDK and cluster ports (what a partition drops)."""
        return self.ports[i], self.ports[i] + 1000, self.ports[i] + 1001

    # --- processes --------------------------------------------------------------------------
    def start(self, i: int, *extra: str, wait: bool = True, env: Mapping[str, str] | None = None) -> ServerProcess:
        """Start node ``i`` (``extra`` after the base arguments); a restart reuses its address
        and data dir, as a restarted node does, and appends to the same log."""
        old = self.nodes.get(i)
        if old is not None:
            self.retired.append(old)
        host, port = self.hosts[i], self.ports[i]
        args = ["--members", self.members, *self.base, *extra]
        server = ServerProcess(port, self.root / f"node-{host}-{port}", args, env, host=host,
                               ready_timeout=self.ready_timeout, auth=self.auth, workers=self.workers)
        self.nodes[i] = server.start()
        if wait:
            server.wait_ready()
        return server

    def start_all(self, *extra: str, each: Mapping[int, Sequence[str]] | None = None,
                  envs: Mapping[int, Mapping[str, str]] | None = None, timeout: float | None = None) -> None:
        """Start every node (``extra`` to all, ``each[i]`` to node i, ``envs[i]`` its
        environment), then wait until all are ready."""
        for i in range(len(self.ports)):
            self.start(i, *extra, *(each or {}).get(i, ()), wait=False, env=(envs or {}).get(i))
        for server in self.all():
            server.wait_ready(timeout)

    def stop_all(self) -> None:
        """SIGTERM every running node (a clean stop), then :meth:`kill_all`."""
        for server in self.all():
            if server.alive():
                with contextlib.suppress(AssertionError):  # not stopped in time: killed, kill_all() ends it
                    server.stop()
        self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL every process this cluster started (SIGCONT first, so a stopped one dies too)
        and the etcd members they spawned."""
        for server in [*self.retired, *self.nodes.values()]:
            server.signal(signal.SIGCONT)
            server.kill()
        for server in self.nodes.values():
            for pid in etcd_pids(server.data_dir):
                kill_pid(pid)

    def __enter__(self) -> NodeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()

    # --- views ------------------------------------------------------------------------------
    def member_states(self, i: int) -> dict[str, str]:
        """The member list as node ``i`` sees it: address → state."""
        status, text = http_get(self.nodes[i].url("/nacos/v1/core/cluster/nodes"), 3)
        assert status == 200, text
        data: Any = json.loads(text)
        items = data.get("data", data) if isinstance(data, dict) else data
        return {m["address"]: m["state"] for m in items}

    def gauge(self, i: int, name: str) -> float:
        """The value of the unlabelled gauge ``shoal_<name>`` on node ``i``."""
        status, text = http_get(self.nodes[i].url("/nacos/actuator/prometheus"), 3)
        assert status == 200
        match = re.search(rf"^shoal_{name} (\S+)$", text, re.MULTILINE)
        assert match, f"no shoal_{name} on node {i}"
        return float(match.group(1))

    def instance_ips(self, i: int, service: str) -> set[tuple[str, int]]:
        """The instances of ``service`` on node ``i`` through the HTTP Open API (empty on an error)."""
        status, text = http_get(self.nodes[i].url(f"/nacos/v1/ns/instance/list?serviceName={service}"), 3)
        if status != 200:
            return set()
        return {(h["ip"], int(h["port"])) for h in json.loads(text).get("hosts", [])}


class CpCluster(NodeCluster):
    """``size`` nodes on 127.0.0.1 whose CP store is etcd (each node's managed member unless
    ``extra`` names ``--cp-endpoints``), with :data:`IDENTITY` and :data:`FAST`; ``workers`` as
    :class:`NodeCluster`'s (a node of workers runs its etcd member in its supervisor)."""

    def __init__(self, root: Path, size: int, extra: Sequence[str] = (), *, auth: AuthMode,
                 workers: int | None = None) -> None:
        super().__init__(root, size, [*IDENTITY, *FAST, *extra], auth=auth, ready_timeout=60, workers=workers)


class FaultCluster(NodeCluster):
    """``size`` nodes on 127.0.0.<first_host>, ... with an embedded CP store (the AP faults only),
    open (:data:`~shoal.testing.procs.OPEN`: the faults are the subject, not the login);
    readiness may take longer, as a node's peers may be stopped or cut off."""

    def __init__(self, root: Path, size: int = 3, first_host: int = 2, base: Sequence[str] = ()) -> None:
        super().__init__(root, size, ["-D", "shoal.cp.mode=embedded", *base],
                         auth=OPEN, hosts=[f"127.0.0.{first_host + i}" for i in range(size)], ready_timeout=45)


def owner_index(cluster: NodeCluster, tag: str, up: list[int] | None = None) -> int:
    """Which node is responsible for ``ip:port`` ``tag`` when the nodes ``up`` (default all) are healthy.

    Mirrors the Distro mapper: ``distro_hash(tag) % n`` over the sorted healthy addresses."""
    from shoal.kernels import ownership

    up = list(range(len(cluster.hosts))) if up is None else up
    healthy = sorted(cluster.addr(i) for i in up)
    chosen = healthy[ownership.distro_hash(tag) % len(healthy)]
    return next(i for i in up if cluster.addr(i) == chosen)
