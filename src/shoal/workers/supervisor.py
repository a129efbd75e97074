"""The supervisor of a multi-worker node: starts its N workers, restarts them, stops them.

One process, one asyncio loop, nothing blocking on it. It picks the workers' private ports once
(:func:`pick_private_ports`), starts each worker as ``python -m shoal <same arguments>`` with its
:class:`~shoal.workers.placement.WorkerPlacement` in the environment, and then:

* a worker that exits unexpectedly is started again under the same index and private port,
  after a back-off (:class:`Backoff`: 0.5 s doubling to 10 s, back to 0.5 s once a worker lived
  60 s); a worker exiting 2 (bad configuration) stops the node, exit 2;
* SIGTERM / SIGINT are passed on to the workers; the node exits 0 once they all have, or kills
  the stragglers after :data:`STOP_KILL_S` and exits 1;
* ``<data_dir>/workers.json`` says who runs where (:func:`state_json`), rewritten atomically on
  every change, for ``shoal status``, tests and benchmarks.

Each worker ties itself to the supervisor (``shoal.workers.worker.die_with_supervisor``), so a
``kill -9`` of the supervisor takes its workers along.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.config import Config, TestHooks
from shoal.errors import ConfigError, NacosError
from shoal.tasks import run_blocking
from shoal.workers.placement import WorkerPlacement

if TYPE_CHECKING:
    from shoal.cp.supervisor import EtcdSupervisor
    from shoal.distro.members import MemberManager

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
#: A worker that lived this long restarts after the shortest back-off again.
BACKOFF_RESET_S = 60.0
#: After SIGTERM, the workers still running this long are killed (the node then exits 1).
STOP_KILL_S = 4.5
#: Exit code of a process whose configuration is bad (as ``shoal server``'s).
CONFIG_EXIT = 2
STATE_FILE = "workers.json"


class Backoff:
    """Delay before a worker is restarted: :data:`BACKOFF_START_S` doubling up to
    :data:`BACKOFF_MAX_S`, back to the start once a worker lived :data:`BACKOFF_RESET_S`."""

    def __init__(self) -> None:
        self._next = BACKOFF_START_S

    def delay(self, lived_s: float) -> float:
        """The wait before the next start, given how long the worker just gone lived."""
        if lived_s >= BACKOFF_RESET_S:
            self._next = BACKOFF_START_S
        delay, self._next = self._next, min(self._next * 2, BACKOFF_MAX_S)
        return delay


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_private_ports(count: int, offset: int, reserved: Collection[int], is_free: Callable[[int], bool],
                       rng: random.Random | None = None, low: int = 1024, high: int | None = None) -> tuple[int, ...]:
    """``count`` ports p, each with p and p + ``offset`` free (``is_free``), none of them in
    ``reserved`` (the node's own ports) nor overlapping another pick. Chosen at random below the
    kernel's ephemeral range (``high``), where no outgoing connection takes them meanwhile."""
    rng = rng or random.Random(os.getpid() ^ time.monotonic_ns())
    high = (_ephemeral_low() - 1) if high is None else high
    lowest, highest = max(1, low - min(0, offset)), min(65535, high) - max(0, offset)
    if highest - lowest < count * 4:
        raise ConfigError(f"no room for {count} worker ports between {low} and {high}")
    taken = set(reserved)
    picked: list[int] = []
    for _ in range(count * 500):
        port = rng.randint(lowest, highest)
        pair = {port, port + offset}
        if pair & taken or not all(is_free(p) for p in pair):
            continue
        taken |= pair
        picked.append(port)
        if len(picked) == count:
            return tuple(picked)
    raise ConfigError(f"could not find {count} free worker port pairs (port and port + {offset})")


def bindable(host: str) -> Callable[[int], bool]:
    """Whether a TCP port can be bound on ``host`` right now."""
    def check(port: int) -> bool:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                return False
        return True
    return check


def public_ports(config: Config) -> tuple[int, ...]:
    """The node's ports its workers share, and those its managed etcd member would take."""
    return (config.port, config.grpc_port, config.cluster_port,
            config.port + config.cp_client_port_offset, config.port + config.cp_peer_port_offset)


@dataclass
class WorkerSlot:
    """One worker: its place (kept across restarts) and its current process."""

    index: int
    port: int
    restarts: int = 0
    pid: int = 0
    started: float = 0.0  # time.time() of the current process's start
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)


