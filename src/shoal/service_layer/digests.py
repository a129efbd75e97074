"""Which node is stale (issue 23 item 4): a stable digest of every service as this node serves
it, and the comparison of several members' digests.

A service's digest hashes its instances as a query would see them before selection: address,
cluster, weight, health, enabled and metadata, in a fixed order, so two nodes that hold the same
instances give the same digest whatever order they learnt them in. Services without instances
are left out (the empty-service cleaner removes them at each node's own pace).

:func:`compare` groups the members by the digest they give each service; :func:`persistent`
keeps only what two rounds taken a moment apart both show, so a write still being replicated is
not called a disagreement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceManager, ServiceStorage

#: What a member gives one service: (digest, instance count).
Digest = tuple[str, int]
#: One member's digests by service name (``namespace/group@@name``); None: the member did not answer.
MemberDigests = Mapping[str, Digest] | None
ABSENT: Digest = ("absent", 0)


def service_name(key: ServiceKey) -> str:
    """How a service is named in digests and reports."""
    return f"{key.namespace or 'public'}/{key.grouped_name}"


def digest_of(instances: Iterable[InstanceInfo]) -> Digest:
    """The digest of one service's instances (order-independent)."""
    rows = sorted(
        (inst.cluster, inst.ip, inst.port, repr(float(inst.weight)), inst.healthy, inst.enabled,
         tuple(sorted(inst.metadata.items())))
        for inst in instances)
    return hashlib.blake2b(repr(rows).encode(), digest_size=8).hexdigest(), len(rows)


class ServiceDigests:
    """The read use case: this node's digest of each service."""

    def __init__(self, services: ServiceManager, storage: ServiceStorage) -> None:
        self.services = services
        self.storage = storage

    def digests(self, only: str = "") -> dict[str, Digest]:
        """Every service with instances (or only the one named ``only``) → its digest."""
        out: dict[str, Digest] = {}
        for record in list(self.services):
            name = service_name(record.key)
            if only and name != only and record.key.grouped_name != only and record.key.name != only:
                continue
            instances = self.storage.view(record.key).instances
            if instances:
                out[name] = digest_of(instances)
        return out


@dataclass
class Comparison:
    """What the members' digests say: services on which they disagree (service → digest →
    members holding it) and members that did not answer."""

    members: list[str]
    services: int = 0
    disagree: dict[str, dict[Digest, list[str]]] = field(default_factory=dict)
    unanswered: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not self.disagree and not self.unanswered

    def per_member(self) -> dict[str, int]:
        """Services on which each member differs from the majority (ties: every holder)."""
        counts = dict.fromkeys(self.members, 0)
        for groups in self.disagree.values():
            largest = max(len(m) for m in groups.values())
            majority = [d for d, m in groups.items() if len(m) == largest]
            for digest, holders in groups.items():
                if digest not in majority or len(majority) > 1:
                    for member in holders:
                        counts[member] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "members": self.members, "services": self.services, "agree": self.agree,
            "unanswered": self.unanswered, "disagreementsPerMember": self.per_member(),
            "disagree": [{"service": name, "groups": [
                {"digest": d[0], "instances": d[1], "members": holders} for d, holders in groups.items()]}
                for name, groups in sorted(self.disagree.items())],
        }


def compare(by_member: Mapping[str, MemberDigests]) -> Comparison:
    """Group the answering members by the digest they give each service; a member that lacks a
    service the others have holds :data:`ABSENT` for it."""
    answered = {m: d for m, d in by_member.items() if d is not None}
    result = Comparison(list(by_member), unanswered=[m for m, d in by_member.items() if d is None])
    names = sorted({name for digests in answered.values() for name in digests})
    result.services = len(names)
    for name in names:
        groups: dict[Digest, list[str]] = {}
        for member, digests in answered.items():
            groups.setdefault(digests.get(name, ABSENT), []).append(member)
        if len(groups) > 1:
            result.disagree[name] = groups
    return result


def parse_digests(data: Any) -> dict[str, Digest] | None:
    """A member's ``services`` object from its digests answer; None when it is not one."""
    if not isinstance(data, dict):
        return None
    out: dict[str, Digest] = {}
    for name, value in data.items():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                and isinstance(value[1], int)):
            return None
        out[str(name)] = (value[0], value[1])
    return out


def persistent(first: Comparison, second: Comparison) -> Comparison:
    """What both rounds show: the second round's groups of the services that disagreed in both,
    and the members that answered neither time. A member that did not answer the first round
    has nothing to confirm its second answer against: what the second round shows is kept when
    such a member is in it (a paused node resumed with a stale list is not called in agreement)."""
    late = set(first.unanswered) - set(second.unanswered)
    second.disagree = {name: groups for name, groups in second.disagree.items()
                       if name in first.disagree or late}
    second.unanswered = [m for m in second.unanswered if m in first.unanswered]
    return second
