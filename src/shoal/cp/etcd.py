"""The CP store of a cluster: an etcd v3 cluster, through etcd's own v3 JSON gateway.

Why this client: etcd serves its v3 API as JSON over HTTP on the client port (the gRPC
gateway: ``/v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/deleterange``, ``/v3/kv/txn`` (also the
multi-key :meth:`EtcdStore.txn`, one etcd transaction),
``/v3/kv/compaction``, ``/v3/auth/authenticate`` and the streaming ``/v3/watch``, keys and
values base64, int64 as strings) in every release since 3.3. Speaking it over aiohttp, which
Shoal already depends on, gives an asyncio-native client with no extra package and no
generated code to keep in step. The PyPI alternatives were checked and not taken: ``etcd3``
(last release 2020, thread-based grpc), ``aetcd`` (a single 1.0.0 release) and ``etcetra``
(last release 2024) are either unmaintained or too young to trust for the CP half.

What it does:

* **Endpoints and failover.** Calls go first to the member that answered last, then to the
  others in list order, members that failed within the last few seconds last. A member is
  checked with ``/v3/maintenance/status`` on a fresh connection (reachable, and it knows a
  leader) before a write when it has not answered within the last second; connections are
  given a short connect timeout, so a blackholed member costs a fraction of a request timeout,
  not all of it. Every request carries etcd's ``hasleader`` metadata, so a member cut off from
  its quorum answers "no leader" at once instead of hanging, and the next member is tried.
* **Request timeout.** Every unary call is bounded by ``request_timeout_ms``; when it runs
  out, or no member could take the call, :class:`~shoal.errors.CpUnavailable` is raised
  naming the cause. Reads (retry-safe) get a per-member deadline and move on. A write that may
  have reached etcd is never retried on another member, so a create-if-absent cannot report a
  wrong winner; but while it waits, its member is re-checked every probe interval on a fresh
  connection, and when that member has become unreachable or lost its leader the write fails
  at once (``CpUnavailable``, saying it may or may not have been applied), not after the
  whole timeout.
* **TLS** (``ca_file``, ``cert_file``/``key_file`` for client certificates) and **auth**
  (user/password → token from ``/v3/auth/authenticate``, sent as ``Authorization``;
  renewed once when etcd calls it invalid).
* **Watch** with resume: the stream asks for progress notifications (a managed member sends
  one every two seconds, see :mod:`shoal.cp.supervisor`) and is re-homed to another member,
  resuming from the last delivered revision + 1, when its member ends it ("no leader"), or
  nothing arrives for ``watch_idle_s`` and a status probe of its member fails (unreachable, no
  leader). A stream silent for ``watch_reopen_s`` although its member looks healthy is
  reopened all the same. Errors back off exponentially. When etcd answers
  ``compact_revision`` (the history is gone), the prefix is re-read and a
  :class:`~shoal.cp.store.Resync` yielded before watching on from after it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from shoal.cp.store import (
    CasResult,
    CpStore,
    EventKind,
    KeyValue,
    RangeResult,
    Resync,
    SiblingViews,
    TxnCompare,
    TxnResult,
    TxnWrite,
    WatchEvent,
    WatchItem,
    check_txn,
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


async def _results(resp: aiohttp.ClientResponse, idle_s: float,
                   on_idle: Callable[[], Awaitable[None]]) -> AsyncIterator[dict[str, Any]]:
    """The ``result`` objects of a gateway stream (newline-delimited JSON); an error raises.

    When nothing arrives for ``idle_s``, ``on_idle`` is awaited (it raises to end the stream).
    """
    buffer = b""
    while True:
        try:
            # Not asyncio.wait_for: on 3.11 it swallows a cancellation that arrives as the read
            # completes, and a watch that keeps receiving (progress every 2 s) would never stop.
            async with asyncio.timeout(idle_s):
                chunk = await resp.content.readany()
        except TimeoutError:
            await on_idle()
            continue
        if not chunk:
            return
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


class _Rehome(Exception):
    """A watch stream's member looks gone (unreachable, no leader): reopen on another one."""


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


