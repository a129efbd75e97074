"""Operators' edits of ephemeral instances, laid over what their clients publish (Nacos's
``InstanceMetadata`` in ``NamingMetadataManager``, applied by ``InstanceUtil.updateInstanceMetadata``
when an instance is read).

An edit is kept apart from the client's publication, keyed by service and ``(ip, port,
cluster)``, and holds only what the operator set: the weight, the enabled flag, metadata keys
(``None``: a key the operator removed). Whatever publication carries that ``ip:port`` in that
cluster is shown with the edit on it, so a client that registers again (an SDK's redo on
another node) keeps the operator's state. Persistent instances are not edited here: their edits
are written to their own CP document (``service_layer/persistent.py``).

:class:`InstanceOverlays` is the one writer of the edits a node holds (fed from the CP store by
``service_layer/overlays.py``): each change publishes ``ServiceChanged``, so the service's view
is rebuilt with it and its subscribers are pushed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from shoal.model.events import EventBus, InstanceEdited, ServiceChanged
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey

#: ``(ip, port, cluster)``: which instance of a service an edit is laid over.
Target = tuple[str, int, str]


@dataclass(frozen=True, slots=True)
class InstanceOverlay:
    """What an operator set on one instance; None (and an absent key) leaves the published value."""

    weight: float | None = None
    enabled: bool | None = None
    #: key → value set by the operator, or None for a key the operator removed
    metadata: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.weight is None and self.enabled is None and not self.metadata

    def apply(self, inst: InstanceInfo) -> InstanceInfo:
        """``inst`` as readers see it with this edit on it (``inst`` itself when nothing differs)."""
        metadata = inst.metadata
        if self.metadata:
            merged = dict(inst.metadata)
            for key, value in self.metadata.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            if merged != inst.metadata:
                metadata = merged
        weight = inst.weight if self.weight is None else self.weight
        enabled = inst.enabled if self.enabled is None else self.enabled
        if weight == inst.weight and enabled == inst.enabled and metadata is inst.metadata:
            return inst
        return InstanceInfo(inst.ip, inst.port, weight, inst.healthy, enabled, inst.cluster, inst.instance_id,
                            metadata)


class InstanceOverlays:
    """The operators' edits this node knows, by service — and their only writer (:meth:`set`)."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._by_service: dict[ServiceKey, dict[Target, InstanceOverlay]] = {}

    def __len__(self) -> int:
        return sum(len(edits) for edits in self._by_service.values())

    def of(self, service: ServiceKey) -> Mapping[Target, InstanceOverlay] | None:
        """The edits of one service (None: none), live: read it without awaiting in between."""
        return self._by_service.get(service)

    def get(self, service: ServiceKey, target: Target) -> InstanceOverlay | None:
        edits = self._by_service.get(service)
        return edits.get(target) if edits is not None else None

    def items(self) -> Iterator[tuple[ServiceKey, Target, InstanceOverlay]]:
        """Every edit (a copy: the caller may change the edits while it iterates)."""
        return iter([(service, target, overlay) for service, edits in self._by_service.items()
                     for target, overlay in edits.items()])

    def apply(self, service: ServiceKey, inst: InstanceInfo) -> InstanceInfo:
        """``inst`` of ``service`` with its edit on it, if it has one."""
        edits = self._by_service.get(service)
        if edits is None:
            return inst
        overlay = edits.get((inst.ip, inst.port, inst.cluster))
        return inst if overlay is None else overlay.apply(inst)

    def set(self, service: ServiceKey, target: Target, overlay: InstanceOverlay | None, wall_ms: int) -> bool:
        """Lay ``overlay`` over ``target`` of ``service`` (None or empty: remove the edit); False
        when nothing changed. Publishes ServiceChanged: the view drops, subscribers are pushed."""
        edits = self._by_service.get(service)
        old = edits.get(target) if edits is not None else None
        if overlay is not None and overlay.empty:
            overlay = None
        if old == overlay:
            return False
        if overlay is None:
            assert edits is not None
            del edits[target]
            if not edits:
                del self._by_service[service]
        else:
            self._by_service.setdefault(service, {})[target] = overlay
        ip, port, cluster = target
        self._bus.publish(InstanceEdited(service, ip, port, cluster, describe(overlay), wall_ms))
        self._bus.publish(ServiceChanged(service, wall_ms))
        return True


def describe(overlay: InstanceOverlay | None) -> str:
    """What an edit sets, in words (the history log's reason): ``weight=3.0, enabled=false, metadata k=v, -gone``."""
    if overlay is None:
        return ""
    parts = []
    if overlay.weight is not None:
        parts.append(f"weight={overlay.weight}")
    if overlay.enabled is not None:
        parts.append(f"enabled={str(overlay.enabled).lower()}")
    parts.extend(f"metadata {k}={v}" if v is not None else f"metadata -{k}"
                 for k, v in sorted(overlay.metadata.items()))
    return ", ".join(parts)
