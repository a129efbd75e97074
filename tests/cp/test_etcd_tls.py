"""The etcd store over TLS with a client certificate, against a real etcd that requires one."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shoal.cp.etcd import EtcdStore
from shoal.cp.store import Keyspace, json_view
from shoal.errors import CpUnavailable
from shoal.testing.etcd import require_etcd
from shoal.testing.procs import free_port_blocks
from shoal.testing.wait import wait_until


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_pki(directory: Path) -> None:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=shoal-test-ca",
             cwd=directory)
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ext in (("server", ("-extfile", "server.ext")), ("client", ())):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", *ext, cwd=directory)


@pytest.fixture
async def tls_etcd(tmp_path: Path) -> AsyncIterator[tuple[int, Path]]:
    _make_pki(tmp_path)
    client, peer = free_port_blocks(2, (0,))
    proc = await asyncio.create_subprocess_exec(
        require_etcd(), "--name", "tls", "--data-dir", str(tmp_path / "etcd"),
        "--listen-client-urls", f"https://127.0.0.1:{client}", "--advertise-client-urls", f"https://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"tls=http://127.0.0.1:{peer}",
        "--cert-file", str(tmp_path / "server.pem"), "--key-file", str(tmp_path / "server.key"),
        "--trusted-ca-file", str(tmp_path / "ca.pem"), "--client-cert-auth",
        "--logger", "zap", "--log-outputs", "stderr",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        yield client, tmp_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()


async def test_tls_with_a_client_certificate(tls_etcd: tuple[int, Path]) -> None:
    port, pki = tls_etcd
    store = EtcdStore([f"127.0.0.1:{port}"], ca_file=str(pki / "ca.pem"), cert_file=str(pki / "client.pem"),
                      key_file=str(pki / "client.key"), request_timeout_ms=2000)
    no_cert = EtcdStore([f"127.0.0.1:{port}"], ca_file=str(pki / "ca.pem"), request_timeout_ms=2000)
    await store.start()
    await no_cert.start()
    view = json_view(store, Keyspace.USERS)
    try:
        async def put() -> int | None:
            try:
                return await store.put(Keyspace.USERS.key("tls"), b'"yes"')
            except CpUnavailable:
                return None

        revision = await wait_until(put, 30, "a write over TLS")
        view.start()
        await view.wait_revision(revision, 15)
        assert view.get("tls") == "yes"  # the watch stream runs over TLS too
        with pytest.raises(CpUnavailable):
            await no_cert.get(Keyspace.USERS.key("tls"))
    finally:
        await view.stop()
        await store.close()
        await no_cert.close()
