"""Password hashing and validation of the Nacos default auth plugin, and the per-node user file
of earlier releases (now only read once, to import it into the CP store: see ``cpdata.py``).

That file, ``<data_dir>/auth/users.json`` (mode 0600, replaced atomically on every change):
users with bcrypt password hashes (Nacos stores BCrypt too, so hashes carry over), role
bindings ``(role, username)`` and permissions ``(role, resource, action)``. The role
``ROLE_ADMIN`` is the global admin. A permission's resource is a pattern over
``namespace:group:naming/service`` where ``*`` matches anything (the console's
``public:*:*`` grants a whole namespace); its action is ``r``, ``w`` or ``rw``.

Loading and saving are blocking (callers use ``run_blocking``); everything else is in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

from shoal.errors import InvalidParam

GLOBAL_ADMIN_ROLE = "ROLE_ADMIN"
DEFAULT_ADMIN = "nacos"
USERS_FILE = "users.json"
BCRYPT_ROUNDS = 10  # Spring's BCryptPasswordEncoder default, as Nacos uses
MAX_PASSWORD_BYTES = 72  # bcrypt ignores (bcrypt>=5: refuses) anything longer
ACTIONS = ("r", "w", "rw")


def hash_password(password: str) -> str:
    """bcrypt hash (CPU-heavy: ~0.1 s; call through run_blocking)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode("ascii")


def check_password(password: str, hashed: str) -> bool:
    """bcrypt check (CPU-heavy; call through run_blocking). Accepts Nacos's ``$2a$`` hashes."""
    try:
        return bcrypt.checkpw(password.encode(), hashed.encode("ascii"))
    except ValueError:
        return False


#: A hash checked when the user does not exist, so a miss costs what a hit costs.
DUMMY_HASH = "$2b$10$/TKD63FhIbOwCe.b3BuER.kxdi5aEnX9/s3BDtIvCbzbnhqqZBxoe"


def validate_password(password: str, name: str = "password") -> None:
    if not password:
        raise InvalidParam(f"Param '{name}' is required.")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise InvalidParam(f"Param '{name}' must be at most {MAX_PASSWORD_BYTES} bytes (bcrypt limit).")


_USERNAME_RE = re.compile(r"[\w.@-]{1,64}", re.ASCII)
_ROLE_RE = re.compile(r"[\w.@-]{1,64}", re.ASCII)


def validate_username(username: str, name: str = "username") -> None:
    if not username:
        raise InvalidParam(f"Param '{name}' is required.")
    if not _USERNAME_RE.fullmatch(username):
        raise InvalidParam(f"Param '{name}' must be 1-64 characters of letters, digits, '_', '.', '@' or '-'.")


def validate_role(role: str) -> None:
    if not role:
        raise InvalidParam("Param 'role' is required.")
    if not _ROLE_RE.fullmatch(role):
        raise InvalidParam("Param 'role' must be 1-64 characters of letters, digits, '_', '.', '@' or '-'.")


def resource_pattern(resource: str) -> re.Pattern[str]:
    """Nacos matches permission resources as regexes with ``*`` → ``.*``; we escape the rest."""
    return re.compile(".*".join(re.escape(part) for part in resource.split("*")))


@dataclass(frozen=True, slots=True)
class Permission:
    """One grant of an action (``r``, ``w`` or ``rw``) on a resource pattern
    (``namespace:group:naming/service``, ``*`` wildcards) to a role (Nacos ``PermissionInfo``)."""

    role: str
    resource: str
    action: str


