"""Who handles an ``ip:port`` (Nacos DistroFilter's question), as the transports and health ask it.

A :class:`Responsibility` answers ``owner_of("ip:port")``: None when this node handles it, else
the owner's HTTP ``ip:port``. The protocol and the standalone answer live in
:mod:`shoal.model.ip_port` (re-exported here); this module adds the clustered answers:

* :class:`MapperResponsibility` asks the Distro mapper (the production answer of a cluster);
* :class:`ForwardAllTo` is the test hook ``forward_all_to`` (``SHOAL_TEST_HOOKS``): one fixed owner
  for every ``ip:port``, so forwarding can be shown with two real processes.

HTTP forwarding (transport) and the beat checker (health) import them from here, so neither
reaches into the other.
"""

from __future__ import annotations

from typing import Protocol

from shoal.model.ip_port import Responsibility, Standalone

__all__ = ["ForwardAllTo", "Mapper", "MapperResponsibility", "Responsibility", "Standalone"]


class Mapper(Protocol):
    """What a Distro mapper offers (``responsible`` + ``owner_of`` returning an address)."""

    def responsible(self, tag: str) -> bool: ...

    def owner_of(self, tag: str) -> str: ...


class MapperResponsibility:
    """Responsibility over a Distro mapper: None when this node is responsible."""

    def __init__(self, mapper: Mapper) -> None:
        self.mapper = mapper

    def owner_of(self, tag: str) -> str | None:
        return None if self.mapper.responsible(tag) else self.mapper.owner_of(tag)


class ForwardAllTo:
    """TEST HOOK (``TestHooks.forward_all_to``): one node owns every ``ip:port``."""

    def __init__(self, address: str) -> None:
        self.address = address

    def owner_of(self, tag: str) -> str | None:
        return self.address
