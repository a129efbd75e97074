"""Ephemeral instances of ip:port clients: the HTTP Open API's and the 1.x SDKs' registrations
and beats (Nacos InstanceOperatorClientImpl, ClientBeatProcessorV2). An operator's edit of an
instance is not a write of its client: see :mod:`shoal.service_layer.overlays`.

An HTTP registration creates the client ``ip:port#true`` on first use and publishes through
:meth:`EphemeralInstances.publish`; its beats renew it in the :class:`BeatTable`, whose expiry
the heartbeat checker (:mod:`shoal.health.heartbeat`) acts on.
"""

from __future__ import annotations

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.errors import BeatCode
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.clients import ClientManager
from shoal.model.events import REASON_BEAT
from shoal.model.instance import HEART_BEAT_INTERVAL_KEY, InstanceInfo, metadata_millis
from shoal.model.ip_port import BeatTable, ip_port_client_id
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceManager
from shoal.service_layer.ephemeral import EphemeralInstances, refuse_persistent_service, with_instance_id
from shoal.service_layer.reads import NamingReads
from shoal.service_layer.validation import InstanceValidator, check_port

# Beat answer codes (NamingResponseCode).
BEAT_OK, BEAT_RESOURCE_NOT_FOUND = BeatCode.OK, BeatCode.RESOURCE_NOT_FOUND


class IpPortInstances:
    """The ip:port clients' writes: register, deregister, beat."""

    def __init__(self, live: LiveConfig, clock: Clock, clients: ClientManager, services: ServiceManager,
                 validator: InstanceValidator, ephemeral: EphemeralInstances, reads: NamingReads,
                 beats: BeatTable) -> None:
        self.live = live  # the beat interval is a switch: read through :attr:`config` each time
        self.clock = clock
        self.clients = clients
        self.services = services
        self.validator = validator
        self.ephemeral = ephemeral
        self.reads = reads
        self.beats = beats

    @property
    def config(self) -> Config:
        """The live settings, read each time (a switch may change them)."""
        return self.live.current

    def register(self, service: ServiceKey, inst: InstanceInfo) -> str:
        """Register an instance owned by the ip:port client ``ip:port#true`` (created on first
        use); a repeated registration also counts as a beat. Returns the client id."""
        self.validator.check_values(inst)
        self.validator.check_params(service, instances=(inst,))
        self.validator.check_instance_legal(inst)
        refuse_persistent_service(self.services, service)  # refuse before any client is created
        client_id = ip_port_client_id(inst.ip, inst.port)
        now = self.clock.monotonic_ms()
        if self.clients.get(client_id) is None:
            self.clients.add(Client(client_id, ClientKind.IP_PORT, native=True, created_ms=self.clock.now_ms(),
                                    client_ip=inst.ip, last_updated_ms=now, last_renew_ms=now))
        self.ephemeral.publish(client_id, service, Publication((with_instance_id(service, inst),)))
        self.beats.renew(client_id, service, now)
        return client_id

    def deregister(self, service: ServiceKey, ip: str, port: int) -> str:
        """Remove the ip:port client's instance of the service; unknown ones are a no-op. Returns
        the client id."""
        check_port(port)
        self.validator.check_params(service)
        client_id = ip_port_client_id(ip, port)
        if self.clients.get(client_id) is not None:
            self.ephemeral.deregister_instance(client_id, service)
        return client_id

    def beat(self, service: ServiceKey, ip: str, port: int, beat: InstanceInfo | None) -> tuple[int, int]:
        """A client beat (InstanceController.beat + ClientBeatProcessorV2): ``(code, interval)``.

        Unknown client or service: auto-register from the ``beat`` body when there is one,
        else code 20404 so the client registers again. Otherwise refresh the beat, turn an
        unhealthy instance healthy (pushed), and tell the client its beat interval.
        """
        check_port(port)
        if beat is not None:
            self.validator.check_values(beat)
        self.validator.check_params(service)
        client_id = ip_port_client_id(ip, port)
        client = self.clients.get(client_id)
        if client is None or service not in client.publications:
            if beat is None:
                return BEAT_RESOURCE_NOT_FOUND, self.config.client_beat_interval_ms
            self.register(service, beat)
            client = self.clients.get(client_id)
            if client is None or service not in client.publications:  # pragma: no cover - defensive
                return BEAT_RESOURCE_NOT_FOUND, self.config.client_beat_interval_ms
        now = self.clock.monotonic_ms()
        self.beats.renew(client_id, service, now)
        client.last_updated_ms = now
        publication = client.publications[service]
        if not all(i.healthy for i in publication.instances):
            self.beats.set_health(client, service, True, REASON_BEAT)
        metadata = publication.instances[0].metadata if publication.instances else {}
        return BEAT_OK, metadata_millis(metadata, HEART_BEAT_INTERVAL_KEY, self.config.client_beat_interval_ms)
