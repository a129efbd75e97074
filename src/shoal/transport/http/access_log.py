"""The HTTP access log, as Nacos writes one (Tomcat's ``server.tomcat.accesslog``).

One INFO record per request on the ``shoal.access`` logger, in Nacos's default pattern
(``%h %l %u %t "%r" %s %b %D %{User-Agent}i``, duration in ms) and with the fields as extras,
so the JSON log format carries them as keys: ``method``, ``path``, ``status``, ``duration_ms``,
``remote``, ``bytes``, ``user_agent``. Off unless ``server.tomcat.accesslog.enabled=true``
(Spring's default; the application.properties Nacos ships turns it on). Where the records go is
:mod:`shoal.logconfig`'s business.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from shoal.config import Config
from shoal.logutil import ACCESS_LOGGER

#: Query parameters whose values never reach the log: SDKs send login passwords (and every
#: call's token) in the query string.
SECRET_PARAMS = frozenset({"password", "newPassword", "accessToken"})


def logged_target(request: BaseRequest) -> str:
    """The request target as the log shows it: the path and query, secret values replaced by ``***``."""
    if not request.query_string or not any(name in request.query for name in SECRET_PARAMS):
        return request.path_qs
    pairs = parse_qsl(request.query_string, keep_blank_values=True)
    pairs = [(k, "***" if k in SECRET_PARAMS else v) for k, v in pairs]
    return f"{request.path}?{urlencode(pairs)}"


class NacosAccessLogger(AbstractAccessLogger):
    """aiohttp access logger writing Nacos's access-log line, with the fields as record extras."""

    def log(self, request: BaseRequest, response: StreamResponse, time_s: float) -> None:
        """Log one finished request (aiohttp calls this after the response is sent)."""
        duration_ms = round(time_s * 1000)  # the loop clock counts whole ms (uvloop), like Tomcat %D
        remote = request.remote or "-"
        size = response.body_length
        agent = request.headers.get("User-Agent", "-")
        stamp = time.strftime("%d/%b/%Y:%H:%M:%S %z")
        self.logger.info(
            '%s - - [%s] "%s %s HTTP/%d.%d" %d %d %d "%s"', remote, stamp, request.method, logged_target(request),
            request.version.major, request.version.minor, response.status, size, duration_ms, agent,
            extra={"method": request.method, "path": request.path, "status": response.status,
                   "duration_ms": duration_ms, "remote": remote, "bytes": size, "user_agent": agent},
        )

    @property
    def enabled(self) -> bool:
        """Whether the access logger writes INFO at all (skips the work when it does not)."""
        return self.logger.isEnabledFor(logging.INFO)


def runner_options(config: Config) -> dict[str, Any]:
    """Keyword arguments of ``web.AppRunner`` for the access log ``config`` asks for."""
    if not config.access_log_enabled:
        return {"access_log": None}
    return {"access_log": logging.getLogger(ACCESS_LOGGER), "access_log_class": NacosAccessLogger}