class EtcdStore(CpStore):
    """A :class:`CpStore` on an etcd v3 cluster (``endpoints``: ``host:port`` or URLs).

    ``connect_timeout_ms`` and ``probe_timeout_ms`` default to a fraction of the request
    timeout (0.2-1 s and 0.25-1.5 s); ``fresh_ms`` is how long an answer vouches for a member
    before a write to it is preceded by a status probe; a member that failed is tried last for
    ``suspect_ms``.
    """

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
        watch_idle_s: float = 3.0,
        watch_reopen_s: float = 60.0,
        connect_timeout_ms: int | None = None,
        probe_timeout_ms: int | None = None,
        fresh_ms: int = 1000,
        suspect_ms: int = 5000,
        siblings: SiblingViews | None = None,
    ) -> None:
        super().__init__(siblings)
        if not endpoints:
            raise ValueError("an etcd store needs at least one endpoint")
        tls = bool(ca_file or cert_file)
        scheme = "https" if tls else "http"
        self.endpoints = [e.rstrip("/") if "://" in e else f"{scheme}://{e}" for e in endpoints]
        self.request_timeout_s = request_timeout_ms / 1000
        self.connect_timeout_s = (connect_timeout_ms / 1000 if connect_timeout_ms
                                  else _clamp(self.request_timeout_s / 5, 0.2, 1.0))
        self.probe_timeout_s = (probe_timeout_ms / 1000 if probe_timeout_ms
                                else _clamp(self.request_timeout_s / 4, 0.25, 1.5))
        self._fresh_s = fresh_ms / 1000
        self._suspect_s = suspect_ms / 1000
        self._ca_file, self._cert_file, self._key_file = ca_file, cert_file, key_file
        self._user, self._password = user, password
        self._backoff_initial_s = backoff_initial_ms / 1000
        self._backoff_max_s = backoff_max_ms / 1000
        self._watch_idle_s = watch_idle_s
        self._watch_reopen_s = watch_reopen_s
        self._current = 0  # the member that answered last: asked first
        self._answered: dict[int, float] = {}  # member index -> loop time of its last answer
        self._suspect_until: dict[int, float] = {}  # member index -> loop time it is tried last until
        self._token: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._probes: aiohttp.ClientSession | None = None  # fresh connection per probe
        self._probing: dict[int, asyncio.Future[str | None]] = {}  # member index -> its probe under way
        self._streams: set[aiohttp.ClientResponse] = set()  # open watch streams, cut on close()

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        ssl_context: ssl.SSLContext | bool = False
        if self._ca_file or self._cert_file:
            ssl_context = ssl.create_default_context(cafile=self._ca_file or None)
            if self._cert_file:
                ssl_context.load_cert_chain(self._cert_file, self._key_file or None)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context, limit=64))
        self._probes = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context, limit=16, force_close=True))

    async def close(self) -> None:
        session, self._session = self._session, None
        probes, self._probes = self._probes, None
        for stream in list(self._streams):
            stream.close()  # wakes a watch blocked on its stream; it then sees the store closed
        if session is not None:
            await session.close()
        if probes is not None:
            await probes.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise CpUnavailable("CP store unavailable: the etcd client is not started")
        return self._session

    # --- which member ---------------------------------------------------------------------------
    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _candidates(self) -> list[int]:
        """Member indexes in the order to try: the one that answered last, the others in list
        order, members that failed recently at the end."""
        now = self._now()
        order = [self._current, *(i for i in range(len(self.endpoints)) if i != self._current)]
        trusted = [i for i in order if self._suspect_until.get(i, 0.0) <= now]
        return trusted + [i for i in order if i not in trusted]

    def _mark_answered(self, index: int, preferred: bool = True) -> None:
        self._answered[index] = self._now()
        self._suspect_until.pop(index, None)
        if preferred:
            self._current = index

    def _mark_failed(self, index: int) -> None:
        self._answered.pop(index, None)
        self._suspect_until[index] = self._now() + self._suspect_s

    def _fresh(self, index: int) -> bool:
        return self._now() - self._answered.get(index, float("-inf")) < self._fresh_s

    async def _probe(self, index: int, timeout_s: float) -> str | None:
        """Ask member ``index`` for its status on a fresh connection: ``None`` when it answers
        and knows a leader, else the cause (unreachable, no answer, no leader). Callers asking
        about a member while a probe of it is under way share that probe."""
        running = self._probing.get(index)
        if running is None:
            running = asyncio.ensure_future(self._probe_once(index, timeout_s))
            self._probing[index] = running

            def forget(done: asyncio.Future[str | None], index: int = index) -> None:
                if self._probing.get(index) is done:
                    del self._probing[index]

            running.add_done_callback(forget)
        return await asyncio.shield(running)

    async def _probe_once(self, index: int, timeout_s: float) -> str | None:
        probes, endpoint = self._probes, self.endpoints[index]
        if probes is None:
            return "the etcd client is closed"
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(self.connect_timeout_s, timeout_s))
        try:
            async with probes.post(endpoint + "/v3/maintenance/status", json={}, timeout=timeout) as resp:
                text = await resp.text()
            answer = json.loads(text) if text else {}
        except aiohttp.ConnectionTimeoutError:
            return f"unreachable (no connection within {min(self.connect_timeout_s, timeout_s):g} s)"
        except aiohttp.ClientConnectorError as exc:
            return f"unreachable ({exc.os_error.strerror or exc})"
        except (aiohttp.ClientError, OSError) as exc:  # TimeoutError is an OSError
            return f"no status within {timeout_s:g} s" if isinstance(exc, TimeoutError) else f"status failed: {exc!r}"
        except ValueError:
            return f"not an etcd status answer (HTTP {resp.status})"
        if resp.status != 200 or not isinstance(answer, dict) or "error" in answer:
            return f"status refused (HTTP {resp.status}: {text[:120]})"
        errors = [str(e) for e in answer.get("errors") or []]
        if not int(answer.get("leader") or 0) or any("no leader" in e for e in errors):
            return "no leader (cut off from its quorum)"
        self._mark_answered(index, preferred=False)
        return None

    # --- one request ------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = dict(_REQUIRE_LEADER)
        if self._token:
            headers["Authorization"] = self._token
        return headers

    async def _post_once(self, endpoint: str, path: str, body: dict[str, Any], timeout_s: float,
                         retry_safe: bool) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(self.connect_timeout_s, timeout_s))
        try:
            async with self.session.post(endpoint + path, json=body, headers=self._headers(),
                                         timeout=timeout) as resp:
                text = await resp.text()
        except aiohttp.ConnectionTimeoutError as exc:
            raise _NotSent(f"{endpoint}: no connection within {self.connect_timeout_s:g} s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise _NotSent(f"{endpoint}: {exc.os_error.strerror or exc}") from exc
        except (aiohttp.ClientError, OSError) as exc:  # TimeoutError is an OSError
            cause = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            if retry_safe:
                raise _NotSent(f"{endpoint}: {cause}") from exc
            raise CpUnavailable(f"CP store unavailable: etcd at {endpoint} failed mid-request ({cause}); "
                                "the write may or may not have been applied") from exc
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

    async def _post_watched(self, index: int, path: str, body: dict[str, Any], deadline: float) -> dict[str, Any]:
        """A write to member ``index`` that gives up as soon as that member is found gone.

        It cannot be retried elsewhere (it may have been applied), but it need not wait the
        whole timeout on a member that stopped answering: every probe interval without an
        answer, the member is probed on a fresh connection; unreachable or leaderless fails it.
        """
        endpoint = self.endpoints[index]
        task = asyncio.ensure_future(self._post_once(endpoint, path, body, max(deadline - self._now(), 0.001),
                                                     False))
        try:
            while True:
                await asyncio.wait({task}, timeout=self.probe_timeout_s)
                if task.done():
                    return task.result()
                cause = await self._probe(index, max(min(self.probe_timeout_s, deadline - self._now()), 0.001))
                if cause is not None and not task.done():
                    raise CpUnavailable(f"CP store unavailable: etcd at {endpoint} {cause} while a write was in "
                                        "flight; the write may or may not have been applied")
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _call(self, path: str, body: dict[str, Any], retry_safe: bool = True) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the members in turn (see the module docstring), within
        the request timeout."""
        deadline = self._now() + self.request_timeout_s
        causes: list[str] = []
        reauthenticated = False
        candidates = self._candidates()
        position = 0
        while position < len(candidates):
            index = candidates[position]
            endpoint = self.endpoints[index]
            remaining = deadline - self._now()
            if remaining <= 0:
                causes.append(f"no answer within {self.request_timeout_s:g} s")
                break
            try:
                if not retry_safe and not self._fresh(index):
                    cause = await self._probe(index, min(self.probe_timeout_s, remaining))
                    if cause is not None:
                        raise _NotSent(f"{endpoint}: {cause}")
                if self._user and self._token is None and path != "/v3/auth/authenticate":
                    await self._authenticate(endpoint, max(deadline - self._now(), 0.001))
                if retry_safe:
                    last = position == len(candidates) - 1
                    budget = deadline - self._now()
                    # A hung member must leave time for the others: each but the last gets a share.
                    share = budget if last else max(budget / 2, min(budget, 2 * self.probe_timeout_s))
                    answer = await self._post_once(endpoint, path, body, max(share, 0.001), True)
                else:
                    answer = await self._post_watched(index, path, body, deadline)
                self._mark_answered(index)
                return answer
            except _NotSent as exc:
                causes.append(str(exc))
                self._mark_failed(index)
            except CpUnavailable:
                # It hung, failed mid-request or lost its member (a blackholed or minority
                # member): this call cannot be retried, and the next one goes elsewhere first.
                self._mark_failed(index)
                raise
            except _EtcdAnswer as exc:
                if exc.code == _UNAUTHENTICATED and self._user and not reauthenticated:
                    self._token, reauthenticated = None, True
                    continue
                if "no leader" in exc.message:
                    self._mark_failed(index)
                    causes.append(f"{endpoint}: {exc.message}")  # refused before it was applied
                elif exc.code in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
                    self._mark_failed(index)
                    if not retry_safe:
                        raise CpUnavailable(f"CP store unavailable: etcd at {endpoint}: {exc.message}") from None
                    causes.append(f"{endpoint}: {exc.message}")
                else:
                    raise EtcdError(f"etcd refused {path}: {exc.message}") from None
            position += 1
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

    async def txn(self, compares: Sequence[TxnCompare], writes: Sequence[TxnWrite]) -> TxnResult:
        """One etcd ``Txn`` through the gateway: the compares, the writes on success, a read of each
        compared key on failure. Its limits are etcd's defaults (:func:`check_txn`): an external
        cluster run with a lower ``--max-txn-ops`` refuses larger ones (EtcdError), whole."""
        check_txn(compares, writes)
        keys = [_b64(c.key.encode()) for c in compares]
        body = {
            "compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": str(c.mod_revision)}
                        for key, c in zip(keys, compares, strict=True)],
            "success": [{"request_delete_range": {"key": _b64(w.key.encode())}} if w.value is None
                        else {"request_put": {"key": _b64(w.key.encode()), "value": _b64(w.value)}} for w in writes],
            "failure": [{"request_range": {"key": key}} for key in keys],
        }
        answer = await self._call("/v3/kv/txn", body, retry_safe=False)
        revision = _revision(answer)
        responses = answer.get("responses") or []
        if answer.get("succeeded"):
            changed = any("response_put" in r or int(r.get("response_delete_range", {}).get("deleted", 0))
                          for r in responses)
            return TxnResult(True, changed, revision)
        current: list[KeyValue | None] = []
        for response in responses:
            kvs = response.get("response_range", {}).get("kvs") or []
            current.append(_kv(kvs[0]) if kvs else None)
        return TxnResult(False, False, revision, tuple(current))

    async def compact(self, revision: int) -> None:
        try:
            await self._call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        except EtcdError as exc:
            if "compacted" not in str(exc):  # already compacted past it: nothing to do
                raise

    async def _watch_member(self) -> int | None:
        """The member to open a watch on: the first candidate that vouches for itself."""
        for index in self._candidates():
            if self._session is None:
                return None
            if self._fresh(index) or await self._probe(index, self.probe_timeout_s) is None:
                return index
            self._mark_failed(index)
        return None

    async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[WatchItem]:
        raw = prefix.encode()
        next_revision = from_revision
        backoff = self._backoff_initial_s
        while self._session is not None:  # a closed store ends its watches
            index = await self._watch_member()
            if index is None:
                if self._session is None:
                    return
                log.info("etcd watch on %s: no member reachable with a leader; retrying from revision %d",
                         prefix, next_revision)
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, self._backoff_max_s)
                continue
            endpoint = self.endpoints[index]
            request = {"create_request": {"key": _b64(raw or b"\0"), "range_end": _b64(prefix_end(raw)),
                                          "start_revision": str(next_revision), "progress_notify": True}}
            heard = [self._now()]  # when the stream last delivered anything
            created = [False]  # the member confirmed the watch (a stream never confirmed is not trusted)

            async def on_idle(index: int = index, heard: list[float] = heard, created: list[bool] = created) -> None:
                if self._session is None:
                    raise _Rehome("the store is closed")
                if not created[0]:
                    # A member still starting can accept the request and never answer it, while
                    # its other calls already succeed: reopen instead of trusting the silence.
                    raise _Rehome(f"watch not confirmed within {self._watch_idle_s:g} s")
                if self._now() - heard[0] >= self._watch_reopen_s:
                    raise _Rehome(f"silent for {self._watch_reopen_s:g} s")
                if self._now() - self._answered.get(index, float("-inf")) < self._watch_idle_s:
                    return  # it answered (a call, or another view's probe) within the idle bound
                cause = await self._probe(index, self.probe_timeout_s)
                if cause is not None:
                    self._mark_failed(index)
                    raise _Rehome(cause)

            cause = "stream ended"
            try:
                if self._user and self._token is None:
                    await self._authenticate(endpoint, self.request_timeout_s)
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s,
                                                sock_read=None)
                async with self.session.post(endpoint + "/v3/watch", json=request, headers=self._headers(),
                                             timeout=timeout) as resp:
                    self._streams.add(resp)
                    try:
                        if resp.status != 200:
                            raise _EtcdAnswer(resp.status, f"HTTP {resp.status}: {(await resp.text())[:200]}")
                        async for result in _results(resp, self._watch_idle_s, on_idle):
                            heard[0] = self._now()
                            compacted = int(result.get("compact_revision", 0))
                            if compacted:
                                snapshot = await self.range(prefix)
                                log.info("etcd watch on %s: history before %d compacted; re-read at %d",
                                         prefix, compacted, snapshot.revision)
                                yield Resync(snapshot.revision, snapshot.items)
                                next_revision = snapshot.revision + 1
                                raise _EtcdAnswer(_OUT_OF_RANGE, "compacted; resumed after a re-read")
                            if result.get("created"):
                                created[0] = True
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
            except _Rehome as exc:
                if self._session is None:
                    return
                log.info("etcd watch on %s via %s: %s; re-homed, resuming from revision %d",
                         prefix, endpoint, exc, next_revision)
                continue  # another member at once: the next candidate was not the one that failed
            except _EtcdAnswer as exc:
                if exc.code == _UNAUTHENTICATED:
                    self._token = None
                if exc.code == _OUT_OF_RANGE:
                    continue  # a compaction re-read: watch on at once
                cause = exc.message
                if "no leader" in cause:
                    self._mark_failed(index)
            except (aiohttp.ClientError, OSError, ValueError, _NotSent, CpUnavailable, EtcdError) as exc:
                cause = repr(exc)
                if isinstance(exc, (aiohttp.ClientConnectionError, OSError)):
                    self._mark_failed(index)
            if self._session is None:
                return
            log.info("etcd watch on %s via %s interrupted (%s); resuming from revision %d",
                     prefix, endpoint, cause, next_revision)
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, self._backoff_max_s)
