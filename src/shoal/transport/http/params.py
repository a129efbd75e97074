"""Request parameters as Nacos reads them: query string or form body alike, lenient in form
(``True``/``true``, blank = absent, metadata as JSON or ``k=v,k=v``), strict in type: every
value that does not parse is a 400 whose message names the parameter. Range and shape rules
(port, weight, names) are the service layer's, checked once there."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web
from multidict import MultiDictProxy

from shoal import jsonfast
from shoal.errors import InvalidParam, MissingParam, PayloadTooLarge
from shoal.model.keys import DEFAULT_CLUSTER, DEFAULT_GROUP, GROUP_SEPARATOR, ServiceKey, normalise_namespace
from shoal.service_layer import parse_metadata

_N = TypeVar("_N", int, float)
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})


class Params:
    """Query parameters first, then the form body (Spring's getParameter order)."""

    __slots__ = ("form", "query")

    def __init__(self, query: Mapping[str, str], form: Mapping[str, Any] | None = None) -> None:
        self.query = query
        self.form = form

    def get(self, name: str) -> str | None:
        value = self.query.get(name)
        if value is None and self.form is not None:
            raw = self.form.get(name)
            if raw is not None:
                if not isinstance(raw, str):
                    raise InvalidParam(f"Param '{name}' must be a plain form field, not a file.")
                value = raw
        return value

    def text(self, name: str, default: str = "") -> str:
        value = self.get(name)
        if value is None:
            return default
        value = value.strip()
        return value or default

    def required(self, name: str) -> str:
        value = self.text(name)
        if not value:
            raise MissingParam(name)
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if not value:
            return default
        lowered = value.lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
        raise InvalidParam(f"Param '{name}' must be true or false, got {shown(value)}.")

    def integer(self, name: str, default: int | None = None, low: int | None = None,
                high: int | None = None) -> int:
        number = self._parsed(name, default, int, "an integer")
        if (low is not None and number < low) or (high is not None and number > high):
            raise InvalidParam(f"Param '{name}' must be {bounds_text(low, high)}, got {number}.")
        return number

    def page_no(self, name: str = "pageNo", default: int | None = 1) -> int:
        """A page number as the v1/v2 lists read it: ``0`` and below are the first page (Nacos
        clamps the offset to 0: ``ServiceUtil.pageServiceName``, ``PageUtil.subPage``); a value
        that is not an integer is still a 400."""
        return max(self.integer(name, default), 1)

    def page_size(self, name: str = "pageSize", default: int | None = None, high: int | None = None) -> int:
        """A page size as the v1/v2 lists read it: below 0 is 0 (an empty page, as Nacos answers
        ``pageSize=0``), above ``high`` is ``high`` (v2's ``Math.min(500, pageSize)``)."""
        size = max(self.integer(name, default), 0)
        return size if high is None else min(size, high)

    def port(self, name: str = "port", default: int | None = None) -> int:
        """An integer port (its range is the service layer's rule)."""
        return self.integer(name, default)

    def number(self, name: str, default: float | None = None) -> float:
        number = self._parsed(name, default, float, "a number")
        if not math.isfinite(number):
            raise InvalidParam(f"Param '{name}' must be a finite number, got {self.text(name)!r}.")
        return number

    def _parsed(self, name: str, default: _N | None, convert: Callable[[str], _N], what: str) -> _N:
        """The parameter converted, the default when blank, MissingParam when blank without one."""
        value = self.text(name)
        if not value:
            if default is None:
                raise MissingParam(name)
            return default
        try:
            return convert(value)
        except ValueError:
            raise InvalidParam(f"Param '{name}' must be {what}, got {shown(value)}.") from None

    def weight(self, default: float | None = 1.0) -> float | None:
        """A finite number, or None when absent and no default (its range is the service layer's rule)."""
        if default is None and not self.text("weight"):
            return None
        return self.number("weight", default)

    def metadata(self, name: str = "metadata") -> dict[str, str] | None:
        """Nacos UtilsAndCommons.parseMetadata: a JSON object, else ``k1=v1,k2=v2``; None if absent."""
        value = self.text(name)
        if not value:
            return None
        return parse_metadata_text(value, name)

    def cluster(self) -> str:
        """``clusterName`` or ``cluster`` (HttpRequestInstanceBuilder), default ``DEFAULT``."""
        return self.text("clusterName") or self.text("cluster") or DEFAULT_CLUSTER

    def enabled(self, default: bool | None = True) -> bool | None:
        """``enabled``, else the 1.x spelling ``enable``."""
        if self.text("enabled"):
            return self.boolean("enabled", True)
        if self.text("enable"):
            return self.boolean("enable", True)
        return default

    # --- services ---------------------------------------------------------------------
    def v1_service(self) -> ServiceKey:
        """v1 ServiceNameFilter: ``serviceName`` may carry ``group@@``; else ``groupName`` (or
        DEFAULT_GROUP) is prefixed. The result must be ``group@@name`` with both parts."""
        raw = self.required("serviceName")
        grouped = raw if GROUP_SEPARATOR in raw else f"{self.text('groupName') or DEFAULT_GROUP}{GROUP_SEPARATOR}{raw}"
        parts = grouped.split(GROUP_SEPARATOR)
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise InvalidParam("Param 'serviceName' is illegal, it should be format as 'groupName@@serviceName'.")
        return ServiceKey(self.namespace(), parts[0], parts[1])

    def v2_service(self) -> ServiceKey:
        return ServiceKey(self.namespace(), self.text("groupName") or DEFAULT_GROUP, self.required("serviceName"))

    def namespace(self) -> str:
        return normalise_namespace(self.text("namespaceId"))


#: How much of a refused value an error message quotes: a 9 MB value must not come back as a 9 MB answer.
SHOWN_CHARS = 100


def shown(value: str) -> str:
    """``value`` as an error message quotes it: its repr, cut to :data:`SHOWN_CHARS` characters."""
    return repr(value) if len(value) <= SHOWN_CHARS else f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"


def bounds_text(low: int | None, high: int | None) -> str:
    """``between 1 and 500``, ``at least 1`` or ``at most 500``: an open bound is never named."""
    if low is not None and high is not None:
        return f"between {low} and {high}"
    if low is not None:
        return f"at least {low}"
    return f"at most {high}" if high is not None else "an integer"


def parse_metadata_text(value: str, name: str = "metadata") -> dict[str, str]:
    try:
        raw = jsonfast.loads(value)
    except ValueError:  # not JSON (or nested too deeply): the k1=v1,k2=v2 form is tried
        raw = None
    if isinstance(raw, dict):
        return dict(parse_metadata(raw, name))
    if raw is not None and not isinstance(raw, dict):
        raise InvalidParam(f"Param '{name}' must be a JSON object or k1=v1,k2=v2, got {shown(value)}.")
    out: dict[str, str] = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if not sep or "=" in val or not key:
            raise InvalidParam(f"Param '{name}' format incorrect: {shown(value)} (expected JSON or k1=v1,k2=v2).")
        out[key] = val
    return out


def refuse_declared_oversize(request: web.Request) -> None:
    """Raise :class:`PayloadTooLarge` before reading a body whose ``Content-Length`` is already over
    the limit: buffering it up to the limit first would cost the node that much memory per request
    for nothing (aiohttp then reads the rest of such a body into the void before closing)."""
    declared = request.content_length
    if declared is not None and declared > request.client_max_size:
        raise PayloadTooLarge(f"request body is larger than {request.client_max_size} bytes")


async def read_params(request: web.Request) -> Params:
    """The parameters of a request; the form body is read only when there is one."""
    query = request.query
    if not request.body_exists or request.content_type not in FORM_TYPES:
        return Params(query)
    refuse_declared_oversize(request)
    try:
        form: MultiDictProxy[Any] = await request.post()
    except (ValueError, UnicodeDecodeError, AssertionError) as exc:
        raise InvalidParam(f"request body is not a valid form: {exc}") from None
    except web.HTTPRequestEntityTooLarge:
        # Answered here, not by aiohttp: aiohttp keeps the HTTPException it answers in a reference
        # cycle (its handler frame holds it as the response), and the exception's traceback holds
        # the frames that read the body, up to the size limit, until the cycle collector runs: a
        # burst of oversized bodies grew the node by each body's size.
        raise PayloadTooLarge(f"request body is larger than {request.client_max_size} bytes") from None
    return Params(query, form)
