"""The one set of naming rules: Nacos's parameter checker and the instance validator.

Both transports only parse field types; every range and shape rule (port, weight, cluster
name, ip, metadata, the names of namespace/group/service) is checked here, once, with the
error class that carries its wire codes (docs/protocol.md §3.7, NamingUtils.checkInstanceIsLegal).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from shoal.config import Config
from shoal.errors import InvalidParam, ParamCheckFailed, WeightError
from shoal.model.instance import (
    DEFAULT_HEART_BEAT_INTERVAL,
    DEFAULT_HEART_BEAT_TIMEOUT,
    DEFAULT_IP_DELETE_TIMEOUT,
    HEART_BEAT_INTERVAL_KEY,
    HEART_BEAT_TIMEOUT_KEY,
    IP_DELETE_TIMEOUT_KEY,
    InstanceInfo,
    metadata_millis,
)
from shoal.model.keys import ServiceKey

# Nacos ParamCheckRule defaults (COMMON/paramcheck); Java's \w is ASCII-only.
_NAMESPACE_RE = re.compile(r"[\w-]+", re.ASCII)
_SERVICE_RE = re.compile(r"(?!@).((?!@@)[^\u4E00-\u9FA5\s])*")
_GROUP_RE = re.compile(r"[a-zA-Z0-9\-_:.]*")
_CLUSTER_PARAM_RE = re.compile(r"[0-9a-zA-Z\-_]+")
_IP_RE = re.compile(r"[^\u4E00-\u9FA5\s]*")
# NamingUtils.checkInstanceIsLegal: no underscore here, unlike the parameter checker.
_CLUSTER_LEGAL_RE = re.compile(r"[0-9a-zA-Z-]+")
MAX_NAMESPACE_LEN, MAX_SERVICE_LEN, MAX_GROUP_LEN, MAX_CLUSTER_LEN, MAX_IP_LEN = 64, 512, 128, 64, 128
MIN_PORT, MAX_PORT = 0, 65535
MIN_WEIGHT, MAX_WEIGHT = 0.0, 10000.0


def check_port(port: int, field: str = "port") -> None:
    """A port must be 0–65535 (400)."""
    if not MIN_PORT <= port <= MAX_PORT:
        raise InvalidParam(f"Param '{field}' must be between {MIN_PORT} and {MAX_PORT}, got {port}.")


def check_weight(weight: float) -> None:
    """A weight must be a finite 0.0–10000.0 (400; v2 21001 weight error)."""
    if not math.isfinite(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise WeightError()


class InstanceValidator:
    """Every rule an instance and the names around it must meet, for all transports.

    Every write runs, in this order: ``check_values`` (ip, port, weight), ``check_params``
    (Nacos's switchable parameter checker, answered as ParamCheckFailed: names, cluster, ip,
    port, metadata size), then ``check_instance_legal`` (NamingUtils.checkInstanceIsLegal:
    cluster name, heart-beat metadata; single registrations and updates only, as in Nacos).
    """

    #: Service keys remembered as valid (the checks are pure functions of the key); cleared when full.
    MAX_KNOWN_SERVICES = 65_536

    def __init__(self, config: Config) -> None:
        self.config = config
        self._valid_services: set[ServiceKey] = set()

    def check_params(self, service: ServiceKey | None = None, clusters: str | None = None,
                     instances: Sequence[InstanceInfo] = ()) -> None:
        """Nacos's parameter checker (docs/protocol.md §3.7); raises ParamCheckFailed (answered 500/400)."""
        if not self.config.param_check_enabled:
            return
        if service is not None and service not in self._valid_services:
            _check(service.namespace, MAX_NAMESPACE_LEN, _NAMESPACE_RE, "namespaceId")
            _check(service.name, MAX_SERVICE_LEN, _SERVICE_RE, "serviceName")
            _check(service.group, MAX_GROUP_LEN, _GROUP_RE, "group")
            if len(self._valid_services) >= self.MAX_KNOWN_SERVICES:
                self._valid_services.clear()
            self._valid_services.add(service)
        if clusters:
            for cluster in clusters.split(","):
                _check(cluster, MAX_CLUSTER_LEN, _CLUSTER_PARAM_RE, "cluster")
        for inst in instances:
            _check(inst.ip, MAX_IP_LEN, _IP_RE, "ip")
            if not MIN_PORT <= inst.port <= MAX_PORT:
                raise ParamCheckFailed(
                    f"Param 'port' is illegal, the value should be between {MIN_PORT} and {MAX_PORT}.")
            _check(inst.cluster, MAX_CLUSTER_LEN, _CLUSTER_PARAM_RE, "cluster")
            size = sum(len(k) + len(v) for k, v in inst.metadata.items())
            if size > self.config.metadata_max_length:
                raise ParamCheckFailed(
                    f"Param 'Metadata' is illegal, the metadata total length {size} exceeds "
                    f"{self.config.metadata_max_length}."
                )

    @staticmethod
    def check_values(inst: InstanceInfo) -> None:
        """Values no Nacos client sends but a hand-made request might: refuse them cleanly."""
        if not inst.ip:
            raise InvalidParam("Instance 'ip' can not be empty.")
        check_port(inst.port)
        check_weight(inst.weight)

    @staticmethod
    def check_instance_legal(inst: InstanceInfo) -> None:
        """NamingUtils.checkInstanceIsLegal (single registration only): answered 400/400."""
        md = inst.metadata
        interval = metadata_millis(md, HEART_BEAT_INTERVAL_KEY, DEFAULT_HEART_BEAT_INTERVAL)
        if (metadata_millis(md, HEART_BEAT_TIMEOUT_KEY, DEFAULT_HEART_BEAT_TIMEOUT) < interval
                or metadata_millis(md, IP_DELETE_TIMEOUT_KEY, DEFAULT_IP_DELETE_TIMEOUT) < interval):
            raise InvalidParam(
                "Instance 'heart beat interval' must less than 'heart beat timeout' and 'ip delete timeout'."
            )
        if inst.cluster and not _CLUSTER_LEGAL_RE.fullmatch(inst.cluster):
            raise InvalidParam(
                f"Instance 'clusterName' should be characters with only 0-9a-zA-Z-. (current: {inst.cluster})"
            )


def _check(value: str, max_len: int, pattern: re.Pattern[str], name: str) -> None:
    if not value:
        return
    if len(value) > max_len:
        raise ParamCheckFailed(f"Param '{name}' is illegal, the param length should not exceed {max_len}.")
    if not pattern.fullmatch(value):
        raise ParamCheckFailed(f"Param '{name}' is illegal, illegal characters should not appear in the param.")


def parse_metadata(raw: object, field: str = "metadata") -> Mapping[str, str]:
    """A JSON object of string→string (numbers and booleans are stringified, as Jackson does)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidParam(f"'{field}' must be a JSON object of strings")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            out[key] = value
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (int, float)) and value is not None:
            out[key] = str(value)
        else:
            raise InvalidParam(f"'{field}.{key}' must be a string")
    return out
