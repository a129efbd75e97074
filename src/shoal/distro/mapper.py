"""Responsibility (Nacos DistroMapper, docs/protocol.md §6.3).

A connection client belongs to the node its connection lives on. An ip:port client belongs to
``healthy[distro_hash(ip:port) % len(healthy)]`` over the sorted UP+SUSPICIOUS member list, with
Java ``String.hashCode`` arithmetic (the ownership kernel), so Nacos and Shoal nodes agree.
:class:`IpPortHandoff` moves ip:port clients to their new owner when the healthy list changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shoal.clock import Clock
from shoal.distro import records
from shoal.distro.members import MemberManager
from shoal.kernels import ownership
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager


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
    """ip:port clients follow the hash: the new owner takes over, the old one keeps a copy
    (nothing is deleted because ownership moved; expiry or the owner's DELETE does that).

    Between two healthy lists only the clients the ownership kernel reports as moved are
    looked at; after a snapshot load (:meth:`reset`: no previous list) every ip:port client is.
    """

    def __init__(self, clock: Clock, clients: ClientManager, members: MemberManager, mapper: DistroMapper,
                 enqueue: Callable[[str, int], None]) -> None:
        self.clock = clock
        self.clients = clients
        self.members = members
        self.mapper = mapper
        self.enqueue = enqueue
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
            moved = ownership.moved_keys(tags, previous, healthy)
            ip_port = [ip_port[i] for i in moved]
            tags = [tags[i] for i in moved]
        owners = self.mapper.owners_of(tags)
        me = self.members.self_address
        for client, owner in zip(ip_port, owners, strict=True):
            mine = owner == me
            if mine and not client.native:
                client.native = True
                self.enqueue(client.client_id, records.OP_CHANGE)
            elif not mine and client.native:
                client.native = False
                client.owner = owner
                client.last_renew_ms = self.clock.monotonic_ms()
