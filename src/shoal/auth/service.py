"""The auth use cases: login, identities from tokens, permission checks, user administration.

Transport-neutral: the HTTP routes and the gRPC request filter call these; failures are
``Forbidden`` (403, Nacos's messages ``user not found!`` / ``token invalid!`` / ``token
expired!`` / ``authorization failed!``), ``InvalidParam`` (400) or ``TooManyLogins`` (429).
bcrypt work runs in the executor (at most two at a time, so a login storm cannot starve the
loop's executor), and failed logins are rate-limited per source ip. Users, roles, permissions
and the token key come from the CP store (:mod:`shoal.auth.cpdata`), shared by every node.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shoal.auth.cpdata import IMPORTED_SUFFIX, AuthData, local_key_file
from shoal.auth.ldap import LDAP_PREFIX, LdapDirectory
from shoal.auth.store import (
    DEFAULT_ADMIN,
    DUMMY_HASH,
    GLOBAL_ADMIN_ROLE,
    USERS_FILE,
    check_password,
    hash_password,
    validate_password,
    validate_role,
    validate_username,
)
from shoal.auth.tokens import TokenManager, decode_secret
from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import CpStore, Keyspace
from shoal.errors import Conflict, CpUnavailable, Forbidden, InvalidParam, TooManyRequests
from shoal.model.keys import DEFAULT_GROUP, normalise_namespace
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

READ, WRITE = "r", "w"
_MAX_SOURCES = 10_000
_CREDENTIAL_CACHE_MAX = 1024


#: Longest search fragment looked at; a longer one matches nothing (no name is that long).
SEARCH_MAX_CHARS = 256


def name_matcher(fragment: str) -> Callable[[str], bool]:
    """Nacos's user and role search (``findUserLikeUsername`` / ``findRolesLikeRoleName``): SQL
    ``LIKE '%fragment%'``, where ``*`` in the fragment is a wildcard (``generateLikeArgument``).
    Case-insensitive, as on Nacos's MySQL store; an empty fragment matches every name; every other
    character stands for itself."""
    if len(fragment) > SEARCH_MAX_CHARS:
        return lambda _name: False
    pattern = re.compile(".*".join(re.escape(part) for part in fragment.split("*")), re.IGNORECASE | re.DOTALL)
    return lambda name: pattern.search(name) is not None


class TooManyLogins(TooManyRequests):
    """Too many failed logins from one source: refused for a while (429)."""


class AdminExists(Conflict):
    """``POST /v1/auth/users/admin`` when an admin already exists (409)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is from once its token or credentials check out (Nacos ``NacosUser``):
    the user name and whether it is a global admin, which passes every permission check."""

    username: str
    global_admin: bool


def naming_resource(namespace: str, group: str, service: str) -> str:
    """The resource a naming call touches, as permissions match it: ``ns:group:naming/svc``."""
    return f"{normalise_namespace(namespace)}:{group or DEFAULT_GROUP}:naming/{service}"


class LoginLimiter:
    """Sliding window of failed logins per source ip; a source at the limit is refused until
    its oldest failure leaves the window. Memory is bounded (oldest sources are forgotten)."""

    def __init__(self, max_failures: int, window_ms: int, now_ms: Callable[[], int]) -> None:
        self.max_failures = max_failures
        self.window_ms = window_ms
        self._now_ms = now_ms
        self._failures: OrderedDict[str, deque[int]] = OrderedDict()

    def check(self, source: str) -> None:
        failures = self._failures.get(source)
        if failures is None:
            return
        now = self._now_ms()
        while failures and now - failures[0] >= self.window_ms:
            failures.popleft()
        if not failures:
            del self._failures[source]
        elif len(failures) >= self.max_failures:
            retry_s = max(1, (failures[0] + self.window_ms - now + 999) // 1000)
            raise TooManyLogins(f"too many failed logins from {source}; retry in {retry_s} s")

    def failed(self, source: str) -> None:
        failures = self._failures.get(source)
        if failures is None:
            if len(self._failures) >= _MAX_SOURCES:
                self._failures.popitem(last=False)
            failures = self._failures[source] = deque(maxlen=self.max_failures)
        failures.append(self._now_ms())

    def succeeded(self, source: str) -> None:
        self._failures.pop(source, None)


class HasHeaders(Protocol):
    """What the gRPC request filter needs from a call's context: its merged headers, looked up by
    name (the gRPC server's ``RequestContext`` provides it), so auth never imports a transport."""

    def header(self, name: str, default: str = "") -> str: ...


# gRPC request types and the action Nacos's @Secured gives their handlers.
GRPC_ACTIONS = {
    "InstanceRequest": WRITE, "BatchInstanceRequest": WRITE, "PersistentInstanceRequest": WRITE,
    "ServiceQueryRequest": READ, "SubscribeServiceRequest": READ, "ServiceListRequest": READ,
    "NamingFuzzyWatchRequest": READ,
}


#: The API families Nacos 3.x guards with a switch each (docs/protocol.md §5.6).
CLIENT, ADMIN_APIS, CONSOLE = "client", "admin", "console"

#: What a refused request is told while the node has no admin user yet.
FIRST_ADMIN_HINT = ("no admin user yet: create the first one (POST /nacos/v3/auth/user/admin with the form field "
                    "password, the console's first page, or `shoal users create nacos --admin --password-file FILE`)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is reachable only from this machine."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class AuthService:
    """Auth for one node. ``guards(family)`` decides whether an API family is checked
    (``nacos.core.auth.enabled`` / ``.admin.enabled`` / ``.console.enabled``; ``enabled`` is the
    client family's, the gRPC SDK port's); the login and user endpoints work either way (as in Nacos).

    Users, roles, permissions and the token key live in the node's CP store (:class:`AuthData`),
    so every node of a cluster knows the same users and accepts the same tokens. A configured
    ``nacos.core.auth.plugin.nacos.token.secret.key`` wins over the stored key.
    """

    def __init__(self, config: Config, now_s: Callable[[], float] = time.time,
                 monotonic_ms: Callable[[], int] | None = None) -> None:
        self.config = config
        self.enabled = config.auth_enabled
        self._guarded = {CLIENT: config.auth_enabled, ADMIN_APIS: config.auth_admin_enabled,
                         CONSOLE: config.auth_console_enabled}
        self.auth_dir = Path(config.data_dir) / "auth"
        self._data: AuthData | None = None
        self._own_store: CpStore | None = None
        self._now_s = now_s
        self._monotonic_ms = monotonic_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.limiter = LoginLimiter(config.auth_login_max_failures, config.auth_login_failure_window_ms,
                                    self._monotonic_ms)
        self._tokens: TokenManager | None = None
        self._bcrypt_slots: asyncio.Semaphore | None = None
        self._credential_key = secrets.token_bytes(32)
        self._credentials: OrderedDict[bytes, tuple[str, int]] = OrderedDict()
        self._preparing: asyncio.Task[None] | None = None
        self._ldap = LdapDirectory(config) if config.auth_system_type.lower() == "ldap" else None

    def guards(self, family: str) -> bool:
        """Whether requests of an API family (:data:`CLIENT`, :data:`ADMIN_APIS`, :data:`CONSOLE`)
        need a login."""
        return self._guarded[family]

    def exposure(self) -> tuple[str, bool]:
        """The start-up line saying which API families are open and which need a login, and
        whether it is a warning (open admin APIs on an address other hosts reach)."""
        names = {CLIENT: "client (nacos.core.auth.enabled)", ADMIN_APIS: "admin (nacos.core.auth.admin.enabled)",
                 CONSOLE: "console (nacos.core.auth.console.enabled)"}
        guarded = [names[f] for f, on in self._guarded.items() if on]
        open_ = [names[f] for f, on in self._guarded.items() if not on]
        line = (f"auth: login required on {', '.join(guarded) or 'no API'}; "
                f"open to anyone on {', '.join(open_) or 'no API'}")
        if self.config.auth_system_type.lower() == "ldap":
            line += f"; logins checked against LDAP {self.config.ldap_url} first"
        exposed = not self._guarded[ADMIN_APIS] and not is_loopback(self.config.host)
        if exposed:
            line += (f"; WARNING: the admin APIs are open on {self.config.host}, which other hosts reach: "
                     "anyone there can change instances, switches and users")
        return line, exposed

    def needs_first_admin(self) -> bool:
        """Whether some API family needs a login but no admin user exists yet (Nacos's
        ``auth_admin_request``: the console then asks for the first admin's password)."""
        data = self._data
        return self.config.any_auth and data is not None and data.ready and not data.has_admin()

    def refusal(self) -> Forbidden:
        """What a request without a login is told: Nacos's ``user not found!``, or how to create
        the first admin while the node has no users at all."""
        first = self.needs_first_admin() and not self.data.usernames()
        return Forbidden(FIRST_ADMIN_HINT if first else "user not found!")

    async def start(self, store: CpStore | None = None, wait_s: float | None = None) -> None:
        """Read users from ``store`` (the node's CP store; None = an embedded store of its own in
        the data dir), import a per-node user file once, and get the token key.

        Waits up to ``wait_s`` (default: the load timeout; 0 = not at all, see :meth:`wait_ready`)
        for the store; if it has no quorum yet, the rest happens in the background and logins
        answer 503 meanwhile."""
        if store is None:
            store = self._own_store = EmbeddedStore.in_data_dir(self.config.data_dir,
                                                                self.config.cp_history_revisions)
            await store.start()
        self._data = AuthData(store)
        self._data.start()
        line, exposed = self.exposure()
        log.log(logging.WARNING if exposed else logging.INFO, "%s", line)
        if self.config.auth_token_secret_key:
            key = decode_secret(self.config.auth_token_secret_key, "nacos.core.auth.plugin.nacos.token.secret.key")
            self._tokens = TokenManager(key, self.config.auth_token_expire_s, self._now_s)
        self._preparing = asyncio.get_running_loop().create_task(self._prepare(), name="auth-prepare")
        timeout = self.config.load_timeout_ms / 1000 if wait_s is None else wait_s
        if timeout <= 0:
            return
        try:
            await self.wait_ready(timeout)
        except TimeoutError:
            log.warning("auth: the CP store (%s) is not answering yet; users and the token key load in the "
                        "background and logins answer 503 until then", store.kind)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until users are read, a user file imported and the token key loaded."""
        if self._preparing is not None:
            await asyncio.wait_for(asyncio.shield(self._preparing), timeout_s)

    async def _prepare(self) -> None:
        data = self.data
        delay = 0.2
        while True:
            try:
                await data.wait_ready()
                imported = await data.import_user_file(self.auth_dir)
                if imported is not None:
                    log.warning("auth: imported the node's user file %s into the CP store (%s): %d new users, "
                                "%d role bindings, %d permissions; the file is renamed *%s and no longer read",
                                self.auth_dir / USERS_FILE, data.store.kind, *imported, IMPORTED_SUFFIX)
                if self._tokens is None:
                    candidate = await run_blocking(local_key_file, self.auth_dir)
                    key = await data.token_key(candidate)
                    self._tokens = TokenManager(key, self.config.auth_token_expire_s, self._now_s)
                if self.needs_first_admin():
                    log.warning("auth: %s; or run open for local development: -D nacos.core.auth.enabled=false "
                                "-D nacos.core.auth.admin.enabled=false -D nacos.core.auth.console.enabled=false",
                                FIRST_ADMIN_HINT)
                return
            except CpUnavailable as exc:
                log.info("auth: CP store not ready (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def stop(self) -> None:
        task, self._preparing = self._preparing, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._data is not None:
            await self._data.stop()
        store, self._own_store = self._own_store, None
        if store is not None:
            await store.close()

    @property
    def data(self) -> AuthData:
        """Users, roles and permissions (read locally, written to the CP store)."""
        if self._data is None:
            raise RuntimeError("AuthService.start() was not awaited")
        return self._data

    @property
    def tokens(self) -> TokenManager:
        if self._tokens is None:
            if self._data is None:
                raise RuntimeError("AuthService.start() was not awaited")
            raise CpUnavailable("CP store unavailable: the cluster's token key is not loaded yet")
        return self._tokens

    # --- login ----------------------------------------------------------------------------
    async def login(self, username: str, password: str, source: str) -> dict[str, Any]:
        """Nacos UserController.login: the token answer, or Forbidden / TooManyLogins.

        While the client APIs are open (``nacos.core.auth.enabled=false``), credentials that do not
        check out get an empty token (HTTP 200) instead of 403: SDKs configured with a username and
        password log in before their calls and some (nacos-sdk-python 3.x) give up on a refused
        login, though the node would serve them anonymously. No token is issued, and a source over
        the failed-login limit gets the same answer without its password being checked (docs/protocol.md §5.6)."""
        try:
            identity = await self._authenticate(username, password, source)
        except (Forbidden, TooManyLogins):
            if self.enabled:
                raise
            return {"accessToken": "", "tokenTtl": self.tokens.ttl_s, "globalAdmin": False, "username": username}
        token = self.tokens.create(identity.username)
        return {"accessToken": token, "tokenTtl": self.tokens.ttl_s, "globalAdmin": identity.global_admin,
                "username": identity.username}

    async def _authenticate(self, username: str, password: str, source: str) -> Identity:
        self.limiter.check(source)
        if not username:
            raise InvalidParam("Param 'username' is required.")
        if not password:
            raise InvalidParam("Param 'password' is required.")
        ldap = self._ldap
        if ldap is not None:  # Nacos's LDAP manager: its name rules apply to the local try too
            username = ldap.login_name(username)
            if username.upper().startswith(LDAP_PREFIX):
                self.limiter.failed(source)
                raise Forbidden("unknown user!")
        hashed = await self._fresh_hash(username)
        ok = await self._bcrypt(check_password, password, hashed or DUMMY_HASH)
        if ok and hashed is not None:
            pass
        elif ldap is not None and await ldap.authenticate(username, password):
            username = LDAP_PREFIX + username
            await self._ensure_ldap_user(username)
        else:
            self.limiter.failed(source)
            log.info("failed login for %r from %s", username, source)
            raise Forbidden("unknown user!")
        self.limiter.succeeded(source)
        return Identity(username, self.data.is_global_admin(username))

    async def _ensure_ldap_user(self, username: str) -> None:
        """The local stand-in ``LDAP_<name>`` of a directory user, made on its first login with a
        random password nobody knows (its roles are bound to this name, as in Nacos)."""
        if self.data.has_user(username):
            return
        try:
            await self.data.add_user(username, await self._hash(secrets.token_urlsafe(32)))
            log.info("auth: first LDAP login of %r; local user made for its roles", username)
        except InvalidParam:
            pass  # made meanwhile by another login or node

    async def _fresh_hash(self, username: str) -> str | None:
        """The user's hash as the store has it now (a change made by ``shoal users`` on another
        process is seen at the next login); the local view when the store cannot answer."""
        try:
            record = await self.data.store.get(Keyspace.USERS.key(username))
        except CpUnavailable:
            return self.data.password_hash(username)
        if record is None:
            return None
        try:
            return str(json.loads(record.value)["password"])
        except (ValueError, KeyError, TypeError):
            return None

    async def _bcrypt(self, fn: Callable[[str, str], Any], a: str, b: str) -> Any:
        if self._bcrypt_slots is None:
            self._bcrypt_slots = asyncio.Semaphore(2)
        async with self._bcrypt_slots:
            return await run_blocking(fn, a, b)

    async def _hash(self, password: str) -> str:
        if self._bcrypt_slots is None:
            self._bcrypt_slots = asyncio.Semaphore(2)
        async with self._bcrypt_slots:
            return await run_blocking(hash_password, password)

    # --- identities -------------------------------------------------------------------------
    def identity(self, token: str) -> Identity:
        if not token:
            raise self.refusal()
        username = self.tokens.username_of(token)
        return Identity(username, self.data.is_global_admin(username))

    async def identity_from_credentials(self, username: str, password: str, source: str) -> Identity:
        """Clients that send ``username``/``password`` on every call instead of a token
        (docs/protocol.md §5.6): checked once with bcrypt, then remembered for the token lifetime."""
        digest = hmac.digest(self._credential_key, f"{username}\0{password}".encode(), hashlib.sha256)
        cached = self._credentials.get(digest)
        now = self._monotonic_ms()
        if cached is not None and cached[1] > now and self.data.has_user(cached[0]):
            return Identity(cached[0], self.data.is_global_admin(cached[0]))
        identity = await self._authenticate(username, password, source)
        if len(self._credentials) >= _CREDENTIAL_CACHE_MAX:
            self._credentials.popitem(last=False)
        self._credentials[digest] = (identity.username, now + self.tokens.ttl_s * 1000)
        return identity

    def authorize(self, identity: Identity, resource: str | None, action: str) -> None:
        """``resource=None`` means an admin-only operation (console, users, cluster)."""
        if identity.global_admin:
            return
        if resource is not None and self.data.allowed(identity.username, resource, action):
            return
        raise Forbidden("authorization failed!")

    def check_request(self, ctx: HasHeaders, type_name: str, body: Mapping[str, Any]) -> None:
        """The gRPC request filter (Nacos RemoteRequestAuthFilter): raises Forbidden."""
        if not self.enabled:
            return
        action = GRPC_ACTIONS.get(type_name)
        if action is None:
            return
        identity = self.identity(ctx.header("accessToken"))
        service = body.get("serviceName")
        resource = naming_resource(str(body.get("namespace") or ""), str(body.get("groupName") or ""),
                                   service if isinstance(service, str) else "")
        self.authorize(identity, resource, action)

    def check_setup(self, headers: Mapping[str, str]) -> None:
        """ConnectionSetupRequest: a token, if one is presented, must be valid (SDKs send none
        on setup — every naming request is checked on its own)."""
        if self.enabled:
            token = headers.get("accesstoken", "")
            if token:
                self.identity(token)

    # --- search (UserController.getUserListByUsername, RoleController.searchRoles) -----------
    def search_users(self, fragment: str) -> list[str]:
        """Usernames matching ``fragment`` (:func:`name_matcher`), sorted."""
        match = name_matcher(fragment)
        return [name for name in self.data.usernames() if match(name)]

    def list_users(self, name: str, blur: bool) -> list[dict[str, str]]:
        """The user list page's rows: every user, or those named ``name`` (containing it with ``blur``)."""
        return [{"username": u} for u in self.data.usernames() if not name or (name in u if blur else u == name)]

    def list_roles(self, username: str, role: str) -> list[dict[str, str]]:
        """The role list page's rows: every binding, or those of ``username`` and/or ``role``."""
        return [{"role": r, "username": u} for r, u in self.data.roles()
                if (not username or u == username) and (not role or r == role)]

    def list_permissions(self, role: str) -> list[dict[str, str]]:
        """The permission list page's rows: every permission, or those of ``role``."""
        return [{"role": x.role, "resource": x.resource, "action": x.action} for x in self.data.permissions()
                if not role or x.role == role]

    def search_roles(self, fragment: str) -> list[str]:
        """Role names matching ``fragment`` (:func:`name_matcher`), each once, sorted."""
        match = name_matcher(fragment)
        return sorted({role for role, _user in self.data.roles() if match(role)})

    # --- user administration (UserController / RoleController / PermissionController) ------
    async def create_user(self, username: str, password: str) -> None:
        validate_username(username)
        validate_password(password)
        if self.data.has_user(username):
            raise InvalidParam(f"user '{username}' already exist!")
        await self.data.add_user(username, await self._hash(password))

    async def create_admin(self, password: str) -> dict[str, str]:
        """The first admin (``nacos``), only while there is none; random password if absent.
        Cluster-wide: the user is created with a create-if-absent, so two nodes asked at once
        make one admin."""
        if password:
            validate_password(password)
        if self.data.has_admin():
            raise AdminExists("have admin user cannot use it")
        password = password or secrets.token_urlsafe(12)
        hashed = await self._hash(password)
        if self.data.has_admin() or self.data.has_user(DEFAULT_ADMIN):
            raise AdminExists("have admin user cannot use it")
        try:
            await self.data.add_user(DEFAULT_ADMIN, hashed)
        except InvalidParam:
            raise AdminExists("have admin user cannot use it") from None
        await self.data.grant_admin(DEFAULT_ADMIN)
        log.info("created the first admin user %r", DEFAULT_ADMIN)
        return {"username": DEFAULT_ADMIN, "password": password}

    async def update_password(self, username: str, password: str) -> None:
        validate_username(username)
        validate_password(password, "newPassword")
        if not self.data.has_user(username):
            raise InvalidParam(f"user {username} not exist!")
        await self.data.set_password(username, await self._hash(password))
        self._credentials.clear()

    async def delete_user(self, username: str) -> None:
        validate_username(username)
        await self.data.delete_user(username)
        self._credentials.clear()

    async def add_role(self, role: str, username: str) -> None:
        validate_role(role)
        validate_username(username)
        if role == GLOBAL_ADMIN_ROLE:
            raise InvalidParam(f"role '{GLOBAL_ADMIN_ROLE}' is not permitted to create!")
        await self.data.add_role(role, username)

    async def delete_role(self, role: str, username: str) -> None:
        validate_role(role)
        if role == GLOBAL_ADMIN_ROLE:
            raise InvalidParam(f"role '{GLOBAL_ADMIN_ROLE}' is not permitted to delete!")
        await self.data.delete_role(role, username)

    async def add_permission(self, role: str, resource: str, action: str) -> None:
        validate_role(role)
        await self.data.add_permission(role, resource, action)

    async def delete_permission(self, role: str, resource: str, action: str) -> None:
        validate_role(role)
        await self.data.delete_permission(role, resource, action)
