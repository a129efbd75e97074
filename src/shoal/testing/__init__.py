"""Test support shipped with the package (as raft's ``testing.go`` or asyncpg's ``_testbase``),
used by ``tests/`` and ``bench/`` alike. Nothing here is imported by the server itself.

Imported from here (no dependency beyond the server's own):

* :func:`wait_until` / :func:`poll_until` — poll a condition with a deadline (async / blocking);
* :func:`make_registry` / :class:`Registry` — the model stack on a manual clock;
* :class:`SimCluster` — N Distro nodes in one process on an in-memory network;
* :class:`ServerProcess`, :func:`start_server`, :class:`ServerSet`, :func:`free_port_block` —
  real ``shoal server`` processes on loopback, always cleaned up;
* :class:`NodeCluster` and its presets :class:`CpCluster`, :class:`FaultCluster` — several real
  nodes on one member list (:mod:`shoal.testing.nodes`);
* :func:`call`, :func:`call_json`, :func:`call_with_headers`, :func:`http_get`, :func:`timed_call` —
  HTTP requests (:mod:`shoal.testing.http`);
* :class:`SparkStandalone`, :func:`spark_standalone` — a real standalone Spark master and workers
  on loopback for the analytics jobs (:mod:`shoal.testing.spark`; pyspark is imported only when one
  starts, and then needs the ``analytics`` extra and Java).

Imported from their modules (they need the ``dev`` extra or are specific):
:mod:`~shoal.testing.rawclient` (a Nacos gRPC client over grpc.aio that sends exactly the bytes a
test asks for), :mod:`~shoal.testing.h2client` (a frame-level HTTP/2 gRPC client),
:mod:`~shoal.testing.moving` (SDK-like clients that follow rebalancing), :mod:`~shoal.testing.etcd`
(real etcd members and clusters), :mod:`~shoal.testing.proxy` (a cuttable TCP proxy),
:mod:`~shoal.testing.faults` (signals, RSS, log checks, iptables partitions),
:mod:`~shoal.testing.load` (a node's ordinary traffic in the background, real clients: beats,
writers, SDK churn and a subscriber, console reads),
:mod:`~shoal.testing.certs` (a throw-away PKI), :mod:`~shoal.testing.ldap` (a real ``slapd``),
:mod:`~shoal.testing.ci` (skip here, fail in CI),
:mod:`~shoal.testing.openapi` (register and list over the v1 Open API), :mod:`~shoal.testing.auth`
(a node with an admin user, the v3 grant steps).
"""

from __future__ import annotations

from shoal.testing.cluster import SVC, SimCluster, SimNode
from shoal.testing.http import call, call_json, call_with_headers, http_get, timed_call
from shoal.testing.model import Registry, config_with, make_registry
from shoal.testing.nodes import CpCluster, FaultCluster, NodeCluster
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
    kill,
    metric_sum,
    metric_values,
    start_server,
)
from shoal.testing.spark import SparkStandalone, spark_standalone
from shoal.testing.wait import poll_until, wait_until

__all__ = [
    "NODE_OFFSETS",
    "OPEN",
    "OPEN_SETTINGS",
    "SECURE",
    "SECURE_SETTINGS",
    "SVC",
    "AuthMode",
    "CpCluster",
    "FaultCluster",
    "NodeCluster",
    "Registry",
    "ServerProcess",
    "ServerSet",
    "SimCluster",
    "SimNode",
    "SparkStandalone",
    "call",
    "call_json",
    "call_with_headers",
    "config_with",
    "free_port_block",
    "free_port_blocks",
    "http_get",
    "kill",
    "make_registry",
    "metric_sum",
    "metric_values",
    "poll_until",
    "spark_standalone",
    "start_server",
    "timed_call",
    "wait_until",
]
