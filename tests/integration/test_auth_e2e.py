"""Auth on a real `shoal server --auth`: users made with `shoal users create`, the HTTP (1.x SDK)
and gRPC (3.x SDK) clients with username/password, refusals without credentials, token expiry,
and the signing key file."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from v2.nacos import ClientConfigBuilder, GRPCConfig, ListInstanceParam, NacosNamingService, RegisterInstanceParam
from v2.nacos.common.nacos_exception import NacosException as GrpcNacosException

from shoal.testing import ServerProcess, kill, poll_until
from shoal.testing.auth import PASSWORD, start_with_admin
from shoal.testing.http import call

from .test_http_sdk import nacos_v1  # noqa: F401  (the 1.x SDK fixture)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:nacos.*")


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Starts `shoal server --auth` on a data dir where `shoal users create` made an admin."""
    started: list[ServerProcess] = []

    def factory(*args: str) -> ServerProcess:
        server = start_with_admin(tmp_path, *args)
        started.append(server)
        return server

    yield factory
    for server in started:
        kill(server)


async def grpc_client(server: ServerProcess, tmp_path: Path, **credentials: str) -> Any:
    builder = (ClientConfigBuilder().server_address(server.addr).log_level("WARNING")
               .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
               .grpc_config(GRPCConfig(grpc_timeout=5000)))
    if credentials:
        builder = builder.username(credentials["username"]).password(credentials["password"])
    return await NacosNamingService.create_naming_service(builder.build())


def test_the_store_holding_users_and_the_token_key_is_private(auth_server: Callable[..., ServerProcess]) -> None:
    server = auth_server()
    store = server.data_dir / "cp" / "store.sqlite3"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    assert not (server.data_dir / "auth" / "token.secret.key").exists()  # the key is in the store
    assert all(PASSWORD.encode() not in path.read_bytes() for path in store.parent.glob("store.sqlite3*"))


def test_http_client_with_credentials_works_and_without_is_refused(
        auth_server: Callable[..., ServerProcess], nacos_v1: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    server = auth_server()
    logs = str(tmp_path / "v1-logs")
    good = nacos_v1.NacosClient(server.addr, namespace="public", username="nacos", password=PASSWORD, logDir=logs)
    assert good.add_naming_instance("secured", "10.5.0.1", 80)
    assert [h["ip"] for h in good.list_naming_instance("secured")["hosts"]] == ["10.5.0.1"]
    anonymous = nacos_v1.NacosClient(server.addr, namespace="public", logDir=logs)
    with pytest.raises(nacos_v1.NacosException, match="Insufficient privilege"):
        anonymous.add_naming_instance("secured", "10.5.0.2", 80)
    with pytest.raises(nacos_v1.NacosException, match="Insufficient privilege"):
        anonymous.list_naming_instance("secured")
    status, text = call("POST", server.url("/nacos/v1/auth/login"), {"username": "nacos", "password": "nope"})
    assert (status, text) == (403, "unknown user!")


async def test_grpc_client_with_credentials_works_and_without_is_refused(
        auth_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = auth_server()
    good = await grpc_client(server, tmp_path, username="nacos", password=PASSWORD)
    anonymous = await grpc_client(server, tmp_path)
    try:
        assert await good.register_instance(RegisterInstanceParam(service_name="g-secured", ip="10.6.0.1", port=1))
        seen = await good.list_instances(ListInstanceParam(service_name="g-secured", subscribe=False,
                                                           healthy_only=None))
        assert [i.ip for i in seen] == ["10.6.0.1"]
        with pytest.raises(GrpcNacosException) as refused:
            await anonymous.register_instance(RegisterInstanceParam(service_name="g-secured", ip="10.6.0.2", port=1))
        assert "user not found!" in str(refused.value)
    finally:
        await good.shutdown()
        await anonymous.shutdown()


def test_token_past_its_ttl_is_refused(auth_server: Callable[..., ServerProcess]) -> None:
    server = auth_server("-D", "nacos.core.auth.plugin.nacos.token.expire.seconds=2")
    status, text = call("POST", server.url("/nacos/v1/auth/users/login"), {"username": "nacos", "password": PASSWORD})
    answer = json.loads(text)
    assert status == 200 and answer["tokenTtl"] == 2 and answer["globalAdmin"] is True
    listing = {"serviceName": "any", "accessToken": answer["accessToken"]}
    assert call("GET", server.url("/nacos/v1/ns/instance/list"), listing)[0] == 200
    poll_until(lambda: call("GET", server.url("/nacos/v1/ns/instance/list"), listing) == (403, "token expired!"),
               10, 0.1, "the token to expire")


def test_failed_logins_are_rate_limited(auth_server: Callable[..., ServerProcess]) -> None:
    server = auth_server("-D", "shoal.auth.login.max-failures=3")
    for _ in range(3):
        assert call("POST", server.url("/nacos/v1/auth/login"), {"username": "nacos", "password": "x"})[0] == 403
    status, text = call("POST", server.url("/nacos/v1/auth/login"), {"username": "nacos", "password": PASSWORD})
    assert status == 429 and "too many failed logins" in text