@dataclass
class UserStore:
    """The in-memory user database and its file."""

    path: Path
    users: dict[str, str] = field(default_factory=dict)  # username -> bcrypt hash
    roles: list[tuple[str, str]] = field(default_factory=list)  # (role, username)
    permissions: list[Permission] = field(default_factory=list)
    mtime_ns: int = -1
    _patterns: dict[str, re.Pattern[str]] = field(default_factory=dict)

    @classmethod
    def in_dir(cls, auth_dir: Path) -> UserStore:
        return cls(auth_dir / USERS_FILE)

    # --- file (blocking) ---------------------------------------------------------------
    def load(self) -> None:
        """Read the file (absent = empty store)."""
        try:
            stat = self.path.stat()
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.users, self.roles, self.permissions, self.mtime_ns = {}, [], [], -1
            return
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot read the user store {self.path}: {exc}") from exc
        self._apply(raw)
        self.mtime_ns = stat.st_mtime_ns

    def reload_if_changed(self) -> bool:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        if mtime == self.mtime_ns:
            return False
        self.load()
        return True

    def save(self) -> None:
        """Write the whole store atomically (temp file 0600 + fsync + rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.to_json(), indent=1, sort_keys=True).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self.mtime_ns = self.path.stat().st_mtime_ns

    def to_json(self) -> dict[str, Any]:
        return {
            "users": [{"username": u, "password": h} for u, h in sorted(self.users.items())],
            "roles": [{"role": r, "username": u} for r, u in self.roles],
            "permissions": [{"role": p.role, "resource": p.resource, "action": p.action} for p in self.permissions],
        }

    def _apply(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise OSError(f"user store {self.path} is not a JSON object")
        try:
            self.users = {str(u["username"]): str(u["password"]) for u in raw.get("users", [])}
            self.roles = [(str(r["role"]), str(r["username"])) for r in raw.get("roles", [])]
            self.permissions = [Permission(str(p["role"]), str(p["resource"]), str(p["action"]))
                                for p in raw.get("permissions", [])]
        except (KeyError, TypeError) as exc:
            raise OSError(f"user store {self.path} is malformed: {exc}") from exc
        self._patterns.clear()

    # --- queries --------------------------------------------------------------------------
    def roles_of(self, username: str) -> list[str]:
        return [role for role, user in self.roles if user == username]

    def is_global_admin(self, username: str) -> bool:
        return (GLOBAL_ADMIN_ROLE, username) in self.roles

    def has_admin(self) -> bool:
        return any(role == GLOBAL_ADMIN_ROLE and user in self.users for role, user in self.roles)

    def allowed(self, username: str, resource: str, action: str) -> bool:
        """Nacos NacosRoleServiceImpl.hasPermission: admin, or a role with a matching grant."""
        roles = self.roles_of(username)
        if GLOBAL_ADMIN_ROLE in roles:
            return True
        for perm in self.permissions:
            if perm.role in roles and action in perm.action:
                pattern = self._patterns.get(perm.resource)
                if pattern is None:
                    pattern = self._patterns[perm.resource] = resource_pattern(perm.resource)
                if pattern.fullmatch(resource):
                    return True
        return False

    # --- changes (in memory; the caller saves) ----------------------------------------------
    def add_user(self, username: str, password_hash: str) -> None:
        if username in self.users:
            raise InvalidParam(f"user '{username}' already exist!")
        self.users[username] = password_hash

    def set_password(self, username: str, password_hash: str) -> None:
        if username not in self.users:
            raise InvalidParam(f"user {username} not exist!")
        self.users[username] = password_hash

    def delete_user(self, username: str) -> None:
        if username not in self.users:
            raise InvalidParam(f"user {username} not exist!")
        if self.is_global_admin(username):
            raise InvalidParam(f"cannot delete admin: {username}")
        del self.users[username]
        self.roles = [(r, u) for r, u in self.roles if u != username]

    def add_role(self, role: str, username: str) -> None:
        if username not in self.users:
            raise InvalidParam(f"user '{username}' not found!")
        if (role, username) not in self.roles:
            self.roles.append((role, username))

    def grant_admin(self, username: str) -> None:
        if (GLOBAL_ADMIN_ROLE, username) not in self.roles:
            self.roles.append((GLOBAL_ADMIN_ROLE, username))

    def delete_role(self, role: str, username: str = "") -> None:
        self.roles = [(r, u) for r, u in self.roles if not (r == role and (not username or u == username))]
        if not username:
            self.permissions = [p for p in self.permissions if p.role != role]

    def add_permission(self, role: str, resource: str, action: str) -> None:
        if action not in ACTIONS:
            raise InvalidParam("Param 'action' must be one of r, w, rw.")
        if not resource:
            raise InvalidParam("Param 'resource' is required.")
        if not any(r == role for r, _ in self.roles):
            raise InvalidParam(f"role {role} not found!")
        perm = Permission(role, resource, action)
        if perm not in self.permissions:
            self.permissions.append(perm)

    def delete_permission(self, role: str, resource: str, action: str) -> None:
        self.permissions = [p for p in self.permissions if p != Permission(role, resource, action)]
