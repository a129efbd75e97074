"""Faults for real processes: signals, memory, log checks and iptables partitions.

* :func:`freeze` / :func:`thaw` / :func:`kill9`: SIGSTOP, SIGCONT and SIGKILL of one node.
* :func:`rss_kb`: a process's resident set (``VmRSS`` in ``/proc/PID/status``); :class:`RssSampler`
  keeps a series of them in a background thread (before / during / after figures).
* :func:`tracebacks`: tracebacks counted in a node's log (``Traceback (most recent call last)``),
  :func:`error_lines`: log lines at ERROR or CRITICAL.
* :class:`Partition`: iptables rules in a dedicated chain (``SHOAL-FAULTS-<pid>``) hooked into
  ``OUTPUT`` that drop every packet sent *to* a node (its address and its three ports), so
  nothing can reach it. Loopback traffic leaves with source 127.0.0.1 whatever the destination, so
  rules can only blackhole by destination: a blackholed node can still send, but never gets an
  answer. :meth:`Partition.close` removes every rule and the chain. Where iptables is missing or
  the kernel refuses the rule, :func:`partitions_unavailable` skips the test (fails it in CI).

The nodes themselves are a :class:`shoal.testing.nodes.FaultCluster`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import NoReturn

from shoal.testing.ci import unavailable
from shoal.testing.procs import ServerProcess

TRACEBACK = "Traceback (most recent call last)"
_ERROR_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL)\s", re.MULTILINE)


def partitions_unavailable(reason: str) -> NoReturn:
    """Skip on a developer's machine, fail in CI (``CI=true``): there ci/test-deps.sh installs
    iptables as root, so a partition that cannot be made is a broken setup, never a pass."""
    unavailable(f"partitions unavailable here: {reason}")


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
    server.kill()


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
