"""Nacos 3.3's secure defaults on real nodes started with no auth flag at all (:data:`SECURE`):
each API family (client, admin, console) refused without a login and served with one, each
switch turned off alone opening only its family (as ``-D``, the Docker variables and the
properties file), the first admin made over the v3 and v1 routes and with ``shoal users``, the
stock SDKs with and without credentials, and a three-node cluster on the defaults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from v2.nacos import ClientConfigBuilder, GRPCConfig, ListInstanceParam, NacosNamingService, RegisterInstanceParam
from v2.nacos.common.nacos_exception import NacosException as GrpcNacosException

from shoal.testing import (
    OPEN,
    SECURE,
    AuthMode,
    ServerProcess,
    free_port_block,
    http_get,
    kill,
    poll_until,
    start_server,
)
from shoal.testing.etcd import etcd_pids
from shoal.testing.http import call, call_json
from shoal.testing.nodes import IDENTITY, CpCluster
from shoal.testing.rawclient import RawClient

from .clients import runner
from .test_http_sdk import nacos_v1  # noqa: F401  (the 2.0.11 SDK fixture)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:nacos.*")

ADMIN_PW = "first-admin-pass"
SVC = {"serviceName": "secure-svc"}

#: One or more routes of each family, as (method, path, params); each answers 200 with a token.
FAMILIES: dict[str, list[tuple[str, str, dict[str, str]]]] = {
    "client": [("GET", "/nacos/v1/ns/instance/list", SVC), ("GET", "/nacos/v2/ns/instance/list", SVC),
               ("GET", "/nacos/v3/client/ns/instance/list", SVC),
               ("GET", "/nacos/v1/ns/service/list", {"pageNo": "1", "pageSize": "10"})],
    "admin": [("GET", "/nacos/v1/ns/operator/switches", {}), ("GET", "/nacos/v1/core/cluster/nodes", {}),
              ("GET", "/nacos/v3/admin/ns/instance/list", SVC), ("GET", "/nacos/v2/ns/client/list", {}),
              ("GET", "/nacos/v1/auth/users", {"pageNo": "1", "pageSize": "10"})],
    "console": [("GET", "/nacos/v1/ns/catalog/services", {"pageNo": "1", "pageSize": "10"}),
                ("GET", "/nacos/v1/console/cluster/distro", {})],
}
SWITCHES = {"client": "nacos.core.auth.enabled", "admin": "nacos.core.auth.admin.enabled",
            "console": "nacos.core.auth.console.enabled"}
RUST_AUTH = Path(__file__).parent / "clients" / "rust_auth.py"
DOCKER = {"client": "NACOS_AUTH_ENABLE", "admin": "NACOS_AUTH_ADMIN_ENABLE", "console": "NACOS_AUTH_CONSOLE_ENABLE"}


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory of nodes on the defaults (:data:`SECURE`) unless told; all killed at teardown."""
    started: list[ServerProcess] = []

    def factory(*args: str, env: dict[str, str] | None = None, auth: AuthMode = SECURE,
                port: int | None = None) -> ServerProcess:
        server = start_server(tmp_path, list(args), env=env, auth=auth, port=port)
        started.append(server)
        return server

    yield factory
    for server in started:
        kill(server)


def status_of(node: ServerProcess, method: str, path: str, params: dict[str, str], token: str = "") -> int:
    return call(method, node.url(path), {**params, **({"accessToken": token} if token else {})})[0]


def statuses(node: ServerProcess, token: str = "") -> dict[str, set[int]]:
    return {family: {status_of(node, *route, token=token) for route in routes} for family, routes in FAMILIES.items()}


def state(node: ServerProcess) -> dict[str, str]:
    return dict(call_json("GET", node.url("/nacos/v1/console/server/state")))


def v3_login(node: ServerProcess, username: str = "nacos", password: str = ADMIN_PW) -> str:
    answer = call_json("POST", node.url("/nacos/v3/auth/user/login"), data={"username": username,
                                                                            "password": password})
    return str(answer["accessToken"])


