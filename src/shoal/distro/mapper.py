"""Responsibility (Nacos DistroMapper, spec §6.4).

A connection client belongs to the node its connection lives on. An ip:port client belongs to
``healthy[distro_hash(ip:port) % len(healthy)]`` over the sorted UP+SUSPICIOUS member list, with
Java ``String.hashCode`` arithmetic (the ownership kernel), so Nacos and Shoal nodes agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.distro.members import MemberManager
from shoal.kernels import ownership
from shoal.model.client import Client, ClientKind


def responsible_id(client_id: str) -> str:
    """``ip:port#true`` → ``ip:port`` (the part before ``#``)."""
    return client_id.partition("#")[0]


class DistroMapper:
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
        if self.members is None or not self.members.is_clustered():
            return True
        healthy = self.members.healthy_addresses()
        if self.self_address not in healthy:
            return True  # Nacos: a node outside the healthy list keeps serving what it gets
        return self.owner_of(tag) == self.self_address

    def responsible_client(self, client: Client) -> bool:
        if client.kind is ClientKind.CONNECTION:
            return client.native
        return self.responsible(responsible_id(client.client_id))

    @property
    def self_address(self) -> str:
        return self.members.self_address if self.members is not None else ""
