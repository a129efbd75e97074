"""The CP store of a cluster: an etcd v3 cluster, through etcd's own v3 JSON gateway.

Why this client: etcd serves its v3 API as JSON over HTTP on the client port (the gRPC
gateway: ``/v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/deleterange``, ``/v3/kv/txn``,
``/v3/kv/compaction``, ``/v3/auth/authenticate`` and the streaming ``/v3/watch``, keys and
values base64, int64 as strings) in every release since 3.3. Speaking it over aiohttp, which
Shoal already depends on, gives an asyncio-native client with no extra package and no
generated code to keep in step. The PyPI alternatives were checked and not taken: ``etcd3``
(last release 2020, thread-based grpc), ``aetcd`` (a single 1.0.0 release) and ``etcetra``
(last release 2024) are either unmaintained or too young to trust for the CP half.

What it does:

* **Endpoints and failover.** Requests go to the current endpoint; when it refuses the
  connection, or answers that it has no leader (every request carries etcd's
  ``hasleader`` metadata, so a member cut off from its quorum answers at once instead of
  hanging), the next endpoint is tried, within one overall deadline.
* **Request timeout.** Every unary call is bounded by ``request_timeout_ms``; when it runs
  out, or no endpoint could take the call, :class:`~shoal.errors.CpUnavailable` is raised
  naming the cause. A write that may have reached etcd (timeout after sending) is never
  retried on another endpoint, so a create-if-absent cannot report a wrong winner.
* **TLS** (``ca_file``, ``cert_file``/``key_file`` for client certificates) and **auth**
  (user/password → token from ``/v3/auth/authenticate``, sent as ``Authorization``;
  renewed once when etcd calls it invalid).
* **Watch** with resume: the stream is reopened with ``start_revision`` = last delivered
  revision + 1 after any error, with exponential back-off and endpoint rotation; when etcd
  answers ``compact_revision`` (the history is gone), the prefix is re-read and a
  :class:`~shoal.cp.store.Resync` yielded before watching on from after it. An idle stream is
  reopened after ``watch_idle_s`` so a silently dead connection cannot stall a view.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

from shoal.cp.store import (
    CasResult,
    CpStore,
    EventKind,
    KeyValue,
    RangeResult,
    Resync,
    WatchEvent,
    WatchItem,
    prefix_end,
)
from shoal.errors import CpUnavailable, NacosError

log = logging.getLogger(__name__)

#: gRPC status codes etcd answers with (in the gateway's ``code``/``grpc_code``).
_UNAVAILABLE = 14
_DEADLINE_EXCEEDED = 4
_UNAUTHENTICATED = 16
_OUT_OF_RANGE = 11
#: Makes etcd refuse a request at once when its member has no leader (rpctypes.MetadataRequireLeaderKey).
_REQUIRE_LEADER = {"Grpc-Metadata-hasleader": "true"}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key")).decode("utf-8", "surrogateescape"),
        value=_unb64(raw.get("value")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
    )


def _revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


async def _results(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The ``result`` objects of a gateway stream (newline-delimited JSON); an error raises."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            message = json.loads(line)
            if "error" in message:
                err = message["error"]
                raise _EtcdAnswer(int(err.get("grpc_code", 0)), str(err.get("message", err)))
            yield message.get("result", {})


class EtcdError(NacosError):
    """etcd refused a request for a reason other than availability (a bug or a misconfiguration)."""


class _EtcdAnswer(Exception):
    """An error answer of the gateway: gRPC code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _NotSent(Exception):
    """The request certainly did not reach this endpoint's state machine: try the next one."""


