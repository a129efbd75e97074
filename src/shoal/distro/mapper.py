"""Responsibility (Nacos DistroMapper, docs/protocol.md §6.3).

A connection client belongs to the node its connection lives on. An ip:port client belongs to
``healthy[distro_hash(ip:port) % len(healthy)]`` over the sorted UP+SUSPICIOUS member list, with
Java ``String.hashCode`` arithmetic (the ownership kernel), so Nacos and Shoal nodes agree.
:class:`IpPortHandoff` moves ip:port clients to their responsible node: when the healthy list
changes, and when a node holds one it is not responsible for (a write it handled because the
responsible node did not answer, docs/protocol.md §5.5).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from shoal.clock import Clock
from shoal.distro import records
from shoal.distro.members import MemberManager
from shoal.kernels import ownership
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager

log = logging.getLogger(__name__)


def responsible_id(client_id: str) -> str:
    """``ip:port#true`` → ``ip:port`` (the part before ``#``)."""
    return client_id.partition("#")[0]


class DistroMapper:
    """Answers who is responsible for a client or an ``ip:port`` tag."""

    def __init__(self, members: MemberManager | None) -> None:
        self.members = members

    def owner_of(self, tag: str) -> str:
        """The address of the node responsible for ``tag`` (this node when standalone)."""
        if self.members is None or not self.members.is_clustered():
            return self.self_address
        healthy = self.members.healthy_addresses()
        if not healthy:
            return self.self_address
        return healthy[ownership.distro_hash(tag) % len(healthy)]

    def owners_of(self, tags: Sequence[str]) -> list[str]:
        """Batch form of :meth:`owner_of` (one kernel call)."""
        if self.members is None or not self.members.is_clustered():
            return [self.self_address] * len(tags)
        healthy = self.members.healthy_addresses()
        if not healthy:
            return [self.self_address] * len(tags)
        return [healthy[i] for i in ownership.owner_indices(tags, len(healthy))]

    def responsible(self, tag: str) -> bool:
        """True when this node handles the ``ip:port`` ``tag`` (always, standalone)."""
        if self.members is None or not self.members.is_clustered():
            return True
        healthy = self.members.healthy_addresses()
        if self.self_address not in healthy:
            return True  # Nacos: a node outside the healthy list keeps serving what it gets
        return self.owner_of(tag) == self.self_address

    def responsible_client(self, client: Client) -> bool:
        """Connection clients: their own node; ip:port clients: the hash owner; persistent
        clients: nobody (every node builds them from the CP store, Distro never sends them)."""
        if not client.replicated:
            return False
        if client.kind is ClientKind.CONNECTION:
            return client.native
        return self.responsible(responsible_id(client.client_id))

    @property
    def self_address(self) -> str:
        return self.members.self_address if self.members is not None else ""


class IpPortHandoff:
    """Exactly one node holds each ip:port client *natively* (runs its beat check, syncs and
    verifies it): the responsible one, once it has the client (docs/protocol.md §6.3).

    A node may hold an ip:port client natively without being responsible for it: ownership
    moved away (the healthy list changed), or it handled a write the responsible node did not
    answer in time (§5.5). Such a client is *pending handoff*: it stays native here (so it is
    neither lost nor left to expire) and is sent to the responsible node, again every
    :meth:`retry` round, until the responsible node confirms by sending its own copy (the
    processor then turns ours into a copy of it). The responsible node takes over any ip:port
    client a peer sends it (see :meth:`take_over`).

    Between two healthy lists only the clients the ownership kernel reports as moved (and the
    pending ones) are looked at; after a snapshot load (:meth:`reset`: no previous list) every
    ip:port client is.
    """

    def __init__(self, clock: Clock, clients: ClientManager, members: MemberManager, mapper: DistroMapper,
                 enqueue: Callable[..., None]) -> None:
        self.clock = clock
        self.clients = clients
        self.members = members
        self.mapper = mapper
        self.enqueue = enqueue
        self.pending: set[str] = set()
        self._last_healthy: list[str] | None = list(members.healthy_addresses())

    def reset(self) -> None:
        """Forget the previous healthy list: the next :meth:`refresh` evaluates every client."""
        self._last_healthy = None

    def refresh(self) -> None:
        """Take over the ip:port clients this node now owns; hand over those it no longer does."""
        healthy = list(self.members.healthy_addresses())
        previous, self._last_healthy = self._last_healthy, healthy
        ip_port = [c for c in self.clients if c.kind is ClientKind.IP_PORT]
        if not ip_port:
            return
        tags = [responsible_id(c.client_id) for c in ip_port]
        if previous is not None and previous and healthy:
            moved = set(ownership.moved_keys(tags, previous, healthy))
            keep = [i for i, c in enumerate(ip_port) if i in moved or c.client_id in self.pending]
            ip_port = [ip_port[i] for i in keep]
            tags = [tags[i] for i in keep]
        owners = self.mapper.owners_of(tags)
        me = self.members.self_address
        for client, owner in zip(ip_port, owners, strict=True):
            mine = owner == me
            if mine:
                self.pending.discard(client.client_id)
                if not client.native:
                    self.clients.set_native(client, True)
                    self.enqueue(client.client_id, records.OP_CHANGE)
            elif client.native:  # hand it over; it stays ours until the new owner confirms
                self.pending.add(client.client_id)
                self.enqueue(client.client_id, records.OP_CHANGE, [owner])

    def note(self, client: Client) -> None:
        """A native ip:port client changed: remember it if another node is responsible for it."""
        if client.kind is ClientKind.IP_PORT and client.native and not self.mapper.responsible_client(client):
            self.pending.add(client.client_id)

    def adopt(self, tag: str) -> None:
        """This node handles a write for ``tag`` that its responsible node did not take in time:
        the client (if this node holds a copy) becomes native here, pending handoff."""
        client = self.clients.get(f"{tag}#true")
        if client is not None and client.kind is ClientKind.IP_PORT:
            self.clients.set_native(client, True)
            self.note(client)

    def take_over(self, client: Client) -> None:
        """A peer sent an ip:port client this node is responsible for: hold it natively and tell
        every peer (the sender's pending copy becomes a copy of ours)."""
        if client.kind is not ClientKind.IP_PORT or client.native or not self.mapper.responsible_client(client):
            return
        self.clients.set_native(client, True)
        self.pending.discard(client.client_id)
        self.enqueue(client.client_id, records.OP_CHANGE)

    def confirmed(self, client_id: str) -> None:
        """The responsible node sent its copy: ours is a copy now."""
        self.pending.discard(client_id)

    def retry(self) -> int:
        """Send every pending client to its responsible node again; returns how many were sent."""
        sent = 0
        me = self.members.self_address
        for client_id in list(self.pending):
            client = self.clients.get(client_id)
            if client is None or not client.native:
                self.pending.discard(client_id)
                continue
            owner = self.mapper.owner_of(responsible_id(client_id))
            if owner == me or self.mapper.responsible_client(client):
                self.pending.discard(client_id)
                continue
            self.enqueue(client_id, records.OP_CHANGE, [owner], delay_ms=0)
            sent += 1
        if sent:
            log.info("handing %d ip:port clients over to their responsible nodes", sent)
        return sent
