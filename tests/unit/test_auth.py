"""Auth pieces without sockets: tokens, the signing key file, the user store, the login limiter,
the service's checks (HTTP and gRPC filter) and the ``shoal users`` command."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from shoal.__main__ import main
from shoal.auth.service import AuthService, Identity, LoginLimiter, TooManyLogins, name_matcher, naming_resource
from shoal.auth.store import UserStore, check_password, hash_password
from shoal.auth.tokens import TokenManager, load_or_create_secret
from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.errors import ConfigError, Forbidden, InvalidParam

KEY = b"k" * 32


class Now:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def test_token_round_trip_is_a_compact_hs256_jwt() -> None:
    tokens = TokenManager(KEY, 18000, Now())
    token = tokens.create("nacos")
    header, payload, _sig = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "HS256"}
    assert json.loads(base64.urlsafe_b64decode(payload + "==")) == {"sub": "nacos", "exp": 1_700_018_000}
    assert tokens.username_of(token) == "nacos"


def test_token_past_its_ttl_is_refused() -> None:
    now = Now()
    tokens = TokenManager(KEY, 60, now)
    token = tokens.create("u")
    now.t += 59
    assert tokens.username_of(token) == "u"
    now.t += 1
    with pytest.raises(Forbidden, match="token expired!"):
        tokens.username_of(token)


@pytest.mark.parametrize("mangle", [
    lambda t: t + "x",
    lambda t: t.replace(".", "", 1),
    lambda t: "a.b.c",
    lambda t: "",
    lambda t: TokenManager(b"z" * 32, 60, Now()).create("u"),  # signed with another key
    lambda t: t.split(".")[0] + "." + base64.urlsafe_b64encode(b'{"sub":"admin","exp":9999999999}').decode()
    .rstrip("=") + "." + t.split(".")[2],  # forged claims
])
def test_tampered_tokens_are_invalid(mangle: Any) -> None:
    tokens = TokenManager(KEY, 60, Now())
    with pytest.raises(Forbidden, match="token invalid!"):
        tokens.username_of(mangle(tokens.create("u")))


def test_a_token_with_a_hostile_header_is_invalid_not_a_crash() -> None:
    # the header is parsed before the signature is checked: 50,000 levels of nesting in it hit the
    # JSON parser's recursion limit, which is no ValueError
    header = base64.urlsafe_b64encode(b'{"a":' * 50_000 + b"1" + b"}" * 50_000).decode().rstrip("=")
    with pytest.raises(Forbidden, match="token invalid!"):
        TokenManager(KEY, 60, Now()).username_of(f"{header}.e30.c2ln")


def test_signing_key_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    auth_dir = tmp_path / "auth"
    key = load_or_create_secret(auth_dir, "")
    path = auth_dir / "token.secret.key"
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_secret(auth_dir, "") == key  # kept across restarts
    assert [p.name for p in auth_dir.iterdir()] == ["token.secret.key"]  # no temp file left


def test_configured_key_is_used_and_checked(tmp_path: Path) -> None:
    good = base64.b64encode(b"s" * 40).decode()
    assert load_or_create_secret(tmp_path, good) == b"s" * 40
    assert not (tmp_path / "token.secret.key").exists()
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        load_or_create_secret(tmp_path, base64.b64encode(b"short").decode())
    with pytest.raises(ConfigError, match="not valid Base64"):
        load_or_create_secret(tmp_path, "***")


def test_store_permissions_match_namespace_patterns(tmp_path: Path) -> None:
    store = UserStore.in_dir(tmp_path)
    store.add_user("dev", "x")
    store.add_role("developer", "dev")
    store.add_permission("developer", "dev-ns:*:*", "rw")
    store.add_permission("developer", "public:*:*", "r")
    assert store.allowed("dev", naming_resource("dev-ns", "G", "svc"), "w")
    assert store.allowed("dev", naming_resource("public", "", "svc"), "r")
    assert not store.allowed("dev", naming_resource("public", "", "svc"), "w")
    assert not store.allowed("dev", naming_resource("dev-ns2", "G", "svc"), "r")
    assert not store.allowed("nobody", naming_resource("dev-ns", "G", "svc"), "r")
    with pytest.raises(InvalidParam, match="action"):
        store.add_permission("developer", "x", "x")


def test_store_file_is_private_and_round_trips(tmp_path: Path) -> None:
    store = UserStore.in_dir(tmp_path / "auth")
    store.add_user("nacos", hash_password("pw"))
    store.grant_admin("nacos")
    store.save()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    again = UserStore.in_dir(tmp_path / "auth")
    again.load()
    assert again.is_global_admin("nacos") and check_password("pw", again.users["nacos"])
    assert not check_password("other", again.users["nacos"])
    with pytest.raises(InvalidParam, match="cannot delete admin"):
        again.delete_user("nacos")


def test_limiter_refuses_a_source_after_repeated_failures_until_the_window_passes() -> None:
    now = [0]
    limiter = LoginLimiter(3, 60_000, lambda: now[0])
    for _ in range(3):
        limiter.check("1.2.3.4")
        limiter.failed("1.2.3.4")
    with pytest.raises(TooManyLogins, match="retry in 60 s"):
        limiter.check("1.2.3.4")
    limiter.check("5.6.7.8")  # other sources are not affected
    now[0] = 60_000
    limiter.check("1.2.3.4")


def auth_service(tmp_path: Path, **overrides: Any) -> AuthService:
    config = dataclasses.replace(Config(), data_dir=str(tmp_path), **{"auth_enabled": True, **overrides}).validate()
    return AuthService(config)


async def test_login_issues_a_token_and_failures_are_rate_limited(tmp_path: Path) -> None:
    auth = auth_service(tmp_path, auth_login_max_failures=2)
    await auth.start()
    await auth.create_user("alice", "secret")
    answer = await auth.login("alice", "secret", "10.0.0.1")
    assert answer["tokenTtl"] == 18000 and answer["globalAdmin"] is False and answer["username"] == "alice"
    assert auth.identity(answer["accessToken"]) == Identity("alice", False)
    for _ in range(2):
        with pytest.raises(Forbidden, match="unknown user!"):
            await auth.login("alice", "wrong", "10.0.0.2")
    with pytest.raises(TooManyLogins):
        await auth.login("alice", "secret", "10.0.0.2")
    assert (await auth.login("alice", "secret", "10.0.0.3"))["username"] == "alice"


async def test_first_admin_only_once(tmp_path: Path) -> None:
    auth = auth_service(tmp_path)
    await auth.start()
    created = await auth.create_admin("")
    assert created["username"] == "nacos" and len(created["password"]) >= 12
    assert (await auth.login("nacos", created["password"], "x"))["globalAdmin"] is True
    with pytest.raises(Exception, match="have admin user cannot use it") as info:
        await auth.create_admin("another")
    assert getattr(info.value, "code", None) == 409


class Ctx:
    def __init__(self, token: str) -> None:
        self.headers = {"accesstoken": token}

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


async def test_grpc_filter_checks_token_and_namespace_permission(tmp_path: Path) -> None:
    auth = auth_service(tmp_path)
    await auth.start()
    await auth.create_user("bob", "pw")
    await auth.add_role("readers", "bob")
    await auth.add_permission("readers", "public:*:*", "r")
    token = (await auth.login("bob", "pw", "x"))["accessToken"]
    body = {"namespace": "public", "groupName": "DEFAULT_GROUP", "serviceName": "svc"}
    auth.check_request(Ctx(token), "SubscribeServiceRequest", body)
    with pytest.raises(Forbidden, match="authorization failed!"):
        auth.check_request(Ctx(token), "InstanceRequest", body)
    with pytest.raises(Forbidden, match="user not found!"):
        auth.check_request(Ctx(""), "ServiceQueryRequest", body)
    auth.check_request(Ctx(""), "HealthCheckRequest", {})  # not a naming request: unchecked
    auth.check_setup({})  # SDKs send no token on ConnectionSetupRequest
    with pytest.raises(Forbidden):
        auth.check_setup({"accesstoken": "bad"})


async def test_clients_sending_username_and_password_on_each_call(tmp_path: Path) -> None:
    auth = auth_service(tmp_path)
    await auth.start()
    await auth.create_user("carol", "pw")
    assert (await auth.identity_from_credentials("carol", "pw", "x")).username == "carol"
    assert (await auth.identity_from_credentials("carol", "pw", "x")).username == "carol"  # cached
    with pytest.raises(Forbidden):
        await auth.identity_from_credentials("carol", "nope", "x")


async def test_users_commands_work_on_the_store_a_node_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    store = ["--data-dir", str(tmp_path)]
    assert await asyncio.to_thread(main, ["users", "create", "ops", "--password-file", str(pw), *store, "--admin"]) == 0
    assert "ROLE_ADMIN" in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["users", "create", "dev", "--password-file", str(pw), *store,
                                          "--role", "devs"]) == 0
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["users", "list", *store]) == 0
    assert capsys.readouterr().out.splitlines() == ["dev\tdevs", "ops\tROLE_ADMIN"]
    assert await asyncio.to_thread(main, ["users", "create", "ops", "--password-file", str(pw), *store]) == 2
    assert "already exist" in capsys.readouterr().err
    # a node on this data dir knows them, and sees a password changed meanwhile at the next login
    auth = auth_service(tmp_path)
    await auth.start()
    assert (await auth.login("ops", "s3cret", "x"))["globalAdmin"] is True
    pw.write_text("n3w\n")
    assert await asyncio.to_thread(main, ["users", "passwd", "dev", "--password-file", str(pw), *store]) == 0
    assert (await auth.login("dev", "n3w", "x"))["username"] == "dev"
    assert await asyncio.to_thread(main, ["users", "delete", "ops", *store]) == 2  # an admin stays
    assert "cannot delete admin" in capsys.readouterr().err
    assert await asyncio.to_thread(main, ["users", "delete", "dev", *store]) == 0
    with pytest.raises(Forbidden):
        await auth.login("dev", "n3w", "y")
    capsys.readouterr()
    await auth.stop()
    assert await asyncio.to_thread(main, ["users", "list", *store]) == 0
    assert capsys.readouterr().out.splitlines() == ["ops\tROLE_ADMIN"]
    assert await asyncio.to_thread(main, ["users", "passwd", "nobody", "--password-file", str(pw), *store]) == 2
    pw.write_text("")
    assert await asyncio.to_thread(main, ["users", "create", "x", "--password-file", str(pw), *store]) == 2
    assert "password" in capsys.readouterr().err


async def test_a_node_user_file_is_imported_once_into_the_store(tmp_path: Path) -> None:
    old = UserStore.in_dir(tmp_path / "auth")
    old.add_user("legacy", hash_password("pw"))
    old.add_role("devs", "legacy")
    old.add_permission("devs", "dev:*:*", "rw")
    old.save()
    auth = auth_service(tmp_path)
    await auth.start()
    assert not old.path.exists() and old.path.with_name("users.json.imported").exists()
    token = (await auth.login("legacy", "pw", "x"))["accessToken"]
    auth.authorize(auth.identity(token), naming_resource("dev", "G", "s"), "w")
    await auth.delete_user("legacy")
    await auth.stop()
    again = auth_service(tmp_path)  # restarted: the renamed file is not imported a second time
    await again.start()
    assert not again.data.has_user("legacy") and again.data.permissions()
    await again.stop()


async def test_token_key_is_one_per_store_and_a_configured_key_wins(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "shared.sqlite3")
    await store.start()
    a, b = auth_service(tmp_path / "a"), auth_service(tmp_path / "b")
    await a.start(store)
    await b.start(store)
    await a.create_user("u", "pw")
    token = (await a.login("u", "pw", "x"))["accessToken"]
    assert b.identity(token).username == "u"  # another node of the cluster accepts it
    configured = auth_service(tmp_path / "c", auth_token_secret_key=base64.b64encode(KEY).decode())
    await configured.start(store)
    with pytest.raises(Forbidden, match="token invalid!"):
        configured.identity(token)
    for auth in (a, b, configured):
        await auth.stop()
    await store.close()


async def test_a_node_key_file_becomes_the_first_cluster_key(tmp_path: Path) -> None:
    key = load_or_create_secret(tmp_path / "auth", "")
    auth = auth_service(tmp_path)
    await auth.start()
    assert auth.tokens.username_of(TokenManager(key, 60, time.time).create("u")) == "u"
    await auth.stop()


@pytest.mark.parametrize(("fragment", "name", "matches"), [
    ("", "anyone", True), ("ali", "alice", True), ("ALI", "alice", True), ("ice", "alice", True),
    ("a*e", "alice", True), ("a*z", "alice", False), ("*", "x", True), ("_", "ROLE_ADMIN", True),
    ("_", "admin", False), ("%", "admin", False), (".*", "admin", False), ("[a]", "admin", False),
    ("x" * 257, "x" * 300, False),
])
def test_search_matches_like_nacos_sql_like(fragment: str, name: str, matches: bool) -> None:
    assert name_matcher(fragment)(name) is matches


async def test_a_failed_login_while_the_client_apis_are_open_is_an_empty_token(tmp_path: Path) -> None:
    auth = auth_service(tmp_path, auth_enabled=False)  # admin and console APIs still need a login
    await auth.start()
    await auth.create_user("alice", "secret")
    answer = await auth.login("deployer", "elsewhere", "10.0.0.1")
    assert answer == {"accessToken": "", "tokenTtl": 18000, "globalAdmin": False, "username": "deployer"}
    assert auth.identity((await auth.login("alice", "secret", "10.0.0.1"))["accessToken"]).username == "alice"
    with pytest.raises(Forbidden, match="user not found!"):
        auth.identity(answer["accessToken"])
    secure = auth_service(tmp_path / "secure")
    await secure.start()
    await secure.create_user("alice", "secret")
    with pytest.raises(Forbidden, match="unknown user!"):
        await secure.login("deployer", "elsewhere", "10.0.0.1")


def test_the_start_up_line_names_open_and_guarded_families_and_warns_on_open_admin_apis(tmp_path: Path) -> None:
    secure, exposed = auth_service(tmp_path).exposure()
    assert not exposed and "open to anyone on no API" in secure
    local, exposed = auth_service(tmp_path, auth_admin_enabled=False, host="127.0.0.1").exposure()
    assert not exposed and "admin (nacos.core.auth.admin.enabled)" in local.partition("open to anyone on")[2]
    _line, exposed = auth_service(tmp_path, auth_admin_enabled=False, host="0.0.0.0").exposure()
    assert exposed
    _line, exposed = auth_service(tmp_path, auth_enabled=False, auth_console_enabled=False, host="10.1.2.3").exposure()
    assert not exposed  # open client and console APIs are a choice; open admin APIs on the network are warned of
