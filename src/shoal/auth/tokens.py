"""Access tokens of the Nacos default auth plugin: compact HS256 JWTs (``sub`` + ``exp``).

Implemented with :mod:`hmac` (the format is three base64url segments; no library needed).
The signing key is Nacos's ``nacos.core.auth.plugin.nacos.token.secret.key`` (Base64, at least
32 bytes once decoded); when it is not configured a random key is generated on first start and
kept in ``<data_dir>/auth/token.secret.key`` (mode 0600, created atomically), so tokens survive
a restart — there is never a built-in default key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from shoal.errors import ConfigError, Forbidden

log = logging.getLogger(__name__)

MIN_KEY_BYTES = 32
SECRET_FILE = "token.secret.key"
_HEADER = base64.urlsafe_b64encode(b'{"alg":"HS256"}').rstrip(b"=")
_CACHE_MAX = 4096


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def decode_secret(text: str, source: str) -> bytes:
    """A Base64 key as Nacos reads it; ConfigError if not Base64 or shorter than 32 bytes."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{source}: the token secret key is not valid Base64") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{source}: the token secret key must decode to at least {MIN_KEY_BYTES} bytes, "
                          f"got {len(key)}")
    return key


def load_or_create_secret(auth_dir: Path, configured: str) -> bytes:
    """The signing key: the configured one, else the key file (created once, 0600). Blocking."""
    if configured:
        return decode_secret(configured, "nacos.core.auth.plugin.nacos.token.secret.key")
    path = auth_dir / SECRET_FILE
    if not path.exists():
        auth_dir.mkdir(parents=True, exist_ok=True)
        text = base64.b64encode(secrets.token_bytes(MIN_KEY_BYTES)).decode() + "\n"
        if create_private_file(path, text.encode()):
            log.info("generated a token signing key in %s", path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("token signing key %s is readable by others (mode %o); chmod 600 it", path, mode)
    return decode_secret(path.read_text(encoding="ascii"), str(path))


def create_private_file(path: Path, data: bytes) -> bool:
    """Create ``path`` with mode 0600 and the full content, atomically, only if it does not
    exist (a temp file is written and fsynced, then hard-linked into place). False if it
    already existed (another process won the race)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


class TokenManager:
    """Issues and checks tokens; ``now_s`` is wall-clock seconds (tokens carry epoch ``exp``)."""

    def __init__(self, key: bytes, ttl_s: int, now_s: Callable[[], float]) -> None:
        self._key = key
        self.ttl_s = ttl_s
        self._now_s = now_s
        self._cache: dict[str, tuple[str, int]] = {}

    def create(self, username: str) -> str:
        payload = _b64url(json.dumps({"sub": username, "exp": int(self._now_s()) + self.ttl_s},
                                     separators=(",", ":")).encode())
        signing_input = _HEADER + b"." + payload
        signature = _b64url(hmac.digest(self._key, signing_input, hashlib.sha256))
        return (signing_input + b"." + signature).decode("ascii")

    def username_of(self, token: str) -> str:
        """The token's user; Forbidden ``token invalid!`` / ``token expired!`` otherwise."""
        cached = self._cache.get(token)
        if cached is None:
            cached = self._parse(token)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[token] = cached
        username, exp = cached
        if self._now_s() >= exp:
            self._cache.pop(token, None)
            raise Forbidden("token expired!")
        return username

    def remaining_s(self, token: str) -> int:
        self.username_of(token)
        return max(0, self._cache[token][1] - int(self._now_s()))

    def _parse(self, token: str) -> tuple[str, int]:
        parts = token.split(".")
        if len(parts) != 3:
            raise Forbidden("token invalid!")
        try:
            header = json.loads(_unb64url(parts[0]))
            expected = _b64url(hmac.digest(self._key, f"{parts[0]}.{parts[1]}".encode("ascii"), hashlib.sha256))
            if not isinstance(header, dict) or header.get("alg") != "HS256":
                raise ValueError("alg")
            if not hmac.compare_digest(expected, parts[2].encode("ascii")):
                raise ValueError("signature")
            claims = json.loads(_unb64url(parts[1]))
        except (ValueError, UnicodeError, binascii.Error, RecursionError):  # RecursionError: hostile nesting
            raise Forbidden("token invalid!") from None
        if not isinstance(claims, dict):
            raise Forbidden("token invalid!")
        sub, exp = claims.get("sub"), claims.get("exp")
        if not isinstance(sub, str) or not sub or isinstance(exp, bool) or not isinstance(exp, int):
            raise Forbidden("token invalid!")
        return sub, exp
