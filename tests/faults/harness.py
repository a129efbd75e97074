"""Fault-injection harness: real `shoal server` processes on their own 127.0.0.x addresses.

What it offers (issue 11):

* :class:`FaultCluster`: N real nodes, node *i* on ``127.0.0.(i+2)`` with its own ports, started
  with the same member list; every process is killed (SIGCONT first, so a stopped one dies too)
  when the fixture ends, whatever happened.
* :func:`freeze` / :func:`thaw` / :func:`kill9`: SIGSTOP, SIGCONT and SIGKILL of one node.
* :func:`rss_kb`: a node's resident set (``VmRSS`` in ``/proc/PID/status``); :class:`RssSampler`
  keeps a series of them in a background thread (before / during / after figures).
* :func:`tracebacks`: tracebacks counted in a node's log (``Traceback (most recent call last)``),
  :func:`error_lines`: log lines at ERROR or CRITICAL.
* :class:`Partition`: iptables rules in a dedicated chain (``SHOAL-FAULTS-<pid>``) hooked into
  ``OUTPUT`` that drop every packet sent *to* a node (its address and its three ports), so
  nothing can reach it. Loopback traffic leaves with source 127.0.0.1 whatever the destination, so rules can
  only blackhole by destination: a blackholed node can still send, but never gets an answer.
  :meth:`Partition.close` removes every rule and the chain, and the fixture calls it even when
  the test fails. Where iptables is missing or the kernel refuses the rule the test is skipped
  with the reason.

The process helpers come from :mod:`shoal.testing`, so there is one way to start and kill a server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from shoal.testing import NODE_OFFSETS, OPEN, ServerProcess, free_port_block, http_get, kill, poll_until
from shoal.testing.ci import unavailable

__all__ = [
    "FAST_MEMBERS",
    "FaultCluster",
    "HostedServer",
    "Partition",
    "PartitionUnavailable",
    "RssSampler",
    "error_lines",
    "free_port_on",
    "freeze",
    "http_post",
    "http_put",
    "kill9",
    "owner_index",
    "partitions_unavailable",
    "rss_kb",
    "start_hosted",
    "thaw",
    "tracebacks",
    "until",
]

TRACEBACK = "Traceback (most recent call last)"
_ERROR_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL)\s", re.MULTILINE)

#: Fast member failure detection, for tests whose fault is not about those timings (several are:
#: they keep Nacos's defaults, a report every 2 s and DOWN after 3 failed ones).
FAST_MEMBERS = ["-D", "shoal.member.report-interval-ms=300", "-D", "nacos.core.member.fail-access-cnt=2"]


def free_port_on(host: str, offsets: tuple[int, ...] = NODE_OFFSETS) -> int:
    """A main port whose port+offsets are free on ``host`` (and on 127.0.0.1) right now."""
    return free_port_block(offsets, host=host)


def partitions_unavailable(reason: str) -> NoReturn:
    """Skip on a developer's machine, fail in CI (``CI=true``): there ci/test-deps.sh installs
    iptables as root, so a partition that cannot be made is a broken setup, never a pass."""
    unavailable(f"partitions unavailable here: {reason}")


class HostedServer(ServerProcess):
    """A :class:`ServerProcess` bound to a 127.0.0.x address other than 127.0.0.1; a fault test
    allows it longer to get ready (its peers may be stopped or cut off)."""

    def wait_ready(self, timeout: float = 45, interval: float = 0.1) -> float:
        return super().wait_ready(timeout, interval)


def start_hosted(data_root: Path, host: str, port: int, args: list[str],
                 env: dict[str, str] | None = None) -> HostedServer:
    """Start `shoal server` on ``host:port`` without waiting. A restart on the same address reuses
    the data directory (as a restarted node does) and appends to the same log file."""
    server = HostedServer(port, data_root / f"node-{host}-{port}", args, env, host=host, auth=OPEN)
    server.start()
    return server


class FaultCluster:
    """``size`` real nodes on 127.0.0.2, 127.0.0.3, ... sharing one member list."""

    def __init__(self, tmp_path: Path, size: int = 3, first_host: int = 2, base: tuple[str, ...] = ()) -> None:
        self.tmp_path = tmp_path
        self.base = list(base)
        self.hosts = [f"127.0.0.{first_host + i}" for i in range(size)]
        self.ports = [free_port_on(h) for h in self.hosts]
        self.members = ",".join(f"{h}:{p}" for h, p in zip(self.hosts, self.ports, strict=True))
        self.nodes: dict[int, HostedServer] = {}
        self.retired: list[HostedServer] = []

    def addr(self, i: int) -> str:
        return f"{self.hosts[i]}:{self.ports[i]}"

    def start(self, i: int, *extra: str, wait: bool = True) -> HostedServer:
        old = self.nodes.get(i)
        if old is not None:
            self.retired.append(old)
        server = start_hosted(self.tmp_path, self.hosts[i], self.ports[i],
                              ["--members", self.members, "-D", "shoal.cp.mode=embedded",  # AP faults only
                               *self.base, *extra])
        self.nodes[i] = server
        if wait:
            server.wait_ready()
        return server

    def start_all(self, *extra: str) -> None:
        for i in range(len(self.hosts)):
            self.start(i, *extra, wait=False)
        for server in self.nodes.values():
            server.wait_ready()

    def close(self) -> None:
        for server in [*self.nodes.values(), *self.retired]:
            if server.proc.poll() is None:
                kill9(server)

    # --- views ------------------------------------------------------------------------------
    def member_states(self, i: int) -> dict[str, str]:
        """The member list as node ``i`` sees it: address → state."""
        status, text = http_get(self.nodes[i].url("/nacos/v1/core/cluster/nodes"), 3)
        assert status == 200, text
        data: Any = json.loads(text)
        items = data.get("data", data) if isinstance(data, dict) else data
        return {m["address"]: m["state"] for m in items}

    def gauge(self, i: int, name: str) -> float:
        status, text = http_get(self.nodes[i].url("/nacos/actuator/prometheus"), 3)
        assert status == 200
        match = re.search(rf"^shoal_{name} (\S+)$", text, re.MULTILINE)
        assert match, f"no shoal_{name} on node {i}"
        return float(match.group(1))

    def ports_of(self, i: int) -> tuple[int, int, int]:
        """Node ``i``'s HTTP, gRPC SDK and cluster ports (what a partition drops)."""
        return self.ports[i], self.ports[i] + 1000, self.ports[i] + 1001

    def instance_ips(self, i: int, service: str) -> set[tuple[str, int]]:
        """The instances of ``service`` on node ``i`` through the HTTP Open API."""
        status, text = http_get(self.nodes[i].url(f"/nacos/v1/ns/instance/list?serviceName={service}"), 3)
        if status != 200:
            return set()
        return {(h["ip"], int(h["port"])) for h in json.loads(text).get("hosts", [])}


