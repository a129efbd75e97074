"""Operators' edits of ephemeral instances, kept in the CP store (Nacos's instance metadata:
``InstanceOperatorClientImpl.updateInstance`` / ``batchUpdateMetadata`` → ``NamingMetadataOperateService``,
``ExpiredMetadataCleaner``).

An edit (weight, enabled, metadata keys set or removed) of an ephemeral instance is one document
of :attr:`Keyspace.INSTANCE_EDITS` named ``<namespace>/<group>@@<service>/<cluster>/<ip>:<port>``,
holding only what operators set. It is not written into the client's publication: every node
watches the documents and lays each over whatever publication carries that ``ip:port`` in that
cluster (:mod:`shoal.model.overlays`), so the edit survives the client registering again, on any
node (an SDK's redo after its node died), and the restart of any node. The writes of every
operator route (v1/v2 ``PUT /instance``, the console's ``PATCH``, v2 ``PATCH``, the metadata
batch, the v3 admin and console ``PUT``) come here through :class:`InstanceOperations`.

An edit whose instance is gone (no publication of it on this node) is removed by
:meth:`InstanceEdits.clean` once it has been gone for ``nacos.naming.clean.expired-metadata.expired-time``
(60 s), checked every ``...expired-metadata.interval`` (5 s); an instance registered again
within that time keeps it (as Nacos).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.cp.store import CpView
from shoal.errors import Conflict, CpUnavailable, InvalidParam, NotFound
from shoal.model.client import ClientKind
from shoal.model.instance import InstanceInfo
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.model.overlays import InstanceOverlay, InstanceOverlays, Target
from shoal.model.services import ServiceManager
from shoal.service_layer.persistent import instance_name
from shoal.service_layer.reads import NamingReads
from shoal.service_layer.validation import InstanceValidator, check_port

log = logging.getLogger(__name__)

#: How often an edit that lost a race with another writer of the same instance is worked out again.
EDIT_ATTEMPTS = 16


def edit_doc(service: ServiceKey, target: Target, overlay: InstanceOverlay) -> dict[str, Any]:
    """The stored document of an edit: the instance it names and what the operator set."""
    ip, port, cluster = target
    doc: dict[str, Any] = {"namespace": service.namespace, "group": service.group, "service": service.name,
                           "cluster": cluster, "ip": ip, "port": port, "metadata": dict(overlay.metadata)}
    if overlay.weight is not None:
        doc["weight"] = float(overlay.weight)
    if overlay.enabled is not None:
        doc["enabled"] = overlay.enabled
    return doc


def doc_edit(doc: Mapping[str, Any]) -> tuple[ServiceKey, Target, InstanceOverlay]:
    """The service, instance and edit of a stored document (KeyError, TypeError or ValueError if malformed)."""
    service = ServiceKey(str(doc["namespace"]), str(doc["group"]), str(doc["service"]))
    target = (str(doc["ip"]), int(doc["port"]), str(doc.get("cluster") or DEFAULT_CLUSTER))
    weight = doc.get("weight")
    enabled = doc.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError("enabled must be a boolean")
    metadata = {str(k): None if v is None else str(v) for k, v in dict(doc.get("metadata") or {}).items()}
    return service, target, InstanceOverlay(None if weight is None else float(weight), enabled, metadata)


class InstanceEdits:
    """The operators' edits of ephemeral instances: the one write use case, the feed of the CP
    view into the model (every node, the writer's own included) and the cleaner."""

    def __init__(self, live: LiveConfig, clock: Clock, services: ServiceManager, validator: InstanceValidator,
                 reads: NamingReads, overlays: InstanceOverlays, view: CpView[Any]) -> None:
        self.live = live  # the cleaner's delay is read each time
        self.clock = clock
        self.services = services
        self.validator = validator
        self.reads = reads
        self.overlays = overlays
        self.view = view
        #: (service, instance) → monotonic ms since when this node has seen no publication of it
        self._gone_since: dict[tuple[ServiceKey, Target], int] = {}
        view.subscribe(self._on_doc)

    @property
    def config(self) -> Config:
        return self.live.current

    # --- the write ---------------------------------------------------------------------------
    def published(self, service: ServiceKey, target: Target) -> list[InstanceInfo]:
        """The ephemeral instances of ``target`` as their clients publish them (no edit on them)."""
        ip, port, cluster = target
        return [inst for client, _publication, inst in self.reads.matching(service, ip, port, cluster)
                if client.kind is not ClientKind.PERSISTENT]

    async def edit(self, service: ServiceKey, ip: str, port: int, cluster: str, *, weight: float | None = None,
                   enabled: bool | None = None, metadata: Mapping[str, str] | None = None,
                   remove_keys: Collection[str] = ()) -> None:
        """Set ``weight``, ``enabled`` and ``metadata`` (merged into the edit; None: left as is) and
        remove ``remove_keys`` of the ephemeral instance ``ip:port`` of ``cluster``, cluster-wide.
        Every node shows it through its watch, this one before this returns."""
        check_port(port)
        cluster = cluster or DEFAULT_CLUSTER
        self.validator.check_params(service, clusters=cluster)
        if self.services.get(service) is None:
            raise InvalidParam(f"service not found, namespace: {service.namespace}, service: {service.grouped_name}")
        target = (ip, port, cluster)
        name = instance_name(service, cluster, ip, port)
        for _attempt in range(EDIT_ATTEMPTS):
            published = self.published(service, target)
            if not published:
                raise NotFound("no matched ip found!")
            doc, mod = self.view.get(name), self.view.mod_revision(name)
            old = self._decoded(name, doc) if doc is not None else InstanceOverlay()
            new = merged(old, published, weight, enabled, metadata, remove_keys)
            for inst in published:
                shown = new.apply(inst)
                self.validator.check_values(shown)
                self.validator.check_params(instances=(shown,))
                self.validator.check_instance_legal(shown)
            if new == old:
                return
            if new.empty:
                if (await self.view.transact({name: mod}, {name: None})).succeeded:
                    return
            elif await self.view.compare_and_put(name, edit_doc(service, target, new), mod):
                return
        raise Conflict(f"instance {ip}:{port} of {service.grouped_name} is being edited concurrently; retry")

    # --- the feed: view → model ----------------------------------------------------------------
    def _decoded(self, name: str, doc: Any) -> InstanceOverlay:
        try:
            return doc_edit(doc)[2]
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("instance edit %s: malformed document ignored", name)
            return InstanceOverlay()

    def _on_doc(self, name: str, old: Any, new: Any) -> None:
        doc = new if new is not None else old
        try:
            service, target, overlay = doc_edit(doc)
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("instance edit %s: malformed document ignored", name)
            return
        self.overlays.set(service, target, None if new is None else overlay, self.clock.now_ms())
        if new is None:
            self._gone_since.pop((service, target), None)

    # --- the cleaner ---------------------------------------------------------------------------
    async def clean(self) -> int:
        """Remove the edits whose instance this node has seen no publication of for
        ``expired_metadata_expired_ms``; how many this call removed. Each removal is a
        compare-and-delete, so an edit written meanwhile stays; nodes racing to remove one are harmless."""
        now = self.clock.monotonic_ms()
        expired_ms = self.config.expired_metadata_expired_ms
        seen: set[tuple[ServiceKey, Target]] = set()
        due: list[tuple[ServiceKey, Target]] = []
        for service, target, _overlay in self.overlays.items():
            key = (service, target)
            seen.add(key)
            if self.published(service, target):
                self._gone_since.pop(key, None)
                continue
            since = self._gone_since.setdefault(key, now)
            if now - since >= expired_ms:
                due.append(key)
        for key in [k for k in self._gone_since if k not in seen]:
            del self._gone_since[key]
        removed = 0
        for service, (ip, port, cluster) in due:
            name = instance_name(service, cluster, ip, port)
            mod = self.view.mod_revision(name)
            try:
                done = bool(mod) and (await self.view.transact({name: mod}, {name: None})).succeeded
            except CpUnavailable as exc:  # no quorum now: the next round tries again
                log.info("operators' edits not cleaned now: %s", exc)
                return removed
            if done:
                removed += 1
                log.info("removed the operator's edit of %s:%d (%s) of %s: its instance has been gone %d ms",
                         ip, port, cluster, service, expired_ms)
        return removed


def merged(old: InstanceOverlay, published: list[InstanceInfo], weight: float | None, enabled: bool | None,
           metadata: Mapping[str, str] | None, remove_keys: Collection[str]) -> InstanceOverlay:
    """``old`` with a new edit on it: given fields replace the old ones, metadata merges, and a
    removed key is dropped from the edit, and hidden (None) if a publication carries it."""
    keys: dict[str, str | None] = {**old.metadata, **(metadata or {})}
    for key in remove_keys:
        if any(key in inst.metadata for inst in published):
            keys[key] = None
        else:
            keys.pop(key, None)
    return InstanceOverlay(old.weight if weight is None else float(weight),
                           old.enabled if enabled is None else enabled, keys)
