"""A managed etcd member per Shoal node, so that ``--members`` alone gives a CP store.

Every node of a member list ``h1:p1,h2:p2,...`` (main ports) runs one etcd member:

* **client port = main port − 1000** — Nacos's Raft port (7848 for 8848), so firewalls and
  docs that already open it for Nacos fit;
* **peer port = main port − 999** (7849 for 8848). Nacos's own gRPC ports (+1000, +1001)
  already forbid main ports one apart on one host, so these two cannot collide either;
  both offsets are settings (``shoal.cp.client-port-offset``/``peer-port-offset``);
* member name ``shoal-<host>-<port>``, data dir ``<data_dir>/cp/etcd``, output appended to
  ``<data_dir>/cp/etcd.log``, kept bounded: when it passes ``log_max_bytes`` (checked at every
  start and every ``log_check_interval_ms``) it is copied to ``etcd.log.1`` (older copies
  shifted up to ``etcd.log.<log_keep>``, the oldest dropped; a node sets the three from
  ``shoal.cp.etcd-log.max-bytes``, ``.count`` and ``.check-interval-ms``) and truncated in place, as
  logrotate's *copytruncate* does: etcd keeps writing to the same file (opened for append) and
  never blocks on a pipe of ours; a few lines written between the copy and the truncation can
  be lost; ``--initial-cluster`` lists every member of the same list,
  with a cluster token derived from that list, so nodes given different lists cannot merge.
  With an existing data dir etcd ignores the bootstrap flags and rejoins with its own state.

With :class:`EtcdTls` (a node with ``nacos.remote.peer.rpc.tls.enableTls=true``, see
:func:`shoal.cp.factory.build_cp`) every member serves its peer and client URLs over TLS only
(``https``) with the node's cluster certificate, key and trust collection: members always
verify each other's certificates (etcd requires a client certificate on a listener as soon as
it is given a CA file), and clients must show one signed by that CA when the cluster settings
ask for mutual auth. Plaintext is then never offered on either port.

The supervisor starts the binary (Debian's ``etcd`` 3.4, ``/usr/bin/etcd``) as an asyncio
subprocess in its own session, restarts it with exponential back-off whenever it exits
unasked (reset after it stayed up a while), and on :meth:`EtcdSupervisor.stop` sends SIGTERM,
waits the grace period, then SIGKILL. Nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import os
import random
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shoal.childproc import dying_with_parent
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

DEFAULT_BINARY = "/usr/bin/etcd"

#: How often a managed member sends progress notifications on idle watches (see command()).
WATCH_PROGRESS_INTERVAL = "2s"
CLIENT_PORT_OFFSET = -1000
PEER_PORT_OFFSET = -999


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """PEM files the managed members serve TLS with (unencrypted key: etcd takes no password)."""

    cert_file: str
    key_file: str
    trusted_ca_file: str
    #: clients of the client URLs must show a certificate signed by ``trusted_ca_file``
    client_cert_auth: bool

    def flags(self) -> list[str]:
        """etcd's TLS flags for both listeners."""
        client = ["--cert-file", self.cert_file, "--key-file", self.key_file]
        if self.client_cert_auth:  # a CA file alone already makes etcd require client certificates
            client += ["--trusted-ca-file", self.trusted_ca_file, "--client-cert-auth"]
        return [*client, "--peer-cert-file", self.cert_file, "--peer-key-file", self.key_file,
                "--peer-trusted-ca-file", self.trusted_ca_file, "--peer-client-cert-auth"]


