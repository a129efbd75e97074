"""Users, roles, permissions and the token key of a cluster, kept in the CP store.

Three keyspaces hold the auth data of every node of a cluster (or of the standalone node's
embedded store):

* ``users/<username>`` → ``{"username", "password"}`` (the bcrypt hash);
* ``roles/<role>/<username>`` → ``{"role", "username"}``;
* ``permissions/<role>/<resource>/<action>`` → ``{"role", "resource", "action"}``;

and ``meta/token-secret-key`` → ``{"key": <Base64>}``, the HS256 signing key, created once per
cluster with a create-if-absent, so every node signs and checks with the same key.

:class:`AuthData` reads from views of those keyspaces (local lookups, also while the store is
unreachable) and keeps two indexes for the per-request permission check (user → roles, role →
permissions). Changes are written to the store; each write waits until this node's view shows
it, so a caller reads its own writes, and every other node sees it through its watch.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import secrets
from pathlib import Path
from typing import Any

from shoal.auth.store import ACTIONS, GLOBAL_ADMIN_ROLE, USERS_FILE, Permission, UserStore, resource_pattern
from shoal.auth.tokens import MIN_KEY_BYTES, SECRET_FILE, decode_secret
from shoal.cp.store import CpStore, CpView, Keyspace, json_view
from shoal.errors import ConfigError, InvalidParam
from shoal.tasks import run_blocking

log = logging.getLogger(__name__)

TOKEN_KEY_NAME = "token-secret-key"
IMPORTED_SUFFIX = ".imported"


def role_key(role: str, username: str) -> str:
    return f"{role}/{username}"


def permission_key(role: str, resource: str, action: str) -> str:
    return f"{role}/{resource}/{action}"


class AuthData:
    """The auth data of a cluster (Nacos's ``users``/``roles``/``permissions`` tables), read
    from local views and written to the CP store."""

    def __init__(self, store: CpStore) -> None:
        self.store = store
        self.users_view = json_view(store, Keyspace.USERS)
        self.roles_view = json_view(store, Keyspace.ROLES)
        self.permissions_view = json_view(store, Keyspace.PERMISSIONS)
        self._roles_of: dict[str, set[str]] = {}
        self._grants: dict[str, set[Permission]] = {}
        self._patterns: dict[str, re.Pattern[str]] = {}
        self.roles_view.subscribe(self._on_role)
        self.permissions_view.subscribe(self._on_permission)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        for view in self._views():
            view.start()

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        for view in self._views():
            await view.wait_ready(timeout_s)

    @property
    def ready(self) -> bool:
        return all(view.ready for view in self._views())

    async def stop(self) -> None:
        for view in self._views():
            await view.stop()

    def _views(self) -> tuple[CpView[Any], ...]:
        return self.users_view, self.roles_view, self.permissions_view

    # --- indexes (fed by the views' listeners) ------------------------------------------------
    def _on_role(self, name: str, old: Any, new: Any) -> None:
        if isinstance(old, dict):
            roles = self._roles_of.get(str(old.get("username")))
            if roles is not None:
                roles.discard(str(old.get("role")))
                if not roles:
                    self._roles_of.pop(str(old.get("username")), None)
        if isinstance(new, dict):
            self._roles_of.setdefault(str(new.get("username")), set()).add(str(new.get("role")))

    def _on_permission(self, name: str, old: Any, new: Any) -> None:
        if isinstance(old, dict):
            grants = self._grants.get(str(old.get("role")))
            if grants is not None:
                grants.discard(_permission(old))
                if not grants:
                    self._grants.pop(str(old.get("role")), None)
        if isinstance(new, dict):
            self._grants.setdefault(str(new.get("role")), set()).add(_permission(new))

    # --- queries (local) ----------------------------------------------------------------------
    def password_hash(self, username: str) -> str | None:
        record = self.users_view.get(username)
        return str(record["password"]) if isinstance(record, dict) and "password" in record else None

    def has_user(self, username: str) -> bool:
        return username in self.users_view

    def usernames(self) -> list[str]:
        return sorted(name for name, _ in self.users_view.items())

    def roles(self) -> list[tuple[str, str]]:
        """Every (role, username) binding, ordered by role then user."""
        return sorted((str(v.get("role")), str(v.get("username"))) for _, v in self.roles_view.items())

    def permissions(self) -> list[Permission]:
        return sorted((_permission(v) for _, v in self.permissions_view.items()),
                      key=lambda p: (p.role, p.resource, p.action))

    def roles_of(self, username: str) -> list[str]:
        return sorted(self._roles_of.get(username, ()))

    def is_global_admin(self, username: str) -> bool:
        return GLOBAL_ADMIN_ROLE in self._roles_of.get(username, ())

    def has_admin(self) -> bool:
        return any(GLOBAL_ADMIN_ROLE in roles and self.has_user(user) for user, roles in self._roles_of.items())

    def allowed(self, username: str, resource: str, action: str) -> bool:
        """Nacos NacosRoleServiceImpl.hasPermission: admin, or a role with a matching grant."""
        roles = self._roles_of.get(username, ())
        if GLOBAL_ADMIN_ROLE in roles:
            return True
        for role in roles:
            for perm in self._grants.get(role, ()):
                if action in perm.action:
                    pattern = self._patterns.get(perm.resource)
                    if pattern is None:
                        if len(self._patterns) > 10_000:
                            self._patterns.clear()
                        pattern = self._patterns[perm.resource] = resource_pattern(perm.resource)
                    if pattern.fullmatch(resource):
                        return True
        return False

    # --- changes (to the store) ---------------------------------------------------------------
    async def add_user(self, username: str, password_hash: str) -> None:
        if not await self.users_view.create(username, {"username": username, "password": password_hash}):
            raise InvalidParam(f"user '{username}' already exist!")

    async def set_password(self, username: str, password_hash: str) -> None:
        for _ in range(5):
            if not self.has_user(username):
                raise InvalidParam(f"user {username} not exist!")
            if await self.users_view.compare_and_put(username, {"username": username, "password": password_hash},
                                                     self.users_view.mod_revision(username)):
                return
        raise InvalidParam(f"user {username} was changed concurrently; retry")

    async def delete_user(self, username: str) -> None:
        if not self.has_user(username):
            raise InvalidParam(f"user {username} not exist!")
        if self.is_global_admin(username):
            raise InvalidParam(f"cannot delete admin: {username}")
        await self.users_view.delete(username)
        for role in self.roles_of(username):
            await self.roles_view.delete(role_key(role, username))

    async def add_role(self, role: str, username: str) -> None:
        if not self.has_user(username):
            raise InvalidParam(f"user '{username}' not found!")
        await self.roles_view.put(role_key(role, username), {"role": role, "username": username})

    async def grant_admin(self, username: str) -> None:
        await self.roles_view.put(role_key(GLOBAL_ADMIN_ROLE, username),
                                  {"role": GLOBAL_ADMIN_ROLE, "username": username})

    async def delete_role(self, role: str, username: str = "") -> None:
        """One binding, or (no user) the role with every binding and permission."""
        if username:
            await self.roles_view.delete(role_key(role, username))
            return
        for bound_role, user in self.roles():
            if bound_role == role:
                await self.roles_view.delete(role_key(role, user))
        for perm in list(self._grants.get(role, ())):
            await self.permissions_view.delete(permission_key(perm.role, perm.resource, perm.action))

    async def add_permission(self, role: str, resource: str, action: str) -> None:
        if action not in ACTIONS:
            raise InvalidParam("Param 'action' must be one of r, w, rw.")
        if not resource:
            raise InvalidParam("Param 'resource' is required.")
        if not any(role in roles for roles in self._roles_of.values()):
            raise InvalidParam(f"role {role} not found!")
        await self.permissions_view.put(permission_key(role, resource, action),
                                        {"role": role, "resource": resource, "action": action})

    async def delete_permission(self, role: str, resource: str, action: str) -> None:
        await self.permissions_view.delete(permission_key(role, resource, action))

    # --- the cluster's token key ----------------------------------------------------------------
    async def token_key(self, candidate: bytes | None = None) -> bytes:
        """The cluster's signing key: the stored one, else ``candidate`` (or a fresh random key)
        stored with a create-if-absent; a node that loses the race takes the winner's key."""
        key = Keyspace.META.key(TOKEN_KEY_NAME)
        current = await self.store.get(key)
        if current is None:
            fresh = candidate or secrets.token_bytes(MIN_KEY_BYTES)
            value = json.dumps({"key": base64.b64encode(fresh).decode("ascii")}).encode()
            result = await self.store.create(key, value)
            if result.succeeded:
                log.info("stored the cluster's token signing key in the CP store (%s)", self.store.kind)
                return fresh
            current = result.current
            if current is None:
                raise ConfigError("the cluster's token key vanished while it was created")
        try:
            text = json.loads(current.value)["key"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"the CP store's {TOKEN_KEY_NAME} is malformed") from None
        return decode_secret(str(text), f"CP store {TOKEN_KEY_NAME}")

    # --- one-time import of a node's user file ----------------------------------------------------
    async def import_user_file(self, auth_dir: Path) -> tuple[int, int, int] | None:
        """Import ``<auth_dir>/users.json`` into the store once: users are created if absent
        (the store's wins), roles and permissions added; then the file is renamed to
        ``users.json.imported``. None if there was no file; raises CpUnavailable if the store
        cannot take it now (the file stays for the next start)."""
        path = auth_dir / USERS_FILE
        if not await run_blocking(path.exists):
            return None
        old = UserStore.in_dir(auth_dir)
        await run_blocking(old.load)
        users = 0
        for username, hashed in old.users.items():
            if await self.users_view.create(username, {"username": username, "password": hashed}):
                users += 1
        for role, username in old.roles:
            await self.roles_view.put(role_key(role, username), {"role": role, "username": username})
        for perm in old.permissions:
            await self.permissions_view.put(permission_key(perm.role, perm.resource, perm.action),
                                            {"role": perm.role, "resource": perm.resource, "action": perm.action})
        await run_blocking(path.rename, path.with_name(USERS_FILE + IMPORTED_SUFFIX))
        return users, len(old.roles), len(old.permissions)


def local_key_file(auth_dir: Path) -> bytes | None:
    """A node's own key file of earlier releases (offered as the cluster key, so tokens it
    issued stay valid when it is the first to store one). Blocking."""
    path = auth_dir / SECRET_FILE
    try:
        return decode_secret(path.read_text(encoding="ascii"), str(path))
    except (OSError, ValueError):
        return None


def _permission(record: dict[str, Any]) -> Permission:
    return Permission(str(record.get("role")), str(record.get("resource")), str(record.get("action")))
