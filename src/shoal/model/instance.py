"""A published instance (Nacos InstancePublishInfo) and its Nacos Instance JSON form."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal import jsonfast
from shoal.model.keys import DEFAULT_CLUSTER, ServiceKey

HEART_BEAT_INTERVAL_KEY = "preserved.heart.beat.interval"
HEART_BEAT_TIMEOUT_KEY = "preserved.heart.beat.timeout"
IP_DELETE_TIMEOUT_KEY = "preserved.ip.delete.timeout"
INSTANCE_ID_GENERATOR_KEY = "preserved.instance.id.generator"
DEFAULT_HEART_BEAT_INTERVAL = 5000
DEFAULT_HEART_BEAT_TIMEOUT = 15000
DEFAULT_IP_DELETE_TIMEOUT = 30000


def metadata_millis(metadata: Mapping[str, str], key: str, default: int) -> int:
    """A numeric preserved-metadata value (regex ``^\\d+$`` as Nacos), else the default."""
    value = metadata.get(key)
    return int(value) if value is not None and value.isascii() and value.isdigit() else default


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One instance as stored under (client, service). Immutable: a change is a new object."""

    ip: str
    port: int
    weight: float = 1.0
    healthy: bool = True
    enabled: bool = True
    cluster: str = DEFAULT_CLUSTER
    instance_id: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict, hash=False)  # eq still compares it

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def to_nacos(self, service: ServiceKey, ephemeral: bool = True) -> dict[str, Any]:
        """The Instance JSON object Nacos 2.x emits (docs/protocol.md §3.2), derived keys included."""
        md = self.metadata
        out: dict[str, Any] = {
            "instanceId": self.instance_id,
            "ip": self.ip,
            "port": self.port,
            "weight": float(self.weight),
            "healthy": self.healthy,
            "enabled": self.enabled,
            "ephemeral": ephemeral,
            "clusterName": self.cluster,
            "serviceName": service.grouped_name,
            "metadata": dict(md),
            "instanceHeartBeatInterval": metadata_millis(md, HEART_BEAT_INTERVAL_KEY, DEFAULT_HEART_BEAT_INTERVAL),
            "instanceHeartBeatTimeOut": metadata_millis(md, HEART_BEAT_TIMEOUT_KEY, DEFAULT_HEART_BEAT_TIMEOUT),
            "ipDeleteTimeout": metadata_millis(md, IP_DELETE_TIMEOUT_KEY, DEFAULT_IP_DELETE_TIMEOUT),
        }
        if not md:
            out["instanceIdGenerator"] = "simple"
        elif INSTANCE_ID_GENERATOR_KEY in md:
            out["instanceIdGenerator"] = md[INSTANCE_ID_GENERATOR_KEY]
        return out

    def to_json(self, service: ServiceKey, ephemeral: bool = True) -> str:
        # orjson (jsonfast): a view of 100 instances is rebuilt after every change of its service and
        # read on the next query; the standard library took ~8 µs an instance, most of such a query.
        value = self.to_nacos(service, ephemeral)
        try:
            return jsonfast.dumps(value).decode()
        except (TypeError, ValueError):  # only the standard library writes it (a lone surrogate): as before
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def with_health(self, healthy: bool) -> InstanceInfo:
        return InstanceInfo(
            self.ip, self.port, self.weight, healthy, self.enabled, self.cluster, self.instance_id,
            self.metadata,
        )


def generate_instance_id(ip: str, port: int, cluster: str, grouped_service: str) -> str:
    """Nacos's ``simple`` generator: ``ip#port#cluster#group@@service``."""
    return f"{ip}#{port}#{cluster}#{grouped_service}"
