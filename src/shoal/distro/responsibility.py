"""Who handles an ``ip:port`` (Nacos DistroFilter's question), as the transports and health ask it.

A :class:`Responsibility` answers ``owner_of("ip:port")``: None when this node handles it, else
the owner's HTTP ``ip:port``. The protocol and the standalone answer live in
:mod:`shoal.model.ip_port` (re-exported here); this module adds the clustered answers:

* :class:`MapperResponsibility` asks the Distro mapper (the production answer of a cluster);
* :class:`ForwardAllTo` is the test hook ``forward_all_to`` (``SHOAL_TEST_HOOKS``): one fixed owner
  for every ``ip:port``, so forwarding can be shown with two real processes.

HTTP forwarding (transport) and the beat checker (health) import them from here, so neither
reaches into the other.

When the owner does not answer a forwarded write in time, the forwarder asks a
:class:`ForwardFallback` what to do (docs/protocol.md §5.5): :class:`DistroFallback` counts the
failure against the owner and has this node handle the write itself, pending handoff. It also
tells the forwarder whenever an owner may have stopped answering (any member state change), so
that the forwards already waiting on that owner are released at once instead of each waiting
for its own timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from shoal.distro.mapper import IpPortHandoff
from shoal.distro.members import MemberManager, failure_text
from shoal.model.ip_port import Responsibility, Standalone

__all__ = ["DistroFallback", "ForwardAllTo", "ForwardFallback", "Mapper", "MapperResponsibility",
           "Responsibility", "Standalone"]


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


class ForwardFallback(Protocol):
    """What the HTTP forwarder does about an owner that does not answer (docs/protocol.md §5.5)."""

    def answering(self, owner: str) -> bool:
        """False when ``owner`` is known not to answer now: do not wait for it."""

    def attempt(self, owner: str) -> int:
        """A token for :meth:`failed`, taken when a forward to ``owner`` starts."""

    def failed(self, owner: str, attempt: int) -> None:
        """A forward to ``owner`` failed or timed out."""

    def handle_locally(self, tag: str) -> None:
        """This node is about to handle the write for ``tag`` itself."""

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever :meth:`answering` may have changed for some owner."""


class DistroFallback:
    """The cluster's :class:`ForwardFallback`: an owner is answering while it is UP here; a failed
    forward marks an UP owner SUSPICIOUS (one count per burst of forwards: reports and Distro
    calls take it further), and the write is handled here as a pending handoff."""

    def __init__(self, members: MemberManager, handoff: IpPortHandoff) -> None:
        self.members = members
        self.handoff = handoff

    def answering(self, owner: str) -> bool:
        return self.members.answering(owner)

    def attempt(self, owner: str) -> int:
        return self.members.attempt(owner)

    def failed(self, owner: str, attempt: int) -> None:
        if self.members.answering(owner):
            self.members.report_failed(owner, attempt=attempt, reason=failure_text("forwarded write"))

    def handle_locally(self, tag: str) -> None:
        self.handoff.adopt(tag)

    def subscribe(self, listener: Callable[[], None]) -> None:
        self.members.listeners.append(listener)  # called on every member state change
