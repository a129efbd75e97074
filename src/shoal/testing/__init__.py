"""Test support shipped with the package (as raft's ``testing.go`` or asyncpg's ``_testbase``).

* :func:`wait_until` / :func:`poll_until` — poll a condition with a deadline (async / blocking);
* :func:`make_registry` / :class:`Registry` — the model stack on a manual clock;
* :class:`SimCluster` — N Distro nodes in one process on an in-memory network;
* :class:`ServerProcess`, :func:`start_server`, :class:`ServerSet`, :func:`free_port_block` —
  real ``shoal server`` processes on loopback, always cleaned up.

Nothing here is imported by the server itself.
"""

from __future__ import annotations

from shoal.testing.cluster import SVC, SimCluster, SimNode
from shoal.testing.model import Registry, config_with, make_registry
from shoal.testing.procs import (
    NODE_OFFSETS,
    OPEN,
    OPEN_SETTINGS,
    SECURE,
    SECURE_SETTINGS,
    AuthMode,
    ServerProcess,
    ServerSet,
    free_port_block,
    free_port_blocks,
    http_get,
    kill,
    metric_sum,
    metric_values,
    start_server,
)
from shoal.testing.wait import poll_until, wait_until

__all__ = [
    "NODE_OFFSETS",
    "OPEN",
    "OPEN_SETTINGS",
    "SECURE",
    "SECURE_SETTINGS",
    "SVC",
    "AuthMode",
    "Registry",
    "ServerProcess",
    "ServerSet",
    "SimCluster",
    "SimNode",
    "config_with",
    "free_port_block",
    "free_port_blocks",
    "http_get",
    "kill",
    "make_registry",
    "metric_sum",
    "metric_values",
    "poll_until",
    "start_server",
    "wait_until",
]
