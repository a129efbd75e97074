"""HTTP calls of the tests and benchmarks: one request, its status and its body, never a raise
for an error status.

:func:`call` is the one way to send a request (query ``params``, a form ``data`` body or a raw
``body``, ``headers``, an ``https`` context); the others are
its shapes: :func:`call_json` (the status checked, the body parsed), :func:`http_get` and
:func:`timed_call` (status 0 when no answer came, and the seconds it took: what a fault test
measures).
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

#: A query or form: values are sent as their ``str``.
Params = Mapping[str, Any]


def _encode(values: Params) -> str:
    return urllib.parse.urlencode({k: str(v) for k, v in values.items()})


def call(method: str, url: str, params: Params | None = None, data: Params | None = None, *,
         body: bytes | None = None, headers: Mapping[str, str] | None = None, timeout: float = 10.0,
         context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """One request: (status, body text). An error status is an answer; only a transport error
    (refused, reset, timed out) raises ``OSError``. :func:`call_with_headers` answers the
    response's headers too.

    ``params`` go in the query string (after any the ``url`` already has), ``data`` is sent as a
    form body, ``body`` as raw bytes (give its ``Content-Type`` in ``headers``); ``context`` is the
    client TLS context of an ``https://`` URL."""
    status, text, _ = call_with_headers(method, url, params, data, body=body, headers=headers, timeout=timeout,
                                        context=context)
    return status, text


def call_with_headers(method: str, url: str, params: Params | None = None, data: Params | None = None, *,
                      body: bytes | None = None, headers: Mapping[str, str] | None = None, timeout: float = 10.0,
                      context: ssl.SSLContext | None = None) -> tuple[int, str, dict[str, str]]:
    """:func:`call`, answering the response's headers too: (status, body text, headers)."""
    if params:
        url += ("&" if "?" in url else "?") + _encode(params)
    sent_headers = dict(headers or {})
    if data is not None:
        body = _encode(data).encode()
        sent_headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
    elif body is None and method in ("POST", "PUT", "PATCH"):
        body = b""
    request = urllib.request.Request(url, data=body, method=method, headers=sent_headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return int(resp.status), resp.read().decode(errors="replace"), dict(resp.headers.items())
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace"), dict(exc.headers.items())


def call_json(method: str, url: str, params: Params | None = None, data: Params | None = None, *,
              status: int = 200, **options: Any) -> Any:
    """:func:`call` that asserts the answer's ``status`` and returns its body parsed as JSON."""
    code, text = call(method, url, params, data, **options)
    assert code == status, f"{method} {url}: {code} {text}"
    return json.loads(text)


def http_get(url: str, timeout: float = 2.0, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """(status, body) of a GET (``https://`` with ``context``); HTTP errors are answers too, only
    transport errors raise."""
    return call("GET", url, timeout=timeout, context=context)


def timed_call(method: str, url: str, params: Params | None = None, *, timeout: float = 15.0,
               **options: Any) -> tuple[int, str, float]:
    """:func:`call` that never raises: (status, text, seconds), status 0 (and the error as text)
    when no answer came in time — a client-visible failure, what a fault test measures."""
    started = time.monotonic()
    try:
        status, text = call(method, url, params, timeout=timeout, **options)
    except (OSError, http.client.HTTPException) as exc:
        return 0, repr(exc), time.monotonic() - started
    return status, text, time.monotonic() - started
