"""TLS on the SDK gRPC port, the cluster port and the HTTP port, with real processes and clients.

Certificates are generated per test into tmp_path (``shoal.testing.certs``). Every gRPC case runs on both
server transports (native over the loop's SSL transport, and grpc.aio).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from v2.nacos import ListInstanceParam, RegisterInstanceParam

from shoal.config import Config, TestHooks
from shoal.errors import ConfigError, TlsConfigError
from shoal.testing import OPEN, ServerProcess, ServerSet, free_port_block, http_get, wait_until
from shoal.testing.certs import Pki, encrypted_copy, make_pki
from shoal.testing.rawclient import RawClient, register_body
from shoal.tls import NodeTls

TRANSPORTS = ["native", "grpcio"]
SDK = "nacos.remote.server.rpc.tls"
PEER = "nacos.remote.peer.rpc.tls"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ServerSet]:
    with ServerSet(tmp_path / "nodes", auth=OPEN) as servers:
        yield servers


def rpc_tls(prefix: str, pki: Pki, mutual: bool = False) -> list[str]:
    args = ["-D", f"{prefix}.enableTls=true", "-D", f"{prefix}.certChainFile={pki.server.cert}",
            "-D", f"{prefix}.certPrivateKey={pki.server.key}"]
    if mutual:
        args += ["-D", f"{prefix}.mutualAuthEnable=true", "-D", f"{prefix}.trustCollectionCertFile={pki.ca}"]
    return args


def https_args(pki: Pki) -> list[str]:
    """HTTPS on the HTTP port (server.ssl.enabled left unset: on because a certificate is given)."""
    return ["-D", f"server.ssl.certificate={pki.server.cert}",
            "-D", f"server.ssl.certificate-private-key={pki.server.key}"]


def transport(name: str) -> list[str]:
    return ["-D", f"shoal.remote.transport={name}"]


def credentials(pki: Pki, with_cert: bool = True, stranger: bool = False) -> Any:
    pair = pki.stranger if stranger else pki.client
    if not with_cert:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    return grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes(), private_key=pair.key.read_bytes(),
                                        certificate_chain=pair.cert.read_bytes())


async def server_check(port: int, creds: Any) -> str:
    """A ServerCheck over a fresh channel: the connection id, or grpc's error."""
    client = RawClient(port, creds)
    try:
        kind, body = await client.call("ServerCheckRequest", {"headers": {}, "module": "internal"})
        assert kind == "ServerCheckResponse", body
        return str(body["connectionId"])
    finally:
        await client.close()


async def refused(port: int, creds: Any) -> grpc.StatusCode:
    """The status of a ServerCheck that must not get through."""
    client = RawClient(port, creds)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await client.call("ServerCheckRequest", {"headers": {}, "module": "internal"})
        return failure.value.code()
    finally:
        await client.close()