class EtcdStore(CpStore):
    """A :class:`CpStore` on an etcd v3 cluster (``endpoints``: ``host:port`` or URLs)."""

    kind = "etcd"

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        request_timeout_ms: int = 5000,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        user: str = "",
        password: str = "",
        backoff_initial_ms: int = 100,
        backoff_max_ms: int = 5000,
        watch_idle_s: float = 60.0,
    ) -> None:
        if not endpoints:
            raise ValueError("an etcd store needs at least one endpoint")
        tls = bool(ca_file or cert_file)
        scheme = "https" if tls else "http"
        self.endpoints = [e.rstrip("/") if "://" in e else f"{scheme}://{e}" for e in endpoints]
        self.request_timeout_s = request_timeout_ms / 1000
        self._ca_file, self._cert_file, self._key_file = ca_file, cert_file, key_file
        self._user, self._password = user, password
        self._backoff_initial_s = backoff_initial_ms / 1000
        self._backoff_max_s = backoff_max_ms / 1000
        self._watch_idle_s = watch_idle_s
        self._current = 0
        self._token: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._streams: set[aiohttp.ClientResponse] = set()  # open watch streams, cut on close()

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        ssl_context: ssl.SSLContext | bool = False
        if self._ca_file or self._cert_file:
            ssl_context = ssl.create_default_context(cafile=self._ca_file or None)
            if self._cert_file:
                ssl_context.load_cert_chain(self._cert_file, self._key_file or None)
        connector = aiohttp.TCPConnector(ssl=ssl_context, limit=64)
        self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        session, self._session = self._session, None
        for stream in list(self._streams):
            stream.close()  # wakes a watch blocked on its stream; it then sees the store closed
        if session is not None:
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise CpUnavailable("CP store unavailable: the etcd client is not started")
        return self._session

    # --- one request ------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = dict(_REQUIRE_LEADER)
        if self._token:
            headers["Authorization"] = self._token
        return headers

    async def _post_once(self, endpoint: str, path: str, body: dict[str, Any], timeout_s: float,
                         retry_safe: bool) -> dict[str, Any]:
        try:
            async with self.session.post(endpoint + path, json=body, headers=self._headers(),
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                text = await resp.text()
        except aiohttp.ClientConnectorError as exc:
            raise _NotSent(f"{endpoint}: {exc.os_error.strerror or exc}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            if retry_safe:
                raise _NotSent(f"{endpoint}: {exc!r}") from exc
            raise CpUnavailable(f"CP store unavailable: etcd at {endpoint} failed mid-request: {exc!r}") from exc
        try:
            answer: dict[str, Any] = json.loads(text) if text else {}
        except ValueError:
            raise _NotSent(f"{endpoint}: not an etcd answer (HTTP {resp.status})") from None
        if resp.status != 200 or "error" in answer:
            err = answer.get("error")
            code = int(answer.get("code") or (err.get("grpc_code") if isinstance(err, dict) else 0) or 0)
            message = str(answer.get("message") or (err.get("message") if isinstance(err, dict) else err) or text)
            raise _EtcdAnswer(code, message)
        return answer

    async def _call(self, path: str, body: dict[str, Any], retry_safe: bool = True) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the endpoints in turn, within the request timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        causes: list[str] = []
        reauthenticated = False
        attempts = 0
        while attempts < len(self.endpoints):
            remaining = deadline - loop.time()
            if remaining <= 0:
                causes.append(f"no answer within {self.request_timeout_s:g} s")
                break
            endpoint = self.endpoints[self._current]
            try:
                if self._user and self._token is None and path != "/v3/auth/authenticate":
                    await self._authenticate(endpoint, remaining)
                    remaining = deadline - loop.time()
                return await self._post_once(endpoint, path, body, max(remaining, 0.001), retry_safe)
            except _NotSent as exc:
                causes.append(str(exc))
            except TimeoutError:
                causes.append(f"{endpoint}: no answer within {self.request_timeout_s:g} s")
                self._current = (self._current + 1) % len(self.endpoints)  # the next call asks another
                break
            except CpUnavailable:
                # It hung or failed mid-request (a blackholed or minority member): this call cannot be
                # retried, but the next one must not go back to the same member, or a node whose
                # current endpoint is cut off would refuse every write while a quorum is reachable.
                self._current = (self._current + 1) % len(self.endpoints)
                raise
            except _EtcdAnswer as exc:
                if exc.code == _UNAUTHENTICATED and self._user and not reauthenticated:
                    self._token, reauthenticated = None, True
                    continue
                if "no leader" in exc.message:
                    causes.append(f"{endpoint}: {exc.message}")  # refused before it was applied
                elif exc.code in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
                    self._current = (self._current + 1) % len(self.endpoints)
                    raise CpUnavailable(f"CP store unavailable: etcd at {endpoint}: {exc.message}") from None
                else:
                    raise EtcdError(f"etcd refused {path}: {exc.message}") from None
            attempts += 1
            self._current = (self._current + 1) % len(self.endpoints)
        raise CpUnavailable("CP store unavailable: no etcd quorum reachable (" + "; ".join(causes) + ")")

    async def _authenticate(self, endpoint: str, timeout_s: float) -> None:
        try:
            answer = await self._post_once(endpoint, "/v3/auth/authenticate",
                                           {"name": self._user, "password": self._password}, timeout_s, True)
        except _EtcdAnswer as exc:
            if exc.code in (_UNAVAILABLE, _DEADLINE_EXCEEDED) or "no leader" in exc.message:
                raise _NotSent(f"{endpoint}: authenticate: {exc.message}") from None
            raise EtcdError(f"etcd authentication as {self._user!r} failed: {exc.message}") from None
        self._token = str(answer.get("token", "")) or None

    # --- the interface -------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        answer = await self._call("/v3/kv/range", {"key": _b64(key.encode())})
        kvs = answer.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def range(self, prefix: str) -> RangeResult:
        raw = prefix.encode()
        answer = await self._call("/v3/kv/range", {"key": _b64(raw or b"\0"), "range_end": _b64(prefix_end(raw))})
        return RangeResult(_revision(answer), tuple(_kv(kv) for kv in answer.get("kvs") or []))

    async def put(self, key: str, value: bytes) -> int:
        answer = await self._call("/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)}, retry_safe=False)
        return _revision(answer)

    async def delete(self, key: str) -> int | None:
        answer = await self._call("/v3/kv/deleterange", {"key": _b64(key.encode())}, retry_safe=False)
        return _revision(answer) if int(answer.get("deleted", 0)) else None

    async def compare_and_put(self, key: str, value: bytes, expected_mod_revision: int) -> CasResult:
        bkey = _b64(key.encode())
        body = {
            "compare": [{"key": bkey, "target": "MOD", "result": "EQUAL",
                         "mod_revision": str(expected_mod_revision)}],
            "success": [{"request_put": {"key": bkey, "value": _b64(value), "prev_kv": True}}],
            "failure": [{"request_range": {"key": bkey}}],
        }
        answer = await self._call("/v3/kv/txn", body, retry_safe=False)
        revision = _revision(answer)
        responses = answer.get("responses") or [{}]
        if answer.get("succeeded"):
            prev = responses[0].get("response_put", {}).get("prev_kv")
            created = int(prev.get("create_revision", revision)) if prev else revision
            version = int(prev.get("version", 0)) + 1 if prev else 1
            return CasResult(True, revision, KeyValue(key, value, created, revision, version))
        kvs = responses[0].get("response_range", {}).get("kvs") or []
        return CasResult(False, revision, _kv(kvs[0]) if kvs else None)

    async def compact(self, revision: int) -> None:
        try:
            await self._call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        except EtcdError as exc:
            if "compacted" not in str(exc):  # already compacted past it: nothing to do
                raise

    async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[WatchItem]:
        raw = prefix.encode()
        next_revision = from_revision
        backoff = self._backoff_initial_s
        while self._session is not None:  # a closed store ends its watches
            endpoint = self.endpoints[self._current]
            request = {"create_request": {"key": _b64(raw or b"\0"), "range_end": _b64(prefix_end(raw)),
                                          "start_revision": str(next_revision)}}
            cause = "stream ended"
            try:
                if self._user and self._token is None:
                    await self._authenticate(endpoint, self.request_timeout_s)
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout_s,
                                                sock_read=self._watch_idle_s)
                async with self.session.post(endpoint + "/v3/watch", json=request, headers=self._headers(),
                                             timeout=timeout) as resp:
                    self._streams.add(resp)
                    try:
                        if resp.status != 200:
                            raise _EtcdAnswer(resp.status, f"HTTP {resp.status}: {(await resp.text())[:200]}")
                        async for result in _results(resp):
                            compacted = int(result.get("compact_revision", 0))
                            if compacted:
                                snapshot = await self.range(prefix)
                                log.info("etcd watch on %s: history before %d compacted; re-read at %d",
                                         prefix, compacted, snapshot.revision)
                                yield Resync(snapshot.revision, snapshot.items)
                                next_revision = snapshot.revision + 1
                                raise _EtcdAnswer(_OUT_OF_RANGE, "compacted; resumed after a re-read")
                            if result.get("created"):
                                backoff = self._backoff_initial_s
                            for event in result.get("events") or []:
                                kv = _kv(event.get("kv", {}))
                                kind = EventKind.DELETE if event.get("type") == "DELETE" else EventKind.PUT
                                yield WatchEvent(kind, kv.key, kv.value, kv.mod_revision)
                                next_revision = kv.mod_revision + 1
                            if result.get("canceled"):
                                raise _EtcdAnswer(0, str(result.get("cancel_reason") or "watch canceled"))
                    finally:
                        self._streams.discard(resp)
            except asyncio.CancelledError:
                raise
            except aiohttp.ServerTimeoutError:
                if self._session is None:
                    return
                log.debug("etcd watch on %s idle for %g s; reopened", prefix, self._watch_idle_s)
                continue
            except _EtcdAnswer as exc:
                if exc.code == _UNAUTHENTICATED:
                    self._token = None
                if exc.code == _OUT_OF_RANGE:
                    continue  # a compaction re-read: watch on at once
                cause = exc.message
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, _NotSent, CpUnavailable,
                    EtcdError) as exc:
                cause = repr(exc)
            if self._session is None:
                return
            log.info("etcd watch on %s via %s interrupted (%s); resuming from revision %d",
                     prefix, endpoint, cause, next_revision)
            self._current = (self._current + 1) % len(self.endpoints)
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, self._backoff_max_s)