def owner_index(cluster: FaultCluster, tag: str, up: list[int] | None = None) -> int:
    """Which node is responsible for ``ip:port`` ``tag`` when the nodes ``up`` (default all) are healthy.

    Mirrors the Distro mapper: ``distro_hash(tag) % n`` over the sorted healthy addresses."""
    from shoal.kernels import ownership

    up = list(range(len(cluster.hosts))) if up is None else up
    healthy = sorted(cluster.addr(i) for i in up)
    chosen = healthy[ownership.distro_hash(tag) % len(healthy)]
    return next(i for i in up if cluster.addr(i) == chosen)


# --- signals ------------------------------------------------------------------------------------
def freeze(server: ServerProcess) -> None:
    """SIGSTOP: the process holds its sockets but answers nothing (a hung peer)."""
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGSTOP)


def thaw(server: ServerProcess) -> None:
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)


def kill9(server: ServerProcess) -> None:
    """SIGKILL, no goodbye (continues a stopped process first so it can be reaped)."""
    thaw(server)
    kill(server)


# --- measurements -------------------------------------------------------------------------------
def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` in kB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds in a daemon thread."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), rss_kb(self.pid)))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def peak_kb(self) -> int:
        return max((kb for _, kb in self.samples), default=0)


def tracebacks(text: str) -> int:
    return text.count(TRACEBACK)


def error_lines(text: str) -> list[str]:
    return [m.group(0) for m in _ERROR_LINE.finditer(text)]


# --- HTTP writes --------------------------------------------------------------------------------
def _send(method: str, url: str, timeout: float) -> tuple[int, str, float]:
    started = time.monotonic()
    request = urllib.request.Request(url, method=method, data=b"")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.monotonic() - started
    except OSError as exc:  # timeout or refused: a client-visible failure, status 0
        return 0, repr(exc), time.monotonic() - started


def http_post(url: str, timeout: float = 15) -> tuple[int, str, float]:
    """POST with an empty body: (status, text, seconds); status 0 when no answer came."""
    return _send("POST", url, timeout)


def http_put(url: str, timeout: float = 15) -> tuple[int, str, float]:
    return _send("PUT", url, timeout)


# --- partitions -----------------------------------------------------------------------------------
class PartitionUnavailable(RuntimeError):
    """iptables is missing or the kernel refused the rule (the reason says which)."""


@dataclass
class Partition:
    """Blackholes by destination address in a chain of its own; :meth:`close` removes all of it."""

    chain: str = field(default_factory=lambda: f"SHOAL-FAULTS-{os.getpid()}")
    installed: bool = False
    blocked: list[str] = field(default_factory=list)

    @staticmethod
    def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        exe = shutil.which("iptables")
        if exe is None:
            raise PartitionUnavailable("iptables is not installed (apt-get install iptables)")
        result = subprocess.run([exe, "-w", "5", *args], capture_output=True, text=True, timeout=20, check=False)
        if check and result.returncode != 0:
            raise PartitionUnavailable(f"iptables {' '.join(args)} refused: {result.stderr.strip()}")
        return result

    def open(self) -> Partition:
        """Create the chain and hook it into OUTPUT (loopback packets traverse OUTPUT once)."""
        if os.geteuid() != 0:
            raise PartitionUnavailable("partitions need root (iptables)")
        self._iptables("-N", self.chain)
        self.installed = True
        self._iptables("-I", "OUTPUT", "1", "-j", self.chain)
        return self

    def blackhole(self, host: str, ports: tuple[int, ...] = ()) -> None:
        """Drop every TCP packet to ``host`` (only to ``ports`` when given, which leaves anyone
        else's listeners on that address alone)."""
        if not ports:
            self._iptables("-A", self.chain, "-d", f"{host}/32", "-p", "tcp", "-j", "DROP")
        for port in ports:
            self._iptables("-A", self.chain, "-d", f"{host}/32", "-p", "tcp", "--dport", str(port), "-j", "DROP")
        self.blocked.append(host)

    def heal(self) -> None:
        """Remove every rule of the chain (the chain stays until :meth:`close`)."""
        if self.installed:
            self._iptables("-F", self.chain, check=False)
        self.blocked.clear()

    def close(self) -> None:
        if not self.installed:
            return
        self._iptables("-D", "OUTPUT", "-j", self.chain, check=False)
        self._iptables("-F", self.chain, check=False)
        self._iptables("-X", self.chain, check=False)
        self.installed = False

    @staticmethod
    def leftovers() -> list[str]:
        """Rules of any SHOAL-FAULTS chain still installed (for the suite's final check)."""
        exe = shutil.which("iptables")
        if exe is None:
            return []
        out = subprocess.run([exe, "-w", "5", "-S"], capture_output=True, text=True, timeout=20, check=False).stdout
        return [line for line in out.splitlines() if "SHOAL-FAULTS" in line]


def until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """:func:`shoal.testing.poll_until` with the harness's default interval."""
    return poll_until(predicate, timeout, interval=interval, what=what)
