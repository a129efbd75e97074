"""What the read use cases answer: plain values the transports shape into their wire forms."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.model.keys import ServiceKey


@dataclass(frozen=True, slots=True)
class ServiceList:
    """One page of service names and the total count (ServiceListRequest, /service/list)."""

    count: int
    names: list[str]


@dataclass(frozen=True, slots=True)
class ServiceDetail:
    """A service record and the clusters its instances are in (ServiceOperatorV2Impl.queryService)."""

    service: ServiceKey
    protect_threshold: float
    metadata: Mapping[str, str]
    ephemeral: bool
    clusters: list[str]


@dataclass(frozen=True, slots=True)
class ClientDetail:
    """One naming client as ClientInfoControllerV2 describes it."""

    client_id: str
    connection_based: bool
    last_updated_ms: int
    client_ip: str
    client_port: str
    app: str
    agent: str


@dataclass(frozen=True, slots=True)
class OperatorMetrics:
    """OperatorController.metrics: model counts of this node and its host load."""

    service_count: int
    instance_count: int
    subscribe_count: int
    responsible_instance_count: int
    client_count: int
    connection_based_client_count: int
    ephemeral_ip_port_client_count: int
    responsible_client_count: int
    cpu: float
    load: float
    mem: float


def load_and_mem() -> tuple[float, float]:
    """1-minute load average and used-memory ratio (blocking: reads /proc)."""
    load = os.getloadavg()[0]
    total = available = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "MemTotal":
                    total = int(rest.split()[0])
                elif key == "MemAvailable":
                    available = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return load, 0.0
    return load, (1 - available / total) if total else 0.0
