"""What a node's components show to :mod:`shoal.metrics`, read at scrape time.

The collectors of ``shoal.metrics`` know only plain figures (:class:`NamingFigures`,
:class:`ClusterFigures`); this module reads them from the model, the push engine, the SDK
connection table and Distro's own counters, without changing any of them. ``Node`` calls
:func:`watch_node` once. Everything here runs on the event loop, at scrape time only.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from shoal.metrics import (
    PUSH_BUCKETS,
    ClusterFigures,
    Metrics,
    NamingFigures,
    PeerSyncFigures,
    ReceivedSyncFigures,
)
from shoal.metrics_history import ChartSources, PeerSync, count_in_chunks
from shoal.model.client import Client, ClientKind

if TYPE_CHECKING:
    from shoal.app import Node
    from shoal.distro.protocol import DistroProtocol

#: Nacos's client "version" of each client kind (NamingSubAndPubMetricsCollector): persistent
#: instances are registered over the v1-era HTTP API or PersistentInstanceRequest and counted as v1.
VERSION_OF_KIND = {ClientKind.IP_PORT: "v1", ClientKind.PERSISTENT: "v1", ClientKind.CONNECTION: "v2"}


def watch_node(metrics: Metrics, node: Node) -> None:
    """Register the node's naming and cluster figures with ``metrics``."""
    metrics.add_naming(lambda: naming_figures(node))
    metrics.add_cluster(lambda: cluster_figures(node.distro))
    metrics.add_gauge("shoal_push_empty_protected_services",
                      "Services whose empty instance list is withheld from subscribers (empty-push protection)",
                      lambda: len(node.push.protected_services()))


def chart_sources(node: Node) -> ChartSources:
    """What the console's charts sample (:mod:`shoal.metrics_history`): the request counters, the
    push-ack histogram, the connection table, the clients' instances, each peer's Distro
    send queue and the last consistency check. Each is a read of a counter or a size."""
    distro = node.distro

    def peers() -> list[PeerSync]:
        if distro is None:
            return []
        return [PeerSync(q.target, len(q.pending), q.failed_batches) for q in list(distro.engine.queues.values())]

    return ChartSources(
        requests=node.metrics.requests_by_transport,
        push_buckets=node.metrics.push_ack_buckets,
        push_bounds=PUSH_BUCKETS,
        connections=lambda: len(node.sdk_connections),
        instances=lambda: count_in_chunks(node.clients, Client.instance_count),
        peers=peers,
        disagreements=lambda: node.disagreements.services,
    )


def naming_figures(node: Node) -> NamingFigures:
    """Counts of the model and the connection table (one pass over the clients)."""
    publishers = {"v1": 0, "v2": 0}
    subscribers = {"v1": 0, "v2": 0}
    ip_count = 0
    for client in node.clients:  # the one pass over every client a scrape makes here
        version = VERSION_OF_KIND[client.kind]
        publications = client.publications
        if publications:
            publishers[version] += len(publications)
            for publication in publications.values():
                ip_count += len(publication.instances)
        if client.subscriptions:
            subscribers[version] += len(client.subscriptions)
    by_module: dict[str, int] = {}
    for conn in list(node.sdk_connections.by_id.values()):
        module = conn.module
        if module and conn.registered:
            by_module[module] = by_module.get(module, 0) + 1
    return NamingFigures(
        service_count=len(node.services),
        ip_count=ip_count,
        subscriber_count=sum(len(s) for s in node.index.subscribers.values()),
        push_pending=len(node.push.pending),
        connections=node.sdk_connections.registered_count(),
        connections_by_module=by_module,
        publishers_by_version=publishers,
        subscribers_by_version=subscribers,
    )


def cluster_figures(distro: DistroProtocol | None) -> ClusterFigures | None:
    """Members, per-peer sync queues and verify counters (None when the node is standalone)."""
    if distro is None:
        return None
    members = distro.members
    peers = [PeerSyncFigures(q.target, len(q.pending), q.sent_batches, q.failed_batches, q.needs_full_verify,
                             q.sent_records)
             for q in sorted(distro.engine.queues.values(), key=lambda q: q.target)]
    received = [ReceivedSyncFigures(peer, r.batches, r.records, r.applied)
                for peer, r in sorted(distro.sync_receiver.received.items())]
    stats = distro.verify_stats
    return ClusterFigures(
        self_address=members.self_address,
        members=[(m.address, m.state.value) for m in members.all_members()],
        peers=peers,
        loaded=distro.loaded,
        verify_rounds=stats.rounds,
        verify_requests=stats.requests,
        verify_bytes=stats.bytes_sent,
        verify_repairs=stats.resynced,
        verify_mismatched={peer: r.get("mismatched", 0) for peer, r in stats.last_round.items()},
        received=received,
        write_waits=dict(sum((w.outcomes for w in (distro.barrier, distro.cp_siblings) if w is not None), Counter())),
    )
