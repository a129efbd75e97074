"""Real ``shoal server`` processes on free loopback ports, always cleaned up.

Used by the integration tests and the benchmarks alike: :func:`free_port_block` finds a main
port whose etcd (-1000, -999), SDK (+1000) and cluster (+1001) ports are free too, :class:`ServerProcess` starts
one node in its own session with its log in its data dir, and :class:`ServerSet` stops every
server it started when its ``with`` block ends, however it ends.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import itertools
import json
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shoal.childproc import dying_with_parent
from shoal.testing.http import http_get
from shoal.testing.wait import poll_until

HOST = "127.0.0.1"
READINESS = "/nacos/v1/console/health/readiness"
PROMETHEUS = "/nacos/actuator/prometheus"

#: Every port a node may listen on, relative to its main port: the managed etcd member's client
#: and peer ports (-1000, -999), HTTP, SDK gRPC (+1000) and cluster gRPC (+1001).
NODE_OFFSETS: tuple[int, ...] = (-1000, -999, 0, 1000, 1001)

# Blocks handed out by this process lately. A block is free when it is picked but its node binds it
# only later, so without this two calls in a row could return overlapping blocks.
_RECENT: collections.deque[frozenset[int]] = collections.deque(maxlen=64)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default 32768-60999)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(offsets: Sequence[int] = NODE_OFFSETS, avoid: Sequence[int] = (),
                    host: str = HOST) -> int:
    """A main port P with P+offset free for every offset (by default all of a node's ports,
    :data:`NODE_OFFSETS`) on ``host`` and on 127.0.0.1, not overlapping the blocks of the main
    ports in ``avoid`` nor a block this process handed out lately."""
    return free_port_blocks(1, offsets, host, avoid)[0]


def free_port_blocks(count: int, offsets: Sequence[int] = NODE_OFFSETS, host: str = HOST,
                     avoid: Sequence[int] = ()) -> list[int]:
    """``count`` such main ports whose blocks do not overlap each other (nor those in ``avoid``).

    Blocks lie below the kernel's ephemeral range: a port in that range can be taken by any
    process's outgoing connection between the moment it is found free and the moment the node
    binds it (seen in CI as "address already in use" on a node's cluster port)."""
    taken = {p + o for p in avoid for o in offsets}
    for block in _RECENT:
        taken |= block
    hosts = dict.fromkeys((host, HOST))  # a node on 127.0.0.x must not collide with 127.0.0.1's
    low_ephemeral, high_ephemeral = _ephemeral_range()
    lowest = 1024 - min(0, *offsets)
    highest = min(low_ephemeral, 65536) - 1 - max(0, *offsets)
    if highest - lowest < 1000:  # an unusual range: fall back to the ports above it
        lowest, highest = high_ephemeral + 1 - min(0, *offsets), 65535 - max(0, *offsets)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    found: list[int] = []
    for _ in range(2000):
        base = rng.randint(lowest, highest)
        ports = {base + off for off in offsets}
        if ports & taken:
            continue
        if all(_bindable(h, port) for port in ports for h in hosts):
            taken |= ports
            _RECENT.append(frozenset(ports))
            found.append(base)
            if len(found) == count:
                return found
    raise RuntimeError(f"no free block of ports on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def metric_values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` in a Prometheus text page, with its labels."""
    out = []
    for match in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        out.append((labels, float(match.group(2))))
    return out


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
    return sum(value for have, value in metric_values(text, name)
               if all(have.get(k) == v for k, v in labels.items()))


#: ``shoal_*`` size gauges that count what one worker holds (summed over a node's workers by ``gauge``).
PER_WORKER_GAUGES = frozenset({"connections", "moved_clients_kept"})


#: Environment variable giving the worker count of every test node that does not choose one
#: (e.g. ``SHOAL_TEST_WORKERS=2`` runs a real-client suite against nodes of two workers).
WORKERS_ENV = "SHOAL_TEST_WORKERS"


def default_workers() -> int:
    """The ``--workers`` of a test node that does not choose one: :data:`WORKERS_ENV`, else 1."""
    value = os.environ.get(WORKERS_ENV, "").strip()
    if not value:
        return 1
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"{WORKERS_ENV} must be a worker count, got {value!r}") from None
    if count < 1:
        raise ValueError(f"{WORKERS_ENV} must be at least 1, got {count}")
    return count


def _workers_in(args: Sequence[str], default: int) -> int:
    """The worker count ``args`` give with their last ``--workers N`` (``default`` without one)."""
    count = default
    for flag, value in itertools.pairwise(args):
        if flag == "--workers" and value.isdigit():
            count = int(value)
    return count


class AuthMode(enum.Enum):
    """Whether a test node asks for a login: every node a test starts says which, so a test's
    intent stays visible (a node left at the defaults needs a login everywhere, as Nacos 3.3)."""

    #: Every API family open (the three switches off): for tests that are not about auth.
    OPEN = ("-D", "nacos.core.auth.enabled=false", "-D", "nacos.core.auth.admin.enabled=false",
            "-D", "nacos.core.auth.console.enabled=false")
    #: The defaults: client, admin and console APIs all need a login.
    SECURE = ()


#: The same two choices for in-process tests, as Config field overrides (``make_registry(**OPEN_SETTINGS)``).
OPEN_SETTINGS: Mapping[str, bool] = {"auth_enabled": False, "auth_admin_enabled": False,
                                     "auth_console_enabled": False}
SECURE_SETTINGS: Mapping[str, bool] = dict.fromkeys(OPEN_SETTINGS, True)

#: A node whose APIs need no login (tests not about auth).
OPEN = AuthMode.OPEN
#: A node with the secure defaults (Nacos 3.3: every API family needs a login).
SECURE = AuthMode.SECURE


class ServerProcess:
    """One ``shoal server`` on ``host`` (127.0.0.1 unless told): HTTP on ``port``, SDK gRPC on
    +1000, cluster on +1001. ``auth`` (required) says whether it runs :data:`OPEN` or with the
    :data:`SECURE` defaults; a ``--auth`` or ``-D nacos.core.auth.*`` in ``args`` comes after and wins.

    Created stopped; :meth:`start` spawns it in its own session with stdout and stderr appended
    to ``<data_dir>/server.log`` (a restarted node keeps one log). ``entry`` replaces
    ``-m shoal`` (e.g. ``["-c", code]``); ``die_with_parent`` wraps the command in
    :func:`shoal.childproc.dying_with_parent` (only from a thread that outlives the server: the kernel signals
    when the starting thread exits). ``https`` is the client context for a node whose HTTP
    port serves TLS (``server.ssl.*``): its URLs are then ``https://`` and every probe goes
    through that context. ``ready_timeout`` is how long :meth:`wait_ready` waits by default (a
    node whose peers may be stopped or cut off needs longer). ``workers`` is ``--workers``: 1 (one
    process) or N (a supervisor and N worker processes, see :meth:`workers_state`); unset, it is
    :func:`default_workers` (1 unless the run says otherwise, whatever the server's own default);
    a ``--workers`` in ``args`` comes after and wins.
    """

    def __init__(self, port: int, data_dir: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 *, auth: AuthMode, entry: Sequence[str] = ("-m", "shoal"), die_with_parent: bool = False,
                 host: str = HOST, https: ssl.SSLContext | None = None, ready_timeout: float = 20.0,
                 workers: int | None = None) -> None:
        self.auth = auth
        self.host = host
        self.ready_timeout = ready_timeout  #: how long :meth:`wait_ready` waits unless told
        self.https = https
        self.port = port
        self.data_dir = data_dir
        self.log_path = data_dir / "server.log"
        workers = default_workers() if workers is None else workers
        self.args = [sys.executable, *entry, "server", "--host", host, "--port", str(port),
                     "--data-dir", str(data_dir), "--workers", str(workers), *auth.value, *args]
        self.workers = _workers_in(args, workers)  #: the node's worker count (1: a single process)
        # the harness's own variable is not the server's (a server refuses SHOAL_* names it does not know)
        self.env = {**{k: v for k, v in os.environ.items() if k != WORKERS_ENV}, **(env or {})}
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  #: time.time() just before the process was spawned

    # --- addresses ----------------------------------------------------------------------------
    @property
    def grpc_port(self) -> int:
        return self.port + 1000

    @property
    def cluster_port(self) -> int:
        return self.port + 1001

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{'https' if self.https is not None else 'http'}://{self.host}:{self.port}{path}"

    # --- the process --------------------------------------------------------------------------
    @property
    def proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"server on {self.port} was not started")
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = (dying_with_parent(self.args)
               if self.die_with_parent else self.args)
        with open(self.log_path, "ab") as log_file:
            self.started_at = time.time()
            self._proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.env, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def check_alive(self) -> None:
        """Raise AssertionError (with the log's tail) if the process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            raise AssertionError(f"server on {self.port} exited with {self._proc.returncode}:\n{self.log_tail()}")

    def log(self) -> str:
        """The server's output so far (for failure messages and diagnostics, not for assertions)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def ready(self) -> bool:
        self.check_alive()
        try:
            return http_get(self.url(READINESS), 0.5, self.https)[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float | None = None, interval: float = 0.05) -> float:
        """Poll readiness until it answers 200 (within ``timeout``, default ``ready_timeout``), and
        for a node of several workers until every worker answers ready on its private port (a new
        connection may land on any of them); returns the time.time() it did."""
        timeout = self.ready_timeout if timeout is None else timeout
        poll_until(self.ready, timeout, interval, what=f"server on {self.port} to be ready")
        if self.workers > 1:
            self.wait_workers(timeout)
        return time.time()

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10) -> int:
        """SIGTERM and wait; a server that does not stop in time is killed and the call fails."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server did not stop within {timeout}s:\n{self.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait()

    # --- a multi-worker node ----------------------------------------------------------------
    def workers_state(self) -> dict[str, Any] | None:
        """The supervisor's ``workers.json`` (supervisor pid, each worker's index, pid, private
        port, restarts); None when there is none (yet)."""
        try:
            state = json.loads((self.data_dir / "workers.json").read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def worker_pids(self) -> list[int]:
        """Each worker's pid, by index (0 while one is being restarted)."""
        state = self.workers_state() or {}
        return [int(w["pid"]) for w in state.get("workers", [])]

    def worker_ports(self) -> list[int]:
        """Each worker's private main port, by index."""
        state = self.workers_state() or {}
        return [int(w["port"]) for w in state.get("workers", [])]

    def worker_url(self, index: int, path: str) -> str:
        """``path`` on worker ``index``'s private HTTP port."""
        scheme = "https" if self.https is not None else "http"
        return f"{scheme}://{self.host}:{self.worker_ports()[index]}{path}"

    def wait_workers(self, timeout: float = 20.0) -> list[int]:
        """Wait until every worker of the node runs and answers ready on its private port; their pids."""
        def all_ready() -> list[int] | None:
            self.check_alive()
            pids = self.worker_pids()
            if len(pids) != self.workers or not all(pids):
                return None
            for i in range(len(pids)):
                try:
                    if http_get(self.worker_url(i, READINESS), 0.5, self.https)[0] != 200:
                        return None
                except OSError:
                    return None
            return pids
        pids: list[int] = poll_until(all_ready, timeout, 0.05, what=f"the {self.workers} workers on {self.port}")
        return pids

    def wait_worker_restarted(self, index: int, old_pid: int, timeout: float = 20.0) -> int:
        """Wait until worker ``index`` runs under a pid other than ``old_pid`` and answers ready; its pid."""
        def restarted() -> int | None:
            self.check_alive()
            pids = self.worker_pids()
            if len(pids) <= index or pids[index] in (0, old_pid):
                return None
            try:
                ready = http_get(self.worker_url(index, READINESS), 0.5, self.https)[0] == 200
            except OSError:
                return None
            return pids[index] if ready else None
        pid: int = poll_until(restarted, timeout, 0.05, what=f"worker {index} of {self.port} to be restarted")
        return pid

    # --- what it reports ----------------------------------------------------------------------
    def prometheus(self) -> str:
        status, text = http_get(self.url(PROMETHEUS), 5.0, self.https)
        if status != 200:
            raise RuntimeError(f"prometheus on {self.port} answered {status}")
        return text

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``shoal_<name>`` with ``labels`` (0 when there are none)."""
        return metric_sum(self.prometheus(), f"shoal_{name}", **labels)

    def gauge(self, name: str) -> float | None:
        """The node's ``shoal_<name>`` (None when absent). A node of workers labels it by worker:
        then the workers' sum for what each holds of its own (:data:`PER_WORKER_GAUGES`), else one
        worker's (every worker holds the registry alike)."""
        values = metric_values(self.prometheus(), f"shoal_{name}")
        if not values:
            return None
        if name in PER_WORKER_GAUGES and all("worker" in labels for labels, _ in values):
            return sum(value for _, value in values)
        return values[0][1]

    def try_gauge(self, name: str) -> float | None:
        """The gauge, or None when the node does not answer in time (a stalled event loop)."""
        try:
            return self.gauge(name)
        except (OSError, RuntimeError):
            return None

    def members(self) -> list[dict[str, Any]]:
        """The node's member list (/nacos/v1/core/cluster/nodes), empty if it does not answer 200."""
        status, text = http_get(self.url("/nacos/v1/core/cluster/nodes"), 2.0, self.https)
        if status != 200:
            return []
        body = json.loads(text)
        data = body.get("data", body) if isinstance(body, dict) else body
        return list(data) if isinstance(data, list) else []

    def proc_status(self) -> dict[str, int]:
        """VmRSS / VmHWM in bytes from /proc/<pid>/status (empty once the process is gone)."""
        out: dict[str, int] = {}
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return out
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def cpu_s(self) -> float | None:
        """User + system CPU seconds of the process so far (None once it is gone)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def extensions_loaded(self) -> bool | None:
        """Whether the compiled kernels are mapped into the process (None once it is gone)."""
        try:
            maps = Path(f"/proc/{self.pid}/maps").read_text()
        except OSError:
            return None
        return "shoal/_ext/" in maps


def start_server(root: Path, args: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 wait: bool = True, port: int | None = None, *, auth: AuthMode, **options: Any) -> ServerProcess:
    """Start a server on ``port`` (default: a free block) with its data dir under ``root``, open
    or secure as ``auth`` says; with ``wait``, return once it is ready (killing it if it never gets there)."""
    port = port or free_port_block()
    server = ServerProcess(port, root / f"node-{port}", list(args or []), env, auth=auth, **options).start()
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.kill()
            raise
    return server


def kill(server: ServerProcess) -> None:
    """SIGKILL ``server`` if it still runs, and reap it."""
    server.kill()


class ServerSet:
    """Starts servers under ``root`` and stops every one of them when the ``with`` block ends.
    ``auth`` is how its nodes run (:data:`OPEN` or :data:`SECURE`) unless a start says otherwise."""

    def __init__(self, root: Path, *, auth: AuthMode) -> None:
        self.auth = auth
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.servers: list[ServerProcess] = []

    def add(self, server: ServerProcess) -> ServerProcess:
        """Track a server created elsewhere (started or not) so it is stopped with the others."""
        self.servers.append(server)
        return server

    def start(self, port: int | None = None, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
              wait: bool = False, auth: AuthMode | None = None, **options: Any) -> ServerProcess:
        """Start (and track) a server (the set's ``auth`` unless given); ``options`` go to :class:`ServerProcess`."""
        port = port or free_port_block(avoid=[s.port for s in self.servers])
        server = self.add(ServerProcess(port, self.root / f"node-{port}", args, env, auth=auth or self.auth,
                                        **options))
        server.start()
        if wait:
            server.wait_ready()
        return server

    def stop_all(self) -> None:
        """SIGTERM every server, then SIGKILL whatever is still there."""
        for server in self.servers:
            if server.alive():
                with contextlib.suppress(Exception):
                    server.stop()
        for server in self.servers:
            server.kill()

    def __enter__(self) -> ServerSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
