"""The service use cases, one façade for every transport (Nacos ServiceOperatorV2Impl and
ClusterOperatorV2Impl).

A service's metadata is cluster-wide, so every write goes to the CP store
(:class:`PersistentNaming`) and comes back to each node's model through the watch; reads are the
model's record (:class:`NamingReads`) completed with the settings only the service's CP document
holds (selector, each cluster's health checker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.model.keys import ServiceKey
from shoal.service_layer.persistent import ClusterSettings, PersistentNaming
from shoal.service_layer.reads import NamingReads
from shoal.service_layer.views import ServiceDetail, ServiceList


@dataclass(frozen=True, slots=True)
class ServiceDescription:
    """A service as the Open API describes it: the record, each cluster's settings (the clusters
    of its instances and those configured, by name) and its selector (None: none)."""

    detail: ServiceDetail
    clusters: Mapping[str, ClusterSettings]
    selector: Mapping[str, Any] | None


class ServiceOperations:
    """Create, update, delete and describe services."""

    def __init__(self, reads: NamingReads, persistent: PersistentNaming) -> None:
        self._reads = reads
        self._persistent = persistent

    async def create(self, service: ServiceKey, protect_threshold: float, metadata: Mapping[str, str],
                     ephemeral: bool, selector: Mapping[str, Any] | None = None) -> None:
        await self._persistent.create_service(service, protect_threshold, metadata, ephemeral, selector)

    async def update(self, service: ServiceKey, protect_threshold: float | None, metadata: Mapping[str, str] | None,
                     selector: Mapping[str, Any] | None = None) -> None:
        await self._persistent.update_service(service, protect_threshold, metadata, selector)

    async def delete(self, service: ServiceKey) -> None:
        await self._persistent.delete_service(service)

    async def update_cluster(self, service: ServiceKey, cluster: str, settings: ClusterSettings) -> None:
        """PUT /v1/ns/cluster: one cluster's health checker, check port and metadata."""
        await self._persistent.update_cluster(service, cluster, settings)

    def exists(self, service: ServiceKey) -> bool:
        return self._reads.service_exists(service)

    def list(self, namespace: str, group: str, page_no: int, page_size: int) -> ServiceList:
        return self._reads.list_services(namespace, group, page_no, page_size)

    def describe(self, service: ServiceKey) -> ServiceDescription | None:
        """The service with its clusters' settings and selector; None if it does not exist."""
        detail = self._reads.service_detail(service)
        if detail is None:
            return None
        doc = self._persistent.service_doc(service)
        configured = doc.get("clusters") if doc is not None else None
        names = sorted(set(detail.clusters) | set(configured if isinstance(configured, dict) else ()))
        clusters = {name: self._persistent.cluster_settings(service, name) for name in names}
        selector = doc.get("selector") if doc is not None else None
        kept = dict(selector) if isinstance(selector, dict) and selector.get("type") not in (None, "none") else None
        return ServiceDescription(detail, clusters, kept)
