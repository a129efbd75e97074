"""The rows of the instance history log and how they are read back (issue 23 item 5).

A leaf module (standard library only): the node's log (:mod:`shoal.export.history`), its HTTP
route, the ``shoal history`` CLI and the ``shoal analytics history`` job all use these names, so
a row means the same thing everywhere.

One row is one JSON object on one line of a segment file. Every row has ``ts`` (wall ms),
``node`` (the node that wrote it) and ``kind``; instance rows add ``ns``, ``group``,
``service``, ``ip``, ``port``, ``cluster``, ``client``, ``owner`` (the node holding the client's
authoritative state), ``source`` (``http``, ``grpc``, ``grpc-batch``, ``persistent``, or
``distro`` for a copy synced from its owner) and ``reason``; a register or edit row also carries
``weight``, ``healthy``, ``enabled`` and ``metadata``. A ``push`` row carries the subscriber
(``client``), the service, ``digest`` (the pushed list's revision), ``sent``, ``acked`` (null when
no ack came) and ``result``, and ``hosts`` (the pushed list) the first time its digest appears in
a segment, so every segment answers on its own what a subscriber held.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any

#: Instance row kinds, in the words the lifecycle uses.
REGISTER = "register"
UPDATE = "update"
DEREGISTER = "deregister"
EXPIRE = "expire"
HEALTH = "health"
OWNERSHIP = "ownership"
PUSH = "push"
#: an operator edit laid over the instance (or removed): not the client's own write
EDIT = "edit"

INSTANCE_KINDS = frozenset({REGISTER, UPDATE, EDIT, DEREGISTER, EXPIRE, HEALTH, OWNERSHIP})

DEFAULT_NAMESPACE = "public"
DEFAULT_GROUP = "DEFAULT_GROUP"


def parse_service(text: str) -> tuple[str, str, str]:
    """``name``, ``group@@name`` or ``namespace/group@@name`` → (namespace, group, name)."""
    namespace, slash, rest = text.partition("/")
    if not slash:
        namespace, rest = DEFAULT_NAMESPACE, text
    group, at, name = rest.partition("@@")
    if not at:
        group, name = DEFAULT_GROUP, rest
    if not name or not namespace or not group:
        raise ValueError(f"not a service name: {text!r} (name, group@@name or namespace/group@@name)")
    return namespace, group, name


def service_label(row: Mapping[str, Any]) -> str:
    grouped = f"{row.get('group')}@@{row.get('service')}"
    return grouped if row.get("ns") == DEFAULT_NAMESPACE else f"{row.get('ns')}/{grouped}"


def matches(row: Mapping[str, Any], service: tuple[str, str, str] | None, ip: str = "",
            since_ms: int = 0) -> bool:
    """Whether an instance row belongs to the query (service, optional ip, not before ``since_ms``)."""
    if row.get("kind") not in INSTANCE_KINDS or int(row.get("ts") or 0) < since_ms:
        return False
    if service is not None and (row.get("ns"), row.get("group"), row.get("service")) != service:
        return False
    return not ip or row.get("ip") == ip


def format_time(ms: int | None) -> str:
    """Wall ms → ``2026-11-27 20:10:03.250Z`` (UTC)."""
    if ms is None:
        return "-"
    at = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def parse_time(text: str, now_ms: int) -> int:
    """A point in time: epoch ms, ISO 8601 (UTC unless it says otherwise), or a span back from now
    (``90s``, ``15m``, ``2h``, ``1d``)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    if text[:-1].isdigit() and text[-1:] in units:
        return now_ms - int(text[:-1]) * units[text[-1]]
    try:
        at = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (epoch ms, ISO 8601, or a span back from now such as 15m)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=_dt.UTC)
    return int(at.timestamp() * 1000)


def _by(row: Mapping[str, Any]) -> str:
    source = row.get("source") or "?"
    where = f" on node {row.get('owner')}" if row.get("owner") else ""
    return f"by client {row.get('client')} ({source}){where}"


def describe(row: Mapping[str, Any]) -> str:
    """One lifecycle step in words."""
    kind, at, reason = row.get("kind"), format_time(row.get("ts")), row.get("reason") or ""
    seen = f" [seen on {row.get('node')}]" if row.get("node") and row.get("node") != row.get("owner") else ""
    because = f": {reason}" if reason else ""
    if kind == REGISTER:
        values = f" weight {row.get('weight')}, {'healthy' if row.get('healthy') else 'unhealthy'}"
        values += "" if row.get("enabled", True) else ", disabled"
        return f"registered {_by(row)} at {at} ({values.strip()}){seen}"
    if kind == UPDATE:
        return (f"edited at {at}: weight {row.get('weight')}, enabled {row.get('enabled')}, "
                f"metadata {row.get('metadata')}{seen}")
    if kind == EDIT:
        return f"operator edit at {at}: {reason}{seen}" if reason else f"operator edit removed at {at}{seen}"
    if kind == DEREGISTER:
        return f"deregistered at {at}{because} ({_by(row)}){seen}"
    if kind == EXPIRE:
        return f"expired at {at}{because} ({_by(row)}){seen}"
    if kind == HEALTH:
        return f"marked {'healthy' if row.get('healthy') else 'unhealthy'} at {at}{because}{seen}"
    if kind == OWNERSHIP:
        return f"{reason or 'changed hands'} at {at} (client {row.get('client')}){seen}"
    return f"{kind} at {at}{because}"


def lifecycles(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Instance rows grouped by ``service ip:port``, each in time order."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (int(r.get("ts") or 0), str(r.get("node") or ""))):
        out.setdefault(f"{service_label(row)} {row.get('ip')}:{row.get('port')}", []).append(row)
    return out


def render(rows: Iterable[Mapping[str, Any]]) -> str:
    """The text ``shoal history`` prints: one paragraph per instance."""
    lines: list[str] = []
    for key, steps in lifecycles(rows).items():
        lines.append(key)
        lines.extend(f"  {describe(step)}" for step in steps)
    return "\n".join(lines) if lines else "no history for that instance in the log"


def render_held(answer: Mapping[str, Any]) -> str:
    """The text of ``shoal history --subscriber C --at T``."""
    head = f"subscriber {answer.get('subscriber')} at {format_time(answer.get('at'))}"
    held = answer.get("services") or []
    if not held:
        return f"{head}: no acknowledged push at or before that time in the log"
    lines = [head + ":"]
    for entry in held:
        hosts = entry.get("hosts")
        lines.append(f"  {entry.get('service')}: revision {entry.get('digest')}, "
                     f"pushed {format_time(entry.get('sent'))}, acked {format_time(entry.get('acked'))}")
        if hosts is None:
            lines.append("    (the list itself has rotated out of the log)")
            continue
        if not hosts:
            lines.append("    (empty list)")
        for h in hosts:
            state = "healthy" if h.get("healthy") else "unhealthy"
            state += "" if h.get("enabled", True) else ", disabled"
            lines.append(f"    {h.get('ip')}:{h.get('port')} weight {h.get('weight')} {state} "
                         f"cluster {h.get('cluster')}")
    return "\n".join(lines)
