"""Real `shoal server` processes on free loopback ports, always cleaned up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port_block(offsets: tuple[int, ...] = (0, 1000, 1001)) -> int:
    """A main port whose port+offsets are all free on 127.0.0.1 right now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + max(offsets) >= 65535:
            continue
        ok = True
        for off in offsets:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", base + off))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block found")


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def grpc_port(self) -> int:
        return self.port + 1000

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return http_get(self.url("/nacos/v1/console/health/readiness"), 0.5)[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 20) -> None:
        wait_until(self.ready, timeout, what=f"server on {self.port} to be ready")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not stop within {timeout}s:\n{self.log()}") from None


def start_server(tmp_path: Path, args: list[str] | None = None, env: dict[str, str] | None = None,
                 wait: bool = True, port: int | None = None) -> ServerProcess:
    port = port or free_port_block()
    data_dir = tmp_path / f"node-{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "server.log"
    cmd = [sys.executable, "-m", "shoal", "server", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", str(data_dir), *(args or [])]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
    server = ServerProcess(proc, port, data_dir, log_path, cmd)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            kill(server)
            raise
    return server


def kill(server: ServerProcess) -> None:
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()