def test_a_default_node_serves_nothing_but_health_and_the_first_admin_until_one_exists(
        nodes: Callable[..., ServerProcess]) -> None:
    node = nodes()
    assert call("GET", node.url("/nacos/v1/console/health/liveness"))[0] == 200
    assert call("GET", node.url("/nacos/v1/console/health/readiness"))[0] == 200
    assert state(node)["auth_admin_request"] == "true"
    assert statuses(node) == {"client": {403}, "admin": {403}, "console": {403}}
    status, text = call("GET", node.url("/nacos/v1/ns/instance/list"), SVC)
    assert status == 403 and "no admin user yet" in text and "/nacos/v3/auth/user/admin" in text
    assert call("POST", node.url("/nacos/v1/auth/login"), data={"username": "nacos", "password": "nacos"})[0] == 403

    made = call_json("POST", node.url("/nacos/v3/auth/user/admin"), data={"password": ADMIN_PW})
    assert made["code"] == 0 and made["data"] == {"username": "nacos", "password": ADMIN_PW}
    again = call_json("POST", node.url("/nacos/v3/auth/user/admin"), data={"password": "another-one"})
    assert again["code"] == 409
    assert call("POST", node.url("/nacos/v1/auth/users/admin"), data={"password": "another-one"})[0] == 409
    assert state(node)["auth_admin_request"] == "false"

    token = v3_login(node)
    assert statuses(node) == {"client": {403}, "admin": {403}, "console": {403}}
    assert statuses(node, token) == {"client": {200}, "admin": {200}, "console": {200}}
    status, text = call("GET", node.url("/nacos/v1/ns/instance/list"), SVC)
    assert (status, text) == (403, "user not found!")  # Nacos's own refusal once an admin exists


def test_the_v1_first_admin_route_without_a_password_makes_a_random_one(nodes: Callable[..., ServerProcess]) -> None:
    node = nodes()
    made = call_json("POST", node.url("/nacos/v1/auth/users/admin"))
    assert made["username"] == "nacos" and len(made["password"]) >= 12 and made["password"] != "nacos"
    assert call("POST", node.url("/nacos/v1/auth/login"), data={"username": "nacos", "password": "nacos"})[0] == 403
    assert call("POST", node.url("/nacos/v1/auth/login"),
                data={"username": "nacos", "password": made["password"]})[0] == 200