@dataclass(frozen=True, slots=True)
class EtcdMember:
    """One etcd member derived from a Shoal member's main address."""

    name: str
    host: str
    client_port: int
    peer_port: int
    tls: bool = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{_url_host(self.host)}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{_url_host(self.host)}:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client port (what :class:`~shoal.cp.etcd.EtcdStore` takes)."""
        return f"{_url_host(self.host)}:{self.client_port}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def plan_members(members: Sequence[tuple[str, int]], client_offset: int = CLIENT_PORT_OFFSET,
                 peer_offset: int = PEER_PORT_OFFSET, tls: bool = False) -> list[EtcdMember]:
    """The etcd members of a Shoal member list of ``(host, main port)``, in list order
    (``tls``: their URLs are https)."""
    planned = []
    for host, port in members:
        client, peer = port + client_offset, port + peer_offset
        if not (0 < client < 65536 and 0 < peer < 65536):
            raise ValueError(f"member {host}:{port}: etcd ports {client}/{peer} are out of range")
        safe = "".join(c if c.isalnum() or c in "-." else "-" for c in host)
        planned.append(EtcdMember(f"shoal-{safe}-{port}", host, client, peer, tls))
    return planned


def cluster_token(members: Sequence[EtcdMember]) -> str:
    """A token naming exactly this member set (etcd's ``--initial-cluster-token``)."""
    text = ",".join(sorted(f"{m.name}={m.peer_url}" for m in members))
    return "shoal-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class EtcdSupervisor:
    """Runs and supervises this node's etcd member (see the module docstring)."""

    def __init__(
        self,
        me: EtcdMember,
        cluster: Sequence[EtcdMember],
        data_dir: str | Path,
        binary: str = DEFAULT_BINARY,
        *,
        restart_initial_ms: int = 200,
        restart_max_ms: int = 10_000,
        stable_after_ms: int = 30_000,
        stop_grace_ms: int = 3_000,
        history_revisions: int = 100_000,
        log_max_bytes: int = 64 * 1024 * 1024,
        log_keep: int = 2,
        log_check_interval_ms: int = 30_000,
        tls: EtcdTls | None = None,
    ) -> None:
        if me not in cluster:
            raise ValueError(f"etcd member {me.name} is not in its own cluster list")
        if any(m.tls != (tls is not None) for m in cluster):
            raise ValueError("etcd members planned with https URLs need EtcdTls, and only they")
        self.tls = tls
        self.me = me
        self.cluster = list(cluster)
        self.data_dir = Path(data_dir)
        self.binary = binary
        self._restart_initial_s = restart_initial_ms / 1000
        self._restart_max_s = restart_max_ms / 1000
        self._stable_after_s = stable_after_ms / 1000
        self._stop_grace_s = stop_grace_ms / 1000
        self._history = history_revisions
        if log_max_bytes <= 0 or log_keep < 1 or log_check_interval_ms <= 0:
            raise ValueError("log_max_bytes and log_check_interval_ms must be positive, log_keep at least 1")
        self._log_max_bytes = log_max_bytes
        self._log_keep = log_keep
        self._log_check_s = log_check_interval_ms / 1000
        self._log_task: asyncio.Task[None] | None = None
        #: How many times the log file was rotated.
        self.log_rotations = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: How many times the member was started (1 after start(); +1 per restart).
        self.starts = 0

    @property
    def etcd_dir(self) -> Path:
        return self.data_dir / "cp" / "etcd"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "cp" / "etcd.log"

    @property
    def log_limits(self) -> tuple[int, int, int]:
        """(size that rotates etcd.log, rotated files kept, check interval in ms)."""
        return self._log_max_bytes, self._log_keep, round(self._log_check_s * 1000)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    @property
    def endpoints(self) -> list[str]:
        """Client endpoints of the whole cluster, this member first."""
        return [self.me.endpoint] + [m.endpoint for m in self.cluster if m != self.me]

    @property
    def client_urls(self) -> list[str]:
        """Client URLs of the whole cluster (http or https), this member first."""
        return [self.me.client_url] + [m.client_url for m in self.cluster if m != self.me]

    def command(self) -> list[str]:
        """The etcd command line of this member."""
        me = self.me
        listen = me.host if _is_ip(me.host) else "0.0.0.0"  # etcd binds IPs only
        scheme = me.scheme
        return [
            self.binary,
            "--name", me.name,
            "--data-dir", str(self.etcd_dir),
            "--listen-client-urls", f"{scheme}://{_url_host(listen)}:{me.client_port}",
            "--advertise-client-urls", me.client_url,
            "--listen-peer-urls", f"{scheme}://{_url_host(listen)}:{me.peer_port}",
            "--initial-advertise-peer-urls", me.peer_url,
            "--initial-cluster", ",".join(f"{m.name}={m.peer_url}" for m in self.cluster),
            "--initial-cluster-token", cluster_token(self.cluster),
            "--initial-cluster-state", "new",
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", str(self._history),
            "--enable-v2=false",
            # Watches asking for progress get a notification this often even when idle, so a
            # client tells a quiet stream from a dead one within seconds (etcd's default: 10 min).
            "--experimental-watch-progress-notify-interval", WATCH_PROGRESS_INTERVAL,
            "--logger", "zap",
            "--log-outputs", "stderr",
            *(self.tls.flags() if self.tls is not None else []),
        ]

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the member and its supervision; returns once the process is spawned."""
        if self._task is not None:
            return
        self._stopping = False
        await run_blocking(self.etcd_dir.mkdir, parents=True, exist_ok=True)
        try:
            await self._spawn()
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"{exc}: the managed-etcd CP mode runs one etcd member per node; install etcd 3.4+ "
                "(Debian: etcd-server), set shoal.cp.etcd-binary to its path, or use an external etcd "
                "with --cp-endpoints") from None
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._supervise(), name=f"etcd-{self.me.name}")
        self._log_task = loop.create_task(self._watch_log(), name=f"etcd-log-{self.me.name}")

    async def _spawn(self) -> None:
        await self._rotate_log()
        logfile: IO[bytes] = await run_blocking(open, self.log_path, "ab")
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
            self._proc = await asyncio.create_subprocess_exec(
                *dying_with_parent(self.command()), stdin=asyncio.subprocess.DEVNULL, stdout=logfile,
                stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            await run_blocking(logfile.close)
        self.starts += 1
        log.info("etcd member %s started (pid %d, client %s, peer %s)",
                 self.me.name, self._proc.pid, self.me.client_url, self.me.peer_url)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = self._restart_initial_s
        while True:
            proc = self._proc
            if proc is None:
                return
            started = loop.time()
            code = await proc.wait()
            if self._stopping:
                return
            if loop.time() - started >= self._stable_after_s:
                backoff = self._restart_initial_s
            log.warning("etcd member %s exited with %s; restarting in %.1f s (see %s)",
                        self.me.name, code, backoff, self.log_path)
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, self._restart_max_s)
            if self._stopping:
                return
            try:
                await self._spawn()
            except OSError:
                log.exception("cannot start etcd member %s with %s", self.me.name, self.binary)

    # --- the log file ---------------------------------------------------------------------------
    def rotated_log_paths(self) -> list[Path]:
        """``etcd.log.1`` .. ``etcd.log.<keep>`` (newest first), whether they exist or not."""
        return [self.log_path.with_name(f"{self.log_path.name}.{n}") for n in range(1, self._log_keep + 1)]

    def _rotate_log_blocking(self) -> bool:
        try:
            if self.log_path.stat().st_size <= self._log_max_bytes:
                return False
        except FileNotFoundError:
            return False
        rotated = self.rotated_log_paths()
        rotated[-1].unlink(missing_ok=True)
        for older, newer in zip(reversed(rotated[1:]), reversed(rotated[:-1]), strict=True):
            if newer.exists():
                newer.replace(older)
        shutil.copyfile(self.log_path, rotated[0])
        with open(self.log_path, "r+b") as current:  # etcd appends: it goes on at the new end
            current.truncate(0)
        return True

    async def _rotate_log(self) -> None:
        try:
            if await run_blocking(self._rotate_log_blocking):
                self.log_rotations += 1
                log.info("etcd member %s: log rotated to %s", self.me.name, self.rotated_log_paths()[0])
        except OSError as exc:
            log.warning("etcd member %s: cannot rotate %s: %s", self.me.name, self.log_path, exc)

    async def _watch_log(self) -> None:
        while True:
            await asyncio.sleep(self._log_check_s)
            await self._rotate_log()

    async def stop(self) -> None:
        """Stop supervising, then the member: SIGTERM, wait the grace period, SIGKILL."""
        self._stopping = True
        task, self._task = self._task, None
        log_task, self._log_task = self._log_task, None
        for running in (task, log_task):
            if running is not None:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self._stop_grace_s)
        except TimeoutError:
            # A leader hands its leadership to a peer before it exits; when the peers stop at the
            # same moment (a whole cluster stopped together) the hand-over waits for etcd's
            # request timeout (over 5 s, the node's whole stop budget): its data is on disk, so it
            # is killed within the budget instead.
            log.info("etcd member %s still stopping after %.1f s (a leader waits to hand over to peers that "
                     "may be stopping too); killing it, its data is on disk", self.me.name, self._stop_grace_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        log.info("etcd member %s stopped", self.me.name)

    async def wait_listening(self, timeout_s: float) -> None:
        """Wait until the member's client port accepts connections (not that it has a quorum)."""
        host = self.me.host if _is_ip(self.me.host) else "127.0.0.1"
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    _, writer = await asyncio.open_connection(host, self.me.client_port)
                except OSError:
                    await asyncio.sleep(0.05)
                    continue
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return