def state_json(supervisor_pid: int, config: Config, slots: Sequence[WorkerSlot]) -> dict[str, Any]:
    """What ``workers.json`` holds."""
    return {"supervisor": supervisor_pid, "port": config.port, "host": config.host,
            "workers": [{"index": s.index, "pid": s.pid, "port": s.port, "restarts": s.restarts,
                         "started": s.started} for s in slots]}


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Runs a node's workers (see the module doc)."""

    def __init__(self, config: Config, argv: Sequence[str], ports: Sequence[int]) -> None:
        self.config = config
        self.argv = list(argv)
        self.slots = [WorkerSlot(i, p) for i, p in enumerate(ports)]
        self.pid = os.getpid()
        self.state_path = Path(config.data_dir) / STATE_FILE
        self._stop = asyncio.Event()
        self._stopping = False
        self._exit_code = 0
        self._write_lock = asyncio.Lock()

    def placement(self, slot: WorkerSlot) -> WorkerPlacement:
        return WorkerPlacement(slot.index, tuple(s.port for s in self.slots), self.pid)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        log.info("supervising %d workers of the node on %s:%d (private ports %s)", len(self.slots),
                 self.config.host, self.config.port, ", ".join(str(s.port) for s in self.slots))
        keepers = [loop.create_task(self._keep(slot), name=f"worker-{slot.index}") for slot in self.slots]
        try:
            await self._stop.wait()
        finally:
            self._stopping = True
            code = await self._stop_workers()
            for task in keepers:
                task.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            with contextlib.suppress(OSError):
                await run_blocking(self.state_path.unlink, True)
        return code or self._exit_code

    async def _keep(self, slot: WorkerSlot) -> None:
        """Start the worker of ``slot``, and again each time it exits, until the node stops."""
        backoff = Backoff()
        while not self._stopping:
            process = await self._spawn(slot)
            started = time.monotonic()
            code = await process.wait()
            if self._stopping:
                return
            lived = time.monotonic() - started
            if code == CONFIG_EXIT:
                log.error("worker %d (pid %d) refused its configuration (%s): stopping the node",
                          slot.index, process.pid, describe_exit(code))
                self._exit_code = CONFIG_EXIT
                self._stop.set()
                return
            delay = backoff.delay(lived)
            log.warning("worker %d (pid %d, port %d) exited with %s after %.1f s; restarting it in %.1f s",
                        slot.index, process.pid, slot.port, describe_exit(code), lived, delay)
            slot.process, slot.pid = None, 0
            await self._write_state()
            await asyncio.sleep(delay)
            slot.restarts += 1

    async def _spawn(self, slot: WorkerSlot) -> asyncio.subprocess.Process:
        env = {**os.environ, **self.placement(slot).to_env()}
        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "shoal", *self.argv, env=env,
                                                       stdin=asyncio.subprocess.DEVNULL)
        slot.process, slot.pid, slot.started = process, process.pid, time.time()
        log.info("worker %d started: pid %d, private port %d", slot.index, process.pid, slot.port)
        await self._write_state()
        return process

    async def _stop_workers(self) -> int:
        """SIGTERM to every worker; 0 once all exited, 1 when some had to be killed."""
        running = [s.process for s in self.slots if s.process is not None and s.process.returncode is None]
        log.info("stopping %d workers", len(running))
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(p.wait()) for p in running]
        if not waits:
            return 0
        _, pending = await asyncio.wait(waits, timeout=STOP_KILL_S)
        if not pending:
            log.info("all workers stopped")
            return 0
        for process in running:
            if process.returncode is None:
                log.error("worker pid %d did not stop within %.1f s: killed", process.pid, STOP_KILL_S)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        await asyncio.wait(waits, timeout=1.0)
        return 1

    async def _write_state(self) -> None:
        """Rewrite workers.json atomically (a temporary file renamed over it)."""
        text = json.dumps(state_json(self.pid, self.config, self.slots), indent=1)
        async with self._write_lock:
            try:
                await run_blocking(_write_atomically, self.state_path, text)
            except OSError as exc:
                log.warning("cannot write %s: %s", self.state_path, exc)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def preflight(config: Config) -> MemberManager | None:
    """What the supervisor checks before any worker starts; raises ConfigError (exit 2) for a
    configuration no worker can run, OSError (exit 1) for a public port already taken. Returns
    the node's member list (None: standalone), checked as a single-process node checks it."""
    members = None
    if config.members or config.cluster_conf:
        from shoal.clock import SystemClock
        from shoal.distro.members import build_members  # not shoal.app: the supervisor imports no server

        members = build_members(config, SystemClock())  # the nodes: checked as a single process checks them
    TestHooks.from_env()  # malformed hooks: refused here once, not by every worker
    for port in (config.port, config.grpc_port, config.cluster_port):
        with socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((config.host, port))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {config.host}:{port}: {exc.strerror}") from None
    return members


async def _prepare_cp(config: Config) -> None:
    """Create the shared embedded store's file once, before N workers open it together."""
    if config.cp_endpoints or config.cp_mode.strip().lower() not in ("", "embedded"):
        return
    from shoal.cp.embedded import EmbeddedStore

    store = EmbeddedStore.in_data_dir(config.data_dir, config.cp_history_revisions)
    await store.start()
    await store.close()


async def _start_etcd(config: Config, members: MemberManager) -> tuple[EtcdSupervisor | None, list[str]]:
    """In the managed-etcd mode the supervisor runs the node's etcd member (the CP members are
    the nodes, never their workers); the workers are its clients: the ``-D`` arguments that say so."""
    from shoal.cp.factory import cp_mode, managed_member, worker_cp_overrides

    if cp_mode(config, True) != "managed-etcd":
        return None, []
    etcd, tls = managed_member(config, [(m.ip, m.port) for m in members.all_members()], members.self_address)
    await etcd.start()
    return etcd, worker_cp_overrides(etcd, tls)


async def supervise(config: Config, argv: Sequence[str]) -> int:
    """Run the node's workers until SIGTERM / SIGINT; the process's exit code."""
    etcd: EtcdSupervisor | None = None
    try:
        # port probes and cluster.conf are socket and file calls: off the loop, as every other one
        members = await run_blocking(preflight, config)
        ports = await run_blocking(pick_private_ports, config.workers, config.cluster_port_offset,
                                   public_ports(config), bindable(config.host))
        extra: list[str] = []
        if members is None:
            await _prepare_cp(config)
        else:
            etcd, extra = await _start_etcd(config, members)
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return CONFIG_EXIT
    except (OSError, NacosError) as exc:  # a port taken, the store's file or etcd's binary unusable
        log.error("cannot start: %s", exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
        return 1
    try:
        return await Supervisor(config, [*argv, *extra], ports).run()
    finally:
        if etcd is not None:
            await etcd.stop()