@pytest.mark.parametrize("how", ["property", "docker", "file"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_switch_turned_off_alone_opens_only_its_family(nodes: Callable[..., ServerProcess], tmp_path: Path,
                                                            family: str, how: str) -> None:
    args: list[str] = []
    env: dict[str, str] = {}
    if how == "property":
        args = ["-D", f"{SWITCHES[family]}=false"]
    elif how == "docker":
        env = {DOCKER[family]: "false"}
    else:
        props = tmp_path / f"{family}.properties"
        props.write_text(f"{SWITCHES[family]}=false\n")
        args = ["--config", str(props)]
    node = nodes(*args, env=env)
    expected = {f: ({200} if f == family else {403}) for f in FAMILIES}
    assert statuses(node) == expected
    flags = {k: state(node)[k] for k in ("auth_enabled", "auth_admin_enabled", "login_page_enabled")}
    assert list(flags.values()).count("false") == 1


def test_auth_flag_turns_every_family_on_over_a_file_that_turns_them_off(nodes: Callable[..., ServerProcess],
                                                                         tmp_path: Path) -> None:
    props = tmp_path / "open.properties"
    props.write_text("".join(f"{switch}=false\n" for switch in SWITCHES.values()))
    assert statuses(nodes("--config", str(props))) == {"client": {200}, "admin": {200}, "console": {200}}
    assert statuses(nodes("--config", str(props), "--auth")) == {"client": {403}, "admin": {403}, "console": {403}}


def test_an_open_node_says_so_explicitly(nodes: Callable[..., ServerProcess]) -> None:
    node = nodes(auth=OPEN)
    assert statuses(node) == {"client": {200}, "admin": {200}, "console": {200}}
    assert state(node)["auth_admin_request"] == "false"


def test_the_first_admin_made_with_shoal_users_before_the_node_starts(nodes: Callable[..., ServerProcess],
                                                                     tmp_path: Path) -> None:
    port = free_port_block()
    secret = tmp_path / "admin.pw"
    secret.write_text(ADMIN_PW + "\n")
    done = subprocess.run([sys.executable, "-m", "shoal", "users", "create", "nacos", "--password-file", str(secret),
                           "--admin", "--data-dir", str(tmp_path / f"node-{port}")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert ADMIN_PW not in done.stdout + done.stderr
    node = nodes(port=port)
    assert state(node)["auth_admin_request"] == "false"
    assert statuses(node, v3_login(node)) == {"client": {200}, "admin": {200}, "console": {200}}


# --- stock clients against a default node ---------------------------------------------------------
async def grpc_client(node: ServerProcess, tmp_path: Path, **credentials: str) -> Any:
    builder = (ClientConfigBuilder().server_address(node.addr).log_level("WARNING")
               .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
               .grpc_config(GRPCConfig(grpc_timeout=5000)))
    if credentials:
        builder = builder.username(credentials["username"]).password(credentials["password"])
    return await NacosNamingService.create_naming_service(builder.build())


@pytest.fixture
def default_node(nodes: Callable[..., ServerProcess]) -> ServerProcess:
    """A node on the defaults whose first admin was made over the v1 route."""
    node = nodes()
    assert call_json("POST", node.url("/nacos/v1/auth/users/admin"), data={"password": ADMIN_PW})["username"] == "nacos"
    return node


async def test_sdk_python_3_grpc_with_credentials_works_and_without_gets_the_403(default_node: ServerProcess,
                                                                                 tmp_path: Path) -> None:
    good = await grpc_client(default_node, tmp_path, username="nacos", password=ADMIN_PW)
    anonymous = await grpc_client(default_node, tmp_path)
    try:
        assert await good.register_instance(RegisterInstanceParam(service_name="py3", ip="10.7.0.1", port=1))
        seen = await good.list_instances(ListInstanceParam(service_name="py3", subscribe=False, healthy_only=None))
        assert [i.ip for i in seen] == ["10.7.0.1"]
        with pytest.raises(GrpcNacosException) as refused:
            await anonymous.register_instance(RegisterInstanceParam(service_name="py3", ip="10.7.0.2", port=1))
        assert refused.value.error_code == 403 and "user not found!" in str(refused.value)
    finally:
        await good.shutdown()
        await anonymous.shutdown()


def test_sdk_python_2_http_with_credentials_works_and_without_gets_the_403(
        default_node: ServerProcess, nacos_v1: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    logs = str(tmp_path / "v1-logs")
    good = nacos_v1.NacosClient(default_node.addr, namespace="public", username="nacos", password=ADMIN_PW,
                                logDir=logs)
    assert good.add_naming_instance("py2", "10.7.1.1", 80)
    assert [h["ip"] for h in good.list_naming_instance("py2")["hosts"]] == ["10.7.1.1"]
    anonymous = nacos_v1.NacosClient(default_node.addr, namespace="public", logDir=logs)
    with pytest.raises(nacos_v1.NacosException, match="Insufficient privilege"):
        anonymous.add_naming_instance("py2", "10.7.1.2", 80)


def rust_flow(node: ServerProcess, tmp_path: Path, *credentials: str) -> dict[str, Any]:
    """The Rust SDK's register-and-read in a process of its own (clients/rust_auth.py)."""
    home = tmp_path / f"rust-home-{len(credentials)}"
    home.mkdir()
    driver = runner.rust_command(node.addr, "rust-auth")[0]  # the interpreter (and the binding's presence check)
    done = subprocess.run([driver, str(RUST_AUTH), node.addr, "rust-auth", *credentials], capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HOME": str(home), "NACOS_CLIENT_LOGGER_LEVEL": "WARN"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"rust_auth.py printed no JSON: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return dict(json.loads(lines[-1]))


def test_rust_sdk_with_credentials_works_and_without_is_refused(default_node: ServerProcess, tmp_path: Path) -> None:
    good = rust_flow(default_node, tmp_path, "nacos", ADMIN_PW)
    assert good["registered"] is True and good["hosts"] == ["10.7.2.1:8080"]
    anonymous = rust_flow(default_node, tmp_path)
    assert anonymous["registered"] is False and "403" in anonymous["error"]


def test_npm_nacos_with_credentials_works_and_without_gets_the_403(default_node: ServerProcess) -> None:
    good = runner.run_json(runner.npm_nacos_command(default_node.addr, "npm-auth", "nacos", ADMIN_PW))
    assert good == {"registered": True, "hosts": ["10.7.5.1:8080"]}
    anonymous = subprocess.run(runner.npm_nacos_command(default_node.addr, "npm-auth"), capture_output=True,
                               text=True, timeout=60, stdin=subprocess.DEVNULL)
    out = json.loads(anonymous.stdout.strip().splitlines()[-1])
    assert (out["registered"], out["status"]) == (False, 403)


# --- Nacos 3.3 clients configured with credentials, against a node with auth off -------
def login_as_a_3_3_client(node: ServerProcess, username: str, password: str) -> tuple[int, dict[str, Any]]:
    """The Nacos 3.3 Java client's login (no Java SDK runs here, so its sequence over plain HTTP):
    ``/nacos/v3/auth/user/login`` first, ``/nacos/v1/auth/users/login`` only when that is a 404."""
    form = {"username": username, "password": password}
    status, text = call("POST", node.url("/nacos/v3/auth/user/login"), data=form)
    if status == 404:
        status, text = call("POST", node.url("/nacos/v1/auth/users/login"), data=form)
    return status, json.loads(text) if status == 200 else {}


def test_the_3_3_login_sequence_on_a_node_with_auth_on_and_off(nodes: Callable[..., ServerProcess]) -> None:
    secure = nodes()
    assert call_json("POST", secure.url("/nacos/v3/auth/user/admin"), data={"password": ADMIN_PW})["code"] == 0
    status, answer = login_as_a_3_3_client(secure, "nacos", ADMIN_PW)
    assert status == 200 and answer["globalAdmin"] is True
    assert status_of(secure, "GET", "/nacos/v1/ns/instance/list", SVC, str(answer["accessToken"])) == 200
    assert login_as_a_3_3_client(secure, "nacos", "wrong")[0] == 403
    open_node = nodes(auth=OPEN)
    status, answer = login_as_a_3_3_client(open_node, "nacos", ADMIN_PW)  # no such user there
    assert status == 200 and answer["accessToken"] == ""
    assert status_of(open_node, "GET", "/nacos/v1/ns/instance/list", SVC) == 200


# --- stock SDKs configured with credentials, against a node with auth off --------------
async def test_clients_with_credentials_keep_working_against_an_open_node(
        nodes: Callable[..., ServerProcess], nacos_v1: ModuleType, tmp_path: Path) -> None:  # noqa: F811
    """An SDK configured with a username and password logs in first; on a node with auth off
    (that user unknown there) the failed login must not stop its calls."""
    node = nodes(auth=OPEN)
    py3 = await grpc_client(node, tmp_path, username="deployer", password="not-on-this-node")
    try:
        assert await py3.register_instance(RegisterInstanceParam(service_name="open-py3", ip="10.7.4.1", port=1))
        seen = await py3.list_instances(ListInstanceParam(service_name="open-py3", subscribe=False, healthy_only=None))
        assert [i.ip for i in seen] == ["10.7.4.1"]
    finally:
        await py3.shutdown()
    py2 = nacos_v1.NacosClient(node.addr, namespace="public", username="deployer", password="not-on-this-node",
                               logDir=str(tmp_path / "v1-logs"))
    assert py2.add_naming_instance("open-py2", "10.7.4.2", 80)
    assert [h["ip"] for h in py2.list_naming_instance("open-py2")["hosts"]] == ["10.7.4.2"]
    rust = rust_flow(node, tmp_path, "deployer", "not-on-this-node")
    assert rust["registered"] is True and rust["hosts"] == ["10.7.2.1:8080"]
    npm = runner.run_json(runner.npm_nacos_command(node.addr, "open-npm", "deployer", "not-on-this-node"))
    assert npm == {"registered": True, "hosts": ["10.7.5.1:8080"]}


# --- a cluster on the defaults ----------------------------------------------------------------------
TOKEN_KEY = "c2hvYWwtdGVzdC10b2tlbi1rZXktb2YtMzItYnl0ZXMtb3ItbW9yZQ=="


def secrets_leaked(node: ServerProcess, secrets: list[str]) -> list[str]:
    """Where any of ``secrets`` shows: the command lines and environments of the node's managed
    etcd member, the node's log and the member's log."""
    found = []
    for pid in etcd_pids(node.data_dir):
        for what in ("cmdline", "environ"):
            text = Path(f"/proc/{pid}/{what}").read_bytes().decode(errors="replace")
            found += [f"etcd {pid} {what}: {s[:6]}..." for s in secrets if s in text]
    for log in (node.log_path, node.data_dir / "cp" / "etcd.log"):
        text = log.read_text(errors="replace") if log.exists() else ""
        found += [f"{log.name}: {s[:6]}..." for s in secrets if s in text]
    return found


async def test_three_nodes_on_the_defaults_share_the_first_admin_and_refuse_anonymous_calls(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text(f"nacos.core.auth.plugin.nacos.token.secret.key={TOKEN_KEY}\n")
    cluster = CpCluster(tmp_path, 3, ["--config", str(props)], auth=SECURE)
    try:
        cluster.start_all()
        a, b, c = (cluster.node(i) for i in range(3))
        stranger = RawClient(a.cluster_port)  # the cluster port wants the shared identity
        try:
            kind, body = await stranger.call("MemberReportRequest", {"node": {"ip": "127.0.0.1", "port": b.port}},
                                             headers={"shoal-member": b.addr})
            assert kind == "ErrorResponse" and body["errorCode"] == 403
        finally:
            await stranger.close()
        assert all(statuses(node) == {"client": {403}, "admin": {403}, "console": {403}} for node in (a, b, c))
        assert call_json("POST", a.url("/nacos/v3/auth/user/admin"), data={"password": ADMIN_PW})["code"] == 0
        token = poll_until(lambda: call("POST", b.url("/nacos/v3/auth/user/login"),
                                        data={"username": "nacos", "password": ADMIN_PW}), 20,
                           what="the admin made on A to log in on B")
        assert token[0] == 200
        assert call_json("POST", c.url("/nacos/v3/auth/user/admin"), data={"password": "x-y-z-w"})["code"] == 409
        b_token = json.loads(token[1])["accessToken"]
        register = {"serviceName": "on-defaults", "ip": "10.7.3.1", "port": "80", "accessToken": b_token}
        assert call("POST", a.url("/nacos/v1/ns/instance"), register) == (200, "ok")  # B's token on A
        query = urllib.parse.urlencode({"serviceName": "on-defaults", "accessToken": b_token})
        poll_until(lambda: "10.7.3.1" in call("GET", c.url(f"/nacos/v1/ns/instance/list?{query}"))[1], 20,
                   what="the instance registered on A to be listed on C")
        assert call("GET", c.url("/nacos/v1/ns/instance/list"), {"serviceName": "on-defaults"})[0] == 403
        # the credentials stay off the managed etcd members' command lines and out of the logs
        identity_value = IDENTITY[IDENTITY.index("-D", 1) + 1].partition("=")[2]
        assert [leak for node in (a, b, c) for leak in secrets_leaked(node, [TOKEN_KEY, identity_value, ADMIN_PW])
                ] == []
    finally:
        cluster.stop_all()


# --- make serve on a fresh checkout -------------------------------------------------------------------
def test_make_serve_prints_how_to_make_the_first_admin_and_the_node_follows_it(tmp_path: Path) -> None:
    """The README's first command: a working node that says how to make the first admin (and how
    to run open), and the printed call makes it."""
    repo = Path(__file__).resolve().parents[2]
    port = free_port_block()
    # -o: take the installed venv as it is (the test suite's own); only the serve recipe runs
    make = subprocess.Popen(["make", "-s", "-o", ".venv/.installed-node", "serve",
                             f"ARGS=--host 127.0.0.1 --port {port} --data-dir {tmp_path / 'data'}"],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    try:
        assert make.stdout is not None
        printed = [make.stdout.readline(), make.stdout.readline()]
        [first_admin] = [line for line in printed if "first admin" in line]
        [open_run] = [line for line in printed if "open for local development" in line]
        assert "/nacos/v3/auth/user/admin" in first_admin and "/nacos/" in first_admin
        assert all(f"{switch}=false" in open_run for switch in SWITCHES.values())
        base = f"http://127.0.0.1:{port}"
        def ready() -> bool:
            if make.poll() is not None:
                raise AssertionError(f"make serve exited {make.returncode}")
            try:
                return http_get(f"{base}/nacos/v1/console/health/readiness", 0.5)[0] == 200
            except OSError:
                return False

        poll_until(ready, 30, what="the node make serve started")
        assert call("GET", f"{base}/nacos/v1/ns/instance/list", SVC)[0] == 403
        made = call_json("POST", f"{base}/nacos/v3/auth/user/admin", data={"password": ADMIN_PW})
        assert made["code"] == 0
        login = call_json("POST", f"{base}/nacos/v1/auth/login", data={"username": "nacos", "password": ADMIN_PW})
        assert call("GET", f"{base}/nacos/v1/ns/instance/list", {**SVC, "accessToken": login["accessToken"]})[0] == 200
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        try:
            make.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
