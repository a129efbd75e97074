"""Ephemeral instances of connection-based clients: register, batch register, deregister.

An SDK connection's client publishes its instances here (Nacos
EphemeralClientOperationServiceImpl); the ip:port clients of the HTTP API publish through the
same :meth:`EphemeralInstances.publish` (:mod:`shoal.service_layer.ip_port`). Every write goes
through :class:`~shoal.model.clients.ClientManager`, the one writer.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.clock import Clock
from shoal.errors import ClientDisconnected, InvalidParam
from shoal.model.client import Client, Publication
from shoal.model.clients import ClientManager
from shoal.model.events import REASON_BY_CLIENT
from shoal.model.instance import InstanceInfo
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey
from shoal.model.services import ServiceManager
from shoal.service_layer.instance_ids import new_instance_id
from shoal.service_layer.validation import InstanceValidator


def with_instance_id(service: ServiceKey, inst: InstanceInfo) -> InstanceInfo:
    """The instance with its cluster defaulted and its id generated when it has none."""
    cluster = inst.cluster or DEFAULT_CLUSTER
    instance_id = inst.instance_id or new_instance_id(inst, cluster, service.grouped_name)  # snowflake too
    if cluster == inst.cluster and instance_id == inst.instance_id:
        return inst
    return InstanceInfo(inst.ip, inst.port, inst.weight, inst.healthy, inst.enabled, cluster,
                        instance_id, inst.metadata)


def refuse_persistent_service(services: ServiceManager, service: ServiceKey) -> None:
    """Kinds do not mix (Nacos): an ephemeral instance of a persistent service is a 400."""
    record = services.get(service)
    if record is not None and not record.ephemeral:
        raise InvalidParam(
            f"Current service {service.grouped_name} is persistent service, can't register ephemeral instance."
        )


class EphemeralInstances:
    """The ephemeral writes of a client (EphemeralClientOperationServiceImpl)."""

    def __init__(self, clock: Clock, clients: ClientManager, services: ServiceManager,
                 validator: InstanceValidator) -> None:
        self.clock = clock
        self.clients = clients
        self.services = services
        self.validator = validator

    def register_instance(self, client_id: str, service: ServiceKey, inst: InstanceInfo) -> None:
        self.validator.check_values(inst)
        self.validator.check_params(service, instances=(inst,))
        self.validator.check_instance_legal(inst)
        self.publish(client_id, service, Publication((with_instance_id(service, inst),)))

    def batch_register_instances(self, client_id: str, service: ServiceKey,
                                 instances: Sequence[InstanceInfo]) -> None:
        """Replace this client's whole instance set for the service (batch deregister is a
        batch register of the instances to keep; an empty batch removes the publication)."""
        for inst in instances:
            self.validator.check_values(inst)
        self.validator.check_params(service, instances=instances)
        if not instances:
            self.deregister_instance(client_id, service)
            return
        unique = tuple(dict.fromkeys(with_instance_id(service, inst) for inst in instances))
        self.publish(client_id, service, Publication(unique, batch=True))

    def deregister_instance(self, client_id: str, service: ServiceKey) -> None:
        """Remove this client's publication for the service (ip/port are not compared, as in
        Nacos); unknown services and clients are a successful no-op."""
        self.validator.check_params(service)
        if self.services.get(service) is None:
            return
        client = self.clients.get(client_id)
        if client is None:
            return
        self.clients.unpublish(client, service, self.clock.monotonic_ms(), REASON_BY_CLIENT)

    def publish(self, client_id: str, service: ServiceKey, publication: Publication) -> None:
        """Publish ``publication`` as the client's instances of the service (the service record
        is created on first use); a repeated identical publication changes nothing."""
        refuse_persistent_service(self.services, service)
        client = self.require_client(client_id)
        if client.publications.get(service) == publication:
            return  # a redo after reconnect, or a repeated call: nothing changed
        self.services.get_or_create(service, self.clock.now_ms())
        self.clients.publish(client, service, publication, self.clock.monotonic_ms())

    def require_client(self, client_id: str) -> Client:
        client = self.clients.get(client_id)
        if client is None:
            raise ClientDisconnected(
                f"Client [{client_id}] connection already disconnect, can't register ephemeral instance."
            )
        return client