@pytest.fixture
async def tls_sdk(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory of real nacos-sdk-python 3.x naming clients over TLS (its TLSConfig)."""
    from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService
    from v2.nacos.common.client_config import TLSConfig

    made: list[Any] = []

    async def factory(addr: str, pki: Pki) -> Any:
        tls = TLSConfig(enabled=True, ca_file=str(pki.ca), cert_file=str(pki.client.cert),
                        key_file=str(pki.client.key))
        config = (ClientConfigBuilder().server_address(addr).log_level("WARNING")
                  .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
                  .grpc_config(GRPCConfig(grpc_timeout=5000)).tls_config(tls).build())
        client = await NacosNamingService.create_naming_service(config)
        made.append(client)
        return client

    yield factory
    for client in made:
        try:
            await client.shutdown()
        except Exception:
            logging.getLogger(__name__).debug("sdk shutdown failed", exc_info=True)


# --- the SDK port ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRANSPORTS)
async def test_sdk_registers_and_reads_over_mutual_tls(name: str, pki: Pki, cluster: ServerSet,
                                                       tls_sdk: Callable[..., Any], tmp_path: Path) -> None:
    secret = encrypted_copy(pki.server, tmp_path, "s3cret")  # Nacos's certPrivateKeyPassword, on both transports
    node = cluster.start(args=[*transport(name), *rpc_tls(SDK, pki, mutual=True), "-D", f"{SDK}.certPrivateKey="
                               f"{secret.key}", "-D", f"{SDK}.certPrivateKeyPassword=s3cret"], wait=True)
    writer, reader = await tls_sdk(node.addr, pki), await tls_sdk(node.addr, pki)
    assert await writer.register_instance(RegisterInstanceParam(service_name="tls-orders", ip="10.9.0.1", port=443))

    async def listed() -> bool:
        found = await reader.list_instances(ListInstanceParam(service_name="tls-orders", subscribe=False,
                                                              healthy_only=None))
        return [(i.ip, i.port) for i in found] == [("10.9.0.1", 443)]

    await wait_until(listed, 10, "the TLS registration to be listed by a second TLS client")


@pytest.mark.parametrize("name", TRANSPORTS)
async def test_mutual_tls_refuses_clients_without_a_trusted_certificate(name: str, pki: Pki,
                                                                        cluster: ServerSet) -> None:
    node = cluster.start(args=[*transport(name), *rpc_tls(SDK, pki, mutual=True)], wait=True)
    assert await server_check(node.grpc_port, credentials(pki))  # the trusted client gets through
    assert await refused(node.grpc_port, credentials(pki, with_cert=False)) == grpc.StatusCode.UNAVAILABLE
    assert await refused(node.grpc_port, credentials(pki, stranger=True)) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("name", TRANSPORTS)
async def test_no_silent_downgrade_on_the_sdk_port(name: str, pki: Pki, cluster: ServerSet) -> None:
    tls_node = cluster.start(args=[*transport(name), *rpc_tls(SDK, pki)])
    plain_node = cluster.start(args=transport(name))
    tls_node.wait_ready()
    plain_node.wait_ready()
    # without mutual auth, a TLS client with no certificate is fine; a plaintext one is not
    assert await server_check(tls_node.grpc_port, credentials(pki, with_cert=False))
    assert await refused(tls_node.grpc_port, None) == grpc.StatusCode.UNAVAILABLE
    # and a TLS client never falls back to plaintext against a plaintext port
    assert await server_check(plain_node.grpc_port, None)
    assert await refused(plain_node.grpc_port, credentials(pki)) == grpc.StatusCode.UNAVAILABLE


# --- the cluster port -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRANSPORTS)
async def test_cluster_replicates_over_mutual_tls(name: str, pki: Pki, cluster: ServerSet) -> None:
    a_port = free_port_block()
    b_port = free_port_block(avoid=[a_port])
    members = f"127.0.0.1:{a_port},127.0.0.1:{b_port}"
    args = ["--members", members, *transport(name), *rpc_tls(PEER, pki, mutual=True),
            "-D", "nacos.core.protocol.distro.data.load.timeoutMs=8000",
            "-D", "shoal.member.report-interval-ms=300"]
    a = cluster.start(a_port, args=args)
    b = cluster.start(b_port, args=args)
    a.wait_ready()
    b.wait_ready()
    client = RawClient(a.grpc_port)  # the SDK port stays plaintext here
    try:
        await client.connect()
        kind, body = await client.call("InstanceRequest", register_body("tls-replicated", ip="10.9.0.2", port=7))
        assert kind == "InstanceResponse", body

        def on_b() -> bool:
            status, text = http_get(b.url("/nacos/v1/ns/instance/list?serviceName=tls-replicated"))
            return status == 200 and [(h["ip"], h["port"]) for h in json.loads(text)["hosts"]] == [("10.9.0.2", 7)]

        await wait_until(on_b, 15, "the write on A to be visible on B over the TLS cluster port")
    finally:
        await client.close()
    # the cluster port itself takes no plaintext and no client without a certificate
    assert await refused(b.cluster_port, None) == grpc.StatusCode.UNAVAILABLE
    assert await refused(b.cluster_port, credentials(pki, with_cert=False)) == grpc.StatusCode.UNAVAILABLE


# --- the HTTP port --------------------------------------------------------------------------------
async def test_http_port_serves_https_only(pki: Pki, cluster: ServerSet) -> None:
    client_ctx = ssl.create_default_context(cafile=str(pki.ca))
    node = cluster.add(ServerProcess(free_port_block(), cluster.root / "https", https_args(pki), https=client_ctx,
                                     auth=OPEN))
    node.start().wait_ready()
    base = f"https://127.0.0.1:{node.port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx)) as session:
        async with session.post(f"{base}/nacos/v1/ns/instance",
                                params={"serviceName": "tls-http", "ip": "10.9.0.3", "port": "80"}) as resp:
            assert resp.status == 200, await resp.text()
        async with session.get(f"{base}/nacos/v1/ns/instance/list", params={"serviceName": "tls-http"}) as resp:
            assert resp.status == 200
            assert [h["ip"] for h in (await resp.json(content_type=None))["hosts"]] == ["10.9.0.3"]
    async with aiohttp.ClientSession() as plain:  # plaintext HTTP to the HTTPS port gets no answer
        with pytest.raises(aiohttp.ClientError):
            async with plain.get(f"http://127.0.0.1:{node.port}/nacos/v1/console/health/readiness") as resp:
                await resp.read()


async def test_http_client_auth_need_refuses_clients_without_a_certificate(pki: Pki, cluster: ServerSet) -> None:
    with_cert = ssl.create_default_context(cafile=str(pki.ca))
    with_cert.load_cert_chain(pki.client.cert, pki.client.key)
    node = cluster.add(ServerProcess(free_port_block(), cluster.root / "https-mutual", [
        "-D", "server.ssl.enabled=true", "-D", f"server.ssl.certificate={pki.server.cert}",
        "-D", f"server.ssl.certificate-private-key={pki.server.key}", "-D", "server.ssl.client-auth=need",
        "-D", f"server.ssl.trust-certificate={pki.ca}"], https=with_cert, auth=OPEN))
    node.start().wait_ready()
    without_cert = ssl.create_default_context(cafile=str(pki.ca))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=without_cert)) as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"https://127.0.0.1:{node.port}/nacos/v1/console/health/readiness") as resp:
                await resp.read()


async def test_https_node_forwards_writes_to_the_responsible_node_over_https(pki: Pki, cluster: ServerSet) -> None:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    https = [*https_args(pki), "-D", f"server.ssl.trust-certificate={pki.ca}"]
    owner = cluster.add(ServerProcess(free_port_block(), cluster.root / "owner", https, https=ctx, auth=OPEN))
    owner.start().wait_ready()
    entry = cluster.add(ServerProcess(free_port_block(avoid=[owner.port]), cluster.root / "entry", https,
                                      TestHooks(forward_all_to=owner.addr).to_env(), https=ctx, auth=OPEN))
    entry.start().wait_ready()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        async with session.post(entry.url("/nacos/v1/ns/instance"),
                                params={"serviceName": "tls-fwd", "ip": "10.9.0.4", "port": "80"}) as resp:
            assert resp.status == 200, await resp.text()
        async with session.get(owner.url("/nacos/v1/ns/instance/list"), params={"serviceName": "tls-fwd"}) as resp:
            assert [h["ip"] for h in (await resp.json(content_type=None))["hosts"]] == ["10.9.0.4"]


def test_export_cli_reads_from_an_https_node(pki: Pki, cluster: ServerSet, tmp_path: Path) -> None:
    node = cluster.add(ServerProcess(free_port_block(), cluster.root / "export", https_args(pki),
                                     https=ssl.create_default_context(cafile=str(pki.ca)), auth=OPEN))
    node.start().wait_ready()
    done = subprocess.run([sys.executable, "-m", "shoal", "export", "--addr", f"https://{node.addr}",
                           "--ca-file", str(pki.ca), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert any((tmp_path / "out").iterdir())


# --- startup: TLS asked for and not possible is exit 2, never plaintext ---------------------------
def _exit_code(cluster: ServerSet, args: list[str]) -> int:
    node = cluster.start(args=args)
    try:
        return node.proc.wait(30)
    except subprocess.TimeoutExpired:
        node.kill()
        raise AssertionError(f"node started anyway:\n{node.log_tail()}") from None


@pytest.mark.parametrize("case", ["missing-cert", "not-pem", "key-of-another-cert", "key-store", "compatibility"])
def test_unusable_tls_settings_stop_the_node_with_exit_2(case: str, pki: Pki, cluster: ServerSet,
                                                         tmp_path: Path) -> None:
    junk = tmp_path / "junk.p12"
    junk.write_bytes(b"\x30\x82\x01\x00 not a PEM file")
    args = {
        "missing-cert": ["-D", f"{SDK}.enableTls=true", "-D", f"{SDK}.certChainFile={tmp_path / 'nope.crt'}",
                         "-D", f"{SDK}.certPrivateKey={pki.server.key}"],
        "not-pem": ["-D", f"{PEER}.enableTls=true", "-D", f"{PEER}.certChainFile={junk}",
                    "-D", f"{PEER}.certPrivateKey={pki.server.key}"],
        "key-of-another-cert": ["-D", f"server.ssl.certificate={pki.server.cert}",
                                "-D", f"server.ssl.certificate-private-key={pki.client.key}"],
        "key-store": ["-D", "server.ssl.enabled=true", "-D", f"server.ssl.key-store={junk}"],
        "compatibility": [*rpc_tls(SDK, pki), "-D", f"{SDK}.compatibility=true"],
    }[case]
    assert _exit_code(cluster, args) == 2


# --- the settings and files, in process -----------------------------------------------------------
def test_node_tls_reads_and_checks_the_files(pki: Pki, tmp_path: Path) -> None:
    def load(**overrides: str) -> NodeTls:
        return NodeTls.load(Config.load(env={}, overrides=overrides))

    plain = load()
    assert (plain.sdk, plain.peer, plain.http) == (None, None, None)
    on = load(**{f"{SDK}.enableTls": "true", f"{SDK}.certChainFile": str(pki.server.cert),
                 f"{SDK}.certPrivateKey": str(pki.server.key), f"{SDK}.mutualAuthEnable": "true",
                 f"{SDK}.trustCollectionCertFile": str(pki.ca)})
    assert on.sdk is not None and on.sdk.settings.mutual and on.peer is None and on.http is None
    assert on.sdk.server_context(alpn=["h2"]).verify_mode == ssl.CERT_REQUIRED

    secret = encrypted_copy(pki.server, tmp_path, "s3cret")
    base = {"server.ssl.certificate": str(secret.cert), "server.ssl.certificate-private-key": str(secret.key)}
    assert load(**base, **{"server.ssl.key-password": "s3cret"}).http is not None
    assert b"ENCRYPTED" not in load(**base, **{"server.ssl.key-password": "s3cret"}).http.unencrypted_key()
    for wrong in ("wrong", ""):  # no password for an encrypted key is an error too, never a prompt
        with pytest.raises(TlsConfigError, match=re.escape("server.ssl.key-password")):
            load(**base, **{"server.ssl.key-password": wrong})
    with pytest.raises(TlsConfigError, match="trustCollectionCertFile"):
        load(**{f"{SDK}.enableTls": "true", f"{SDK}.certChainFile": str(pki.server.cert),
                f"{SDK}.certPrivateKey": str(pki.server.key), f"{SDK}.mutualAuthEnable": "true",
                f"{SDK}.trustCollectionCertFile": str(pki.server.key)})


@pytest.mark.parametrize(("overrides", "problem"), [
    ({f"{SDK}.enableTls": "true"}, "certChainFile"),
    ({f"{PEER}.enableTls": "true", f"{PEER}.certChainFile": "a", f"{PEER}.certPrivateKey": "b",
      f"{PEER}.mutualAuthEnable": "true"}, "trustCollectionCertFile"),
    ({"server.ssl.enabled": "true"}, "server.ssl.certificate"),
    ({"server.ssl.key-store": "keystore.p12"}, "PEM"),
    ({"server.ssl.certificate": "a", "server.ssl.certificate-private-key": "b", "server.ssl.client-auth": "need"},
     "server.ssl.trust-certificate"),
])
def test_incomplete_tls_settings_are_config_errors(overrides: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        Config.load(env={}, overrides=overrides)


def test_http_tls_follows_spring_boot_when_server_ssl_enabled_is_unset() -> None:
    assert not Config.load(env={}).http_tls_on
    assert Config.load(env={}, overrides={"server.ssl.certificate": "a",
                                          "server.ssl.certificate-private-key": "b"}).http_tls_on
    assert not Config.load(env={}, overrides={"server.ssl.enabled": "false", "server.ssl.certificate": "a",
                                              "server.ssl.certificate-private-key": "b"}).http_tls_on
