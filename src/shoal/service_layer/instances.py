"""The instance use cases, one façade for every transport: the only place that chooses between
the AP path (ephemeral instances in the model, replicated by Distro) and the CP path (persistent
instances in the CP store) on ``ephemeral``, as Nacos's ClientOperationServiceProxy does.

* connection clients (gRPC ``InstanceRequest``, ``BatchInstanceRequest``): always ephemeral
  (:class:`EphemeralInstances`);
* ip:port writes (HTTP Open API, 1.x SDKs): ``ephemeral=true`` → :class:`IpPortInstances`,
  ``ephemeral=false`` → :class:`PersistentNaming`;
* gRPC ``PersistentInstanceRequest``: the CP path, single or batch;
* operators' edits (every PUT / PATCH of an instance, the metadata batch): of a persistent
  instance, its own document (:class:`PersistentNaming`); of an ephemeral one, an edit kept in the
  CP store apart from the client's publication and laid over it on every read
  (:class:`InstanceEdits`), so it outlives the client registering again on another node.

An ip:port (HTTP) write is answered once the ``barrier`` allows (:mod:`shoal.service_layer.barrier`:
on a node of workers, once its sibling workers applied it), since an HTTP client has no session and
its next call may land on another worker; a connection client's write is answered at once: its
reads go over its own connection, held by the worker that applied them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Collection, Mapping, Sequence

from shoal.errors import InvalidParam
from shoal.model.instance import InstanceInfo
from shoal.model.ip_port import ip_port_client_id
from shoal.model.keys import ServiceKey
from shoal.service_layer.barrier import WriteBarrier
from shoal.service_layer.ephemeral import EphemeralInstances
from shoal.service_layer.ip_port import IpPortInstances
from shoal.service_layer.overlays import InstanceEdits
from shoal.service_layer.persistent import PersistentNaming
from shoal.service_layer.reads import NamingReads

#: A beat names an instance kind that has none: persistent instances are checked by the server.
PERSISTENT_BEAT = ("persistent instances (ephemeral=false) send no beats: the server checks their health "
                   "with their cluster's health checker")

#: ``(ip, port, cluster)`` of an instance named by an operator request.
Target = tuple[str, int, str]


class InstanceOperations:
    """Register, deregister, update and beat instances of either kind (ClientOperationServiceProxy
    + InstanceOperatorClientImpl)."""

    def __init__(self, ephemeral: EphemeralInstances, ip_port: IpPortInstances, reads: NamingReads,
                 persistent: PersistentNaming, edits: InstanceEdits, barrier: WriteBarrier | None = None) -> None:
        self._barrier = barrier
        self._ephemeral = ephemeral
        self._ip_port = ip_port
        self._reads = reads
        self._persistent = persistent
        self._edits = edits

    # --- connection clients (gRPC): ephemeral -----------------------------------------------
    # Answered at once: the client reads over the same connection, from the worker that applied it.
    def register_connection(self, client_id: str, service: ServiceKey, inst: InstanceInfo) -> None:
        self._ephemeral.register_instance(client_id, service, inst)

    def batch_register_connection(self, client_id: str, service: ServiceKey,
                                  instances: Sequence[InstanceInfo]) -> None:
        self._ephemeral.batch_register_instances(client_id, service, instances)

    def deregister_connection(self, client_id: str, service: ServiceKey) -> None:
        self._ephemeral.deregister_instance(client_id, service)

    async def _settled(self, client_id: str) -> None:
        """Wait for the barrier after an ip:port write of ``client_id``."""
        if self._barrier is not None:
            wait = self._barrier(client_id)
            if wait is not None:
                await wait

    # --- persistent writes (gRPC PersistentInstanceRequest): checked now, written when awaited --
    def register_persistent(self, service: ServiceKey, inst: InstanceInfo) -> Awaitable[None]:
        self._persistent.check_register(service, inst)
        return self._persistent.register(service, inst)

    def deregister_persistent(self, service: ServiceKey, inst: InstanceInfo) -> Awaitable[None]:
        self._persistent.check_deregister(service, inst.cluster)
        return self._persistent.deregister(service, inst.ip, inst.port, inst.cluster)

    def batch_persistent(self, service: ServiceKey, instances: Sequence[InstanceInfo],
                         remove: bool) -> Awaitable[None]:
        """Shoal's persistent batch (docs/protocol.md §3.5): every instance registered, or every
        ``ip:port`` removed, all or nothing; the whole batch is checked before anything is written."""
        if remove:
            return self._persistent.batch_deregister(service, instances)
        return self._persistent.batch_register(service, instances)

    # --- ip:port writes (HTTP): either kind ---------------------------------------------------
    async def register(self, service: ServiceKey, inst: InstanceInfo, *, ephemeral: bool) -> None:
        if ephemeral:
            await self._settled(self._ip_port.register(service, inst))
        else:
            await self.register_persistent(service, inst)

    async def deregister(self, service: ServiceKey, ip: str, port: int, cluster: str, *, ephemeral: bool) -> None:
        if ephemeral:
            await self._settled(self._ip_port.deregister(service, ip, port))
        else:
            await self._persistent.deregister(service, ip, port, cluster)

    async def update(self, service: ServiceKey, ip: str, port: int, cluster: str, *, ephemeral: bool,
                     weight: float | None = None, enabled: bool | None = None,
                     metadata: Mapping[str, str] | None = None, remove_keys: Collection[str] = ()) -> None:
        """An operator's edit: change weight, enabled and metadata (merged, ``remove_keys`` dropped)
        of an instance; the one write of every operator route, either kind."""
        if ephemeral:
            await self._edits.edit(service, ip, port, cluster, weight=weight, enabled=enabled, metadata=metadata,
                                   remove_keys=remove_keys)
        else:
            await self._persistent.update(service, ip, port, cluster, weight=weight, enabled=enabled,
                                          metadata=metadata, remove_keys=remove_keys)

    async def patch(self, service: ServiceKey, ip: str, port: int, cluster: str, *, weight: float | None,
                    enabled: bool | None, metadata: Mapping[str, str] | None) -> None:
        """PATCH: only the given fields change, of the persistent instance ``ip:port`` of
        ``cluster`` when the store holds one, else of the ephemeral ones."""
        await self.update(service, ip, port, cluster, ephemeral=not self.is_persistent(service, ip, port, cluster),
                          weight=weight, enabled=enabled, metadata=metadata)

    async def set_health(self, service: ServiceKey, ip: str, port: int, cluster: str, healthy: bool) -> None:
        """HealthController.update: set a persistent instance's health by hand (an ephemeral
        instance's health is its beats' business)."""
        await self._persistent.update(service, ip, port, cluster, weight=None, enabled=None, metadata=None,
                                      healthy=healthy)

    async def beat(self, service: ServiceKey, ip: str, port: int, beat: InstanceInfo | None,
                   ephemeral: bool = True) -> tuple[int, int]:
        """A client beat of an ephemeral ip:port instance: ``(code, interval)``; one that registered
        the instance again (or turned it healthy) is answered once the barrier allows."""
        if not ephemeral:
            raise InvalidParam(PERSISTENT_BEAT)
        answer = self._ip_port.beat(service, ip, port, beat)
        await self._settled(ip_port_client_id(ip, port))
        return answer

    # --- the metadata batch (operator) ----------------------------------------------------------
    def is_persistent(self, service: ServiceKey, ip: str, port: int, cluster: str) -> bool:
        """Whether the CP store holds the instance ``ip:port`` of ``cluster`` of the service."""
        return self._persistent.holds(service, ip, port, cluster)

    def metadata_targets(self, service: ServiceKey, persistent: bool, named: Sequence[Target]) -> list[Target]:
        """The instances of one kind a metadata batch applies to: those of ``named`` of that kind,
        or, when none is named, every instance of that kind of the service (sorted)."""
        stored = {(i.ip, i.port, i.cluster) for i in self._persistent.persistent_instances(service).values()}
        if named:
            return [t for t in named if (t in stored) == persistent]
        if persistent:
            return sorted(stored)
        return sorted({(i.ip, i.port, i.cluster) for key, i in self._reads.all_instances(service.namespace,
                                                                                        service.name)
                       if key == service} - stored)
