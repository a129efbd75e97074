"""The libnghttp2 version contract (docs/native-transport.md "Library version").

A real process that loads a libnghttp2 reporting another version (a shim preloaded in front of
the real library answers ``nghttp2_version()``) refuses to import the extension with a message
that says why and what to do; ``shoal server`` then explains it once and serves its gRPC ports on
grpc.aio, and asking for native explicitly fails at start with the same reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.testing import OPEN, ServerProcess, free_port_block, http_get

pytestmark = pytest.mark.c_extension

SHIM = r"""
typedef struct { int age; int version_num; const char *version_str; const char *proto_str; } info_t;
static info_t info = {1, 0x013d00, "1.61.0", "h2"};
info_t *nghttp2_version(int least_version) { (void)least_version; return &info; }
"""


@pytest.fixture(scope="module")
def other_version(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process whose libnghttp2 says it is 1.61.0."""
    where = tmp_path_factory.mktemp("nghttp2-shim")
    (where / "shim.c").write_text(SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(where / "shim.so"), str(where / "shim.c")], check=True)
    return {**os.environ, "LD_PRELOAD": str(where / "shim.so")}


def test_an_untested_library_is_refused_at_import_with_the_reason(other_version: dict[str, str]) -> None:
    run = subprocess.run([sys.executable, "-c", "import shoal._ext.h2grpc"], env=other_version,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "ImportError" in run.stderr and "loaded libnghttp2 1.61.0" in run.stderr
    assert "tested with libnghttp2 1.52.0" in run.stderr and "shoal.remote.transport=grpcio" in run.stderr
    ok = subprocess.run([sys.executable, "-c", "import shoal._ext.h2grpc as h; print(h.LIBRARY_VERSION)"],
                        capture_output=True, text=True, timeout=60)
    assert ok.stdout.strip() == "1.52.0"  # the real library, without the shim


def test_the_server_explains_it_and_serves_on_grpc_aio(other_version: dict[str, str], tmp_path: Path) -> None:
    port = free_port_block()
    server = ServerProcess(port, tmp_path / "node", env={"LD_PRELOAD": other_version["LD_PRELOAD"]}, auth=OPEN).start()
    try:
        server.wait_ready(60)
        status, text = http_get(server.url("/nacos/v1/console/server/state"), 5)
        assert status == 200 and json.loads(text)["shoal_transport"] == "grpcio"
        log = server.log()
        assert "the gRPC ports run on grpc.aio: the native transport is unavailable" in log
        assert "loaded libnghttp2 1.61.0" in log
        assert "sdk gRPC server listening" in log and "transport grpcio" in log and "transport native" not in log
    finally:
        server.kill()
    explicit = ServerProcess(free_port_block(), tmp_path / "explicit", ["-D", "shoal.remote.transport=native"],
                             env={"LD_PRELOAD": other_version["LD_PRELOAD"]}, auth=OPEN).start()
    try:
        code = explicit.proc.wait(60)
    finally:
        explicit.kill()
    assert code != 0
    assert "shoal.remote.transport=native needs the h2grpc extension" in explicit.log()
    assert "loaded libnghttp2 1.61.0" in explicit.log()
