"""The native load generator (``native/nacos_load.c``) driven from Python.

The C program opens the connections, does the SDK handshake and keeps K unary calls in flight
per connection; it only frames, sends, receives and counts. Every request body comes from
here, built by the same functions the Python generator uses (``worker.register_plan``,
``worker.query_plan``, ``nacos_client`` builders) and encoded with Shoal's own ``Payload``
class, so both generators send the same bytes.

The program is compiled on first use with the system C compiler and libnghttp2
(``libnghttp2-dev``) into ``bench/results/native/`` (ignored by git), keyed by the source's
hash. The node's own build never needs it.

:class:`NativePool` has the interface run.py's Pool has (``call(indexes, command, params,
timeout_s, server)``, ``close()``): loader ``i`` is one C process; the extra index (the
verifier) is a Python worker, whose queries are not timed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import nacos_client as nc  # siblings: run.py's folder is on the path
import worker as load_worker

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "nacos_load.c"
BUILD_DIR = HERE.parent / "results" / "native"

#: ConnectionSetupRequest of a naming SDK connection (as nacos_client.NacosConnection sends it)
SETUP = {
    "headers": {},
    "clientVersion": nc.CLIENT_VERSION,
    "tenant": "",
    "labels": {"source": "sdk", "module": "naming"},
    "abilityTable": {},
    "module": "internal",
}
SERVER_CHECK = {"headers": {}, "module": "internal"}


def build(cc: str | None = None) -> Path:
    """Compile the generator if this source has not been compiled yet; the binary's path."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    binary = BUILD_DIR / f"nacos_load-{digest}"
    if binary.exists():
        return binary
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("the native load generator needs a C compiler (cc/gcc) and libnghttp2-dev")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(f".tmp{os.getpid()}")
    proc = subprocess.run(
        [compiler, "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-lnghttp2"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE.name} failed (is libnghttp2-dev installed?):\n{proc.stderr}")
    os.replace(tmp, binary)
    return binary


def grpc_message(type_name: str, body: bytes | str, client_ip: str = "127.0.0.1") -> bytes:
    """One gRPC message: the 5-byte prefix (not compressed, length) and the Payload."""
    raw: bytes = nc.payload(type_name, body, client_ip).SerializeToString()
    return b"\0" + len(raw).to_bytes(4, "big") + raw


def encode_plan(plan: Sequence[Sequence[tuple[str, bytes]]]) -> bytes:
    """The C program's plan file: u32 connections, per connection u32 messages and per message
    u32 length + the gRPC message (little endian)."""
    out = bytearray(struct.pack("<I", len(plan)))
    for ops in plan:
        out += struct.pack("<I", len(ops))
        for type_name, body in ops:
            msg = grpc_message(type_name, body)
            out += struct.pack("<I", len(msg))
            out += msg
    return bytes(out)


class NativeProcess:
    """One running ``nacos_load`` process and the connections it holds."""

    def __init__(self, index: int, binary: Path, target: str) -> None:
        self.index = index
        self.host, _, port = target.rpartition(":")
        self.port = int(port)
        self.tmpdir = tempfile.mkdtemp(prefix="shoal-native-load-")
        self.first_global = 0
        self.opened = 0
        self.prepared: dict[str, Path] = {}
        self.proc = subprocess.Popen(
            [str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1
        )

    def _path(self, name: str) -> str:
        return os.path.join(self.tmpdir, name)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def recv(self, deadline: float, alive: Any = None) -> dict[str, Any]:
        out = self.proc.stdout
        assert out is not None
        while True:
            ready, _, _ = select.select([out], [], [], 0.2)
            if ready:
                line = out.readline()
                if not line:
                    raise RuntimeError(f"native generator {self.index} exited ({self.proc.poll()})")
                result: dict[str, Any] = json.loads(line)
                if "error" in result:
                    raise RuntimeError(f"native generator {self.index}: {result['error']}")
                return result
            if alive is not None:
                alive()
            if self.proc.poll() is not None:
                raise RuntimeError(f"native generator {self.index} exited ({self.proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"native generator {self.index} did not answer in time")

    def latencies(self, name: str) -> array[float]:
        lat = array("d")
        with open(self._path(name), "rb") as f:
            lat.frombytes(f.read())
        return lat

    # --- commands: each sends its line; finish() reads the answer --------------------------
    def start(self, command: str, p: dict[str, Any]) -> None:
        if command == "connect":
            hs = encode_plan([[("ServerCheckRequest", json.dumps(SERVER_CHECK).encode()),
                               ("ConnectionSetupRequest", json.dumps(SETUP).encode())]])
            Path(self._path("handshake.bin")).write_bytes(hs)
            self.first_global = p["first_global"]
            self.send(f"connect {self.host} {self.port} {p['count']} {self._path('handshake.bin')} "
                      f"{self._path('connect.lat')} {p.get('timeout', 30.0)}")
        elif command in ("register", "deregister", "query"):
            plan = self.prepared.pop(command, None) or self.prepare(command, p)
            self.send(f"run {plan} {p['window']} {p['duration']} {self._path('run.lat')} {p.get('batch', 1)} "
                      f"{p.get('coalesce_us', 0)}")
        elif command in ("close_all", "exit"):
            self.send("close")
        else:
            raise ValueError(f"the native generator has no command {command!r}")

    def prepare(self, command: str, p: dict[str, Any]) -> Path:
        """Build and write the plan of a rate phase (before the phase's CPU is measured)."""
        if command == "query":
            plan = load_worker.query_plan(p, self.index, self.opened)
        else:
            kind = "registerInstance" if command == "register" else "deregisterInstance"
            plan = load_worker.register_plan(p, kind, self.first_global, self.opened)
        path = Path(self._path(f"{command}.plan"))
        path.write_bytes(encode_plan(plan))
        self.prepared[command] = path
        return path

    def run_plan(
        self, plan: Sequence[Sequence[tuple[str, bytes]]], window: int, max_s: float, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        """Run one plan (any requests, connection i gets plan[i]) and wait for its result."""
        path = Path(self._path("adhoc.plan"))
        path.write_bytes(encode_plan(plan))
        self.send(f"run {path} {window} {max_s} {self._path('run.lat')}")
        return self.finish("run", time.monotonic() + timeout_s)

    def start_await(self, port: int, count: int, timeout_s: float) -> None:
        """Subscriber side of a fan-out: wait until ``count`` connections read a push listing ``port``."""
        self.send(f"await {port} {count} {timeout_s} {self._path('push.rec')}")

    def finish_await(self, deadline: float, alive: Any = None) -> dict[str, Any]:
        """The answer of :meth:`start_await`, with ``records``: every push read since the last await,
        as (connection index in this process, first port in its hosts or -1, ``time.monotonic()``)."""
        result = self.recv(deadline, alive)
        with open(self._path("push.rec"), "rb") as f:
            result["records"] = list(struct.iter_unpack("<iid", f.read()))
        return result

    def finish(self, command: str, deadline: float, alive: Any = None) -> dict[str, Any]:
        result = self.recv(deadline, alive)
        if command == "connect":
            self.opened += result["opened"]
            result["connect_s"] = self.latencies("connect.lat")
        elif command in ("register", "deregister", "query", "run"):
            result["latency_s"] = self.latencies("run.lat")
        elif command == "close_all":
            self.opened = 0
        return result

    def close(self, grace_s: float = 10.0) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # EOF: the program closes its connections and exits
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class NativePool:
    """``loaders`` native processes (indexes 0..loaders-1) and ``aux`` (a Python-worker pool of one,
    index ``loaders``) for the untimed verify queries."""

    def __init__(self, loaders: int, target: str, aux: Any) -> None:
        self.binary = build()
        self.native = [NativeProcess(i, self.binary, target) for i in range(loaders)]
        self.aux = aux
        self.aux_index = loaders

    def prepare(self, indexes: Iterable[int], command: str, params: dict[str, Any]) -> None:
        for i in indexes:
            if i != self.aux_index and command in ("register", "deregister", "query"):
                self.native[i].prepare(command, params)

    def call(
        self,
        indexes: Iterable[int],
        command: str,
        params: dict[str, Any] | list[dict[str, Any]],
        timeout_s: float,
        server: Any = None,
    ) -> list[dict[str, Any]]:
        idx = list(indexes)
        if self.aux_index in idx:
            if len(idx) > 1 and command != "close_all":
                raise ValueError("the verifier and the native loaders are called separately")
            out: list[dict[str, Any]] = self.aux.call([0], command, params, timeout_s, server)
            if len(idx) == 1:
                return out
            idx.remove(self.aux_index)
        for n, i in enumerate(idx):
            self.native[i].start(command, params[n] if isinstance(params, list) else params)
        deadline = time.monotonic() + timeout_s
        alive = server.check_alive if server is not None else None
        return [self.native[i].finish(command, deadline, alive) for i in idx]

    def close(self, grace_s: float = 15.0) -> None:
        for p in self.native:
            p.close(grace_s)
        self.aux.close(grace_s)


__all__ = ["NativePool", "NativeProcess", "build", "encode_plan", "grpc_message"]
