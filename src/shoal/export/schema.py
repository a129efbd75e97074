"""Versioned Arrow schemas of a registry snapshot (instances, clients, services, change events).

A snapshot is the contract between a running node and everything offline (the PySpark jobs in
``shoal.analytics``, ad-hoc pyarrow/pandas notebooks): the analytics side imports this module and
the reader, never the server. The schemas are therefore versioned: any change that renames,
removes or retypes a column bumps :data:`SCHEMA_VERSION`, and readers refuse other versions with a
clear error instead of mis-reading columns. Adding a nullable column at the end is also a bump
(readers compare field lists exactly) so old readers never silently drop data.

Conventions: snake_case names; timestamps are int64 epoch milliseconds; ``port`` is int32;
metadata is ``map<string, string>`` (never null, possibly empty); a column is nullable only where
the value can be absent (e.g. ``last_beat_ms`` exists only for ip:port clients). Every table has a
``node`` column, always last (the exporting node's ``ip:port``; the writer fills it), so tables of
several nodes can be concatenated,
and every schema carries ``schema_version``, ``table``, ``node`` and ``taken_at_ms`` in its
key/value metadata (see :func:`with_snapshot_metadata`).
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = [
    "CLIENTS",
    "CLIENT_KINDS",
    "EVENTS",
    "EVENT_KINDS",
    "FILE_NAMES",
    "INSTANCES",
    "MANIFEST_NAME",
    "META_NODE",
    "META_SCHEMA_VERSION",
    "META_TABLE",
    "META_TAKEN_AT_MS",
    "SCHEMA_VERSION",
    "SERVICES",
    "TABLES",
    "TABLE_NAMES",
    "schema_for",
    "with_snapshot_metadata",
]

#: Bump on any change to a table's fields (names, order, types, nullability).
SCHEMA_VERSION: Final[int] = 1

META_SCHEMA_VERSION: Final[bytes] = b"schema_version"
META_TABLE: Final[bytes] = b"table"
META_NODE: Final[bytes] = b"node"
META_TAKEN_AT_MS: Final[bytes] = b"taken_at_ms"

MANIFEST_NAME: Final[str] = "manifest.json"

#: ``clients.kind``: a gRPC connection client (Nacos ``ConnectionBasedClient``) or an ip:port
#: client of the HTTP API (Nacos ``IpPortBasedClient``, id ``"ip:port#ephemeral"``), or the
#: per-service publisher of persistent instances built from the CP store.
CLIENT_KINDS: Final[tuple[str, ...]] = ("connection", "ip_port", "persistent")

#: ``events.kind``: what changed. ``sync_applied`` is a Distro sync from a peer applied locally.
EVENT_KINDS: Final[tuple[str, ...]] = (
    "register",
    "deregister",
    "health_flip",
    "sync_applied",
    "client_connected",
    "client_disconnected",
    "client_expired",
)

_METADATA = pa.map_(pa.string(), pa.string())


def _f(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


def _schema(table: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(
        fields,
        metadata={META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(), META_TABLE: table.encode()},
    )


#: One row per registered instance as this node sees it (its own clients' and synced ones).
INSTANCES: Final[pa.Schema] = _schema(
    "instances",
    [
        _f("namespace", pa.string()),
        _f("group", pa.string()),
        _f("service", pa.string()),
        _f("cluster", pa.string()),
        _f("ip", pa.string()),
        _f("port", pa.int32()),
        _f("weight", pa.float64()),
        _f("healthy", pa.bool_()),
        _f("enabled", pa.bool_()),
        _f("ephemeral", pa.bool_()),
        _f("metadata", _METADATA),
        _f("instance_id", pa.string(), nullable=True),
        _f("client_id", pa.string()),
        _f("owner_node", pa.string(), nullable=True),  # responsible Distro member, if known
        _f("client_revision", pa.int64()),
        _f("last_beat_ms", pa.int64(), nullable=True),  # ip:port clients only
        _f("last_renew_ms", pa.int64(), nullable=True),  # synced (non-native) clients only
        _f("node", pa.string()),
    ],
)

#: One row per client (publisher/subscriber session) known to this node.
CLIENTS: Final[pa.Schema] = _schema(
    "clients",
    [
        _f("client_id", pa.string()),
        _f("kind", pa.string()),  # one of CLIENT_KINDS
        _f("native", pa.bool_()),  # owned by (connected to / responsible on) this node
        _f("owner_node", pa.string(), nullable=True),
        _f("revision", pa.int64()),
        _f("client_ip", pa.string()),
        _f("connected_at_ms", pa.int64()),  # connection time, or creation time for ip:port clients
        _f("last_active_ms", pa.int64()),
        _f("last_renew_ms", pa.int64(), nullable=True),  # synced (non-native) clients only
        _f("published_services", pa.int32()),
        _f("subscribed_services", pa.int32()),
        _f("node", pa.string()),
    ],
)

#: One row per service (materialised ServiceInfo) on this node.
SERVICES: Final[pa.Schema] = _schema(
    "services",
    [
        _f("namespace", pa.string()),
        _f("group", pa.string()),
        _f("service", pa.string()),
        _f("ephemeral", pa.bool_()),
        _f("protect_threshold", pa.float64()),
        _f("metadata", _METADATA),
        _f("instance_count", pa.int32()),
        _f("healthy_count", pa.int32()),
        _f("subscriber_count", pa.int32()),
        _f("cluster_count", pa.int32()),
        _f("last_change_ms", pa.int64(), nullable=True),
        _f("node", pa.string()),
    ],
)

#: The node's bounded change-event log (oldest first), as far back as it still holds.
EVENTS: Final[pa.Schema] = _schema(
    "events",
    [
        _f("ts_ms", pa.int64()),
        _f("kind", pa.string()),  # one of EVENT_KINDS
        _f("namespace", pa.string(), nullable=True),
        _f("group", pa.string(), nullable=True),
        _f("service", pa.string(), nullable=True),
        _f("client_id", pa.string(), nullable=True),
        _f("ip", pa.string(), nullable=True),
        _f("port", pa.int32(), nullable=True),
        _f("healthy", pa.bool_(), nullable=True),  # the new state, for health_flip
        _f("detail", pa.string(), nullable=True),
        _f("node", pa.string()),
    ],
)

TABLES: Final[dict[str, pa.Schema]] = {
    "instances": INSTANCES,
    "clients": CLIENTS,
    "services": SERVICES,
    "events": EVENTS,
}
TABLE_NAMES: Final[tuple[str, ...]] = tuple(TABLES)
FILE_NAMES: Final[dict[str, str]] = {name: f"{name}.arrow" for name in TABLES}


def schema_for(table: str) -> pa.Schema:
    """The schema of ``table``; ``KeyError`` naming the known tables otherwise."""
    try:
        return TABLES[table]
    except KeyError:
        raise KeyError(f"unknown snapshot table {table!r}; known: {', '.join(TABLE_NAMES)}") from None


def with_snapshot_metadata(schema: pa.Schema, node: str, taken_at_ms: int) -> pa.Schema:
    """``schema`` with this snapshot's ``node`` and ``taken_at_ms`` added to its metadata."""
    meta = dict(schema.metadata or {})
    meta[META_NODE] = node.encode()
    meta[META_TAKEN_AT_MS] = str(int(taken_at_ms)).encode()
    return schema.with_metadata(meta)
