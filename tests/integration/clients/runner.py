"""Finding, building and running the non-Python test clients of ``test_real_clients.py``.

Each client is a program of its own (Node, Java, or the Rust SDK's Python binding in a process of
its own) that runs one scripted flow against a node and prints one JSON object. What each needs
is installed by ``ci/setup_clients.sh``. Where a tool is missing, a test skips on a developer's
machine but fails in CI (``CI=true``), so a broken setup can never pass as a skipped suite.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shoal.testing.ci import require as testing_require

HERE = Path(__file__).parent
REPO = HERE.parents[2]
PROTO = REPO / "src" / "shoal" / "transport" / "grpc" / "_proto" / "nacos_grpc_service.proto"
NODE_DIR = HERE / "node"
JAVA_DIR = HERE / "java"
JAVA_SOURCE = JAVA_DIR / "NacosGrpcClient.java"
JAVA_BUILD = JAVA_DIR / "build"  # gitignored: compiled classes, one directory per source hash
RUST_DRIVER = HERE / "rust_sdk.py"

#: Debian's jars (under /usr/share/java) that the Java client compiles and runs against:
#: grpc-java itself (libgrpc-java), protobuf-java (libprotobuf-java), and grpc-java's runtime
#: dependencies that libgrpc-java does not declare: guava (libguava-java), gson
#: (libgoogle-gson-java, grpc-core's JSON parser), perfmark-api (libperfmark-java) and netty's
#: HTTP/2 stack (libnetty-java).
JAVA_JARS = (
    "grpc-api", "grpc-context", "grpc-core", "grpc-netty", "grpc-stub", "protobuf", "guava", "gson",
    "perfmark-api", "netty-buffer", "netty-codec", "netty-codec-http", "netty-codec-http2", "netty-codec-socks",
    "netty-common", "netty-handler", "netty-handler-proxy", "netty-resolver", "netty-transport",
)
JAVA_LIB_DIR = Path("/usr/share/java")

#: How long one client's whole flow may take (JVM start and class loading included).
RUN_TIMEOUT_S = 120.0


def require(ok: bool, what: str, fix: str = "run `bash ci/setup_clients.sh`") -> None:
    """Skip (developer machine) or fail (CI) when a client's tool is missing."""
    testing_require(ok, f"{what}: {fix}")


def run_json(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Run a client to completion and return the JSON object it printed; fail with its output otherwise."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=cwd,
                              env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{cmd[0]} client did not finish in {RUN_TIMEOUT_S}s:\n"
                             f"{exc.stdout!r}\n{exc.stderr!r}") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"{cmd[0]} client exited {proc.returncode} printing no JSON:\n"
                             f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    if proc.returncode != 0 or "error" in out:
        raise AssertionError(f"{cmd[0]} client failed ({proc.returncode}): {out.get('error', out)}\n"
                             f"stderr: {proc.stderr[-3000:]}")
    return out


# --- Node (@grpc/grpc-js) ----------------------------------------------------------------------------

def node_command(grpc_port: int, service: str) -> list[str]:
    node = shutil.which("node")
    require(node is not None, "node is not installed")
    require((NODE_DIR / "node_modules" / "@grpc" / "grpc-js" / "package.json").is_file()
            and (NODE_DIR / "node_modules" / "@grpc" / "proto-loader" / "package.json").is_file(),
            f"the Node client's packages are not installed (npm ci in {NODE_DIR.relative_to(REPO)})")
    assert node is not None
    return [node, str(NODE_DIR / "client.js"), f"127.0.0.1:{grpc_port}", str(PROTO), service]


def npm_nacos_command(addr: str, service: str, *credentials: str) -> list[str]:
    """The stock npm ``nacos`` SDK's register-and-read (``nacos_auth.js``) against ``addr`` (host:port)."""
    node = shutil.which("node")
    require(node is not None, "node is not installed")
    require((NODE_DIR / "node_modules" / "nacos" / "package.json").is_file(),
            f"the npm nacos SDK is not installed (npm ci in {NODE_DIR.relative_to(REPO)})")
    assert node is not None
    return [node, str(NODE_DIR / "nacos_auth.js"), addr, service, *credentials]


# --- Java (grpc-java from Debian) --------------------------------------------------------------------

def java_classpath() -> list[str]:
    missing = [name for name in JAVA_JARS if not (JAVA_LIB_DIR / f"{name}.jar").is_file()]
    require(not missing, f"Debian's Java gRPC jars are missing from {JAVA_LIB_DIR}: {', '.join(missing)}")
    return [str(JAVA_LIB_DIR / f"{name}.jar") for name in JAVA_JARS]


def java_classes(classpath: Sequence[str]) -> Path:
    """The compiled client, built with javac once per (source, classpath, javac) and cached."""
    javac = shutil.which("javac")
    require(javac is not None, "javac is not installed (a JDK, 17 or later)")
    assert javac is not None
    version = subprocess.run([javac, "-version"], capture_output=True, text=True, check=True)
    key = hashlib.sha256(JAVA_SOURCE.read_bytes() + "\0".join([*classpath, version.stdout + version.stderr]).encode())
    target = JAVA_BUILD / key.hexdigest()[:16]
    if (target / "NacosGrpcClient.class").is_file():
        return target
    JAVA_BUILD.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="javac-", dir=JAVA_BUILD))
    proc = subprocess.run([javac, "-encoding", "UTF-8", "-nowarn", "-d", str(staging),
                           "-cp", os.pathsep.join(classpath), str(JAVA_SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise AssertionError(f"javac failed:\n{proc.stdout}\n{proc.stderr}")
    try:
        staging.rename(target)  # atomic: a concurrent build of the same key just loses the race
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def java_command(grpc_port: int, service: str) -> list[str]:
    java = shutil.which("java")
    require(java is not None, "java is not installed")
    assert java is not None
    classpath = java_classpath()
    classes = java_classes(classpath)
    return [java, "-cp", os.pathsep.join([str(classes), *classpath]), "NacosGrpcClient", "127.0.0.1",
            str(grpc_port), service]


# --- Rust SDK (nacos-sdk-rust-binding-py, on tonic) --------------------------------------------------

def rust_command(addr: str, service: str) -> list[str]:
    require(importlib.util.find_spec("nacos_sdk_rust_binding_py") is not None,
            "nacos-sdk-rust-binding-py is not installed", "install the dev extra (bash ci/setup.sh)")
    return [sys.executable, str(RUST_DRIVER), addr, service]
