"""Naming request handlers (Nacos NAMING/remote/rpc/handler/*): JSON body → service layer."""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import Any

from shoal.errors import Code, FuzzyWatchMatchOverLimit, FuzzyWatchPatternOverLimit, InvalidParam
from shoal.model.instance import InstanceInfo
from shoal.model.keys import DEFAULT_GROUP, ServiceKey, normalise_namespace
from shoal.service_layer import NamingService, parse_metadata
from shoal.service_layer.fuzzy import WATCH_TYPE_CANCEL_WATCH, WATCH_TYPE_WATCH, FuzzyWatchContext
from shoal.transport.grpc import codec
from shoal.transport.grpc.connections import Connection
from shoal.transport.grpc.handlers import Handler, RequestContext

# Answers that never change, encoded once.
_REGISTERED = codec.ok({"type": "registerInstance"})
_DEREGISTERED = codec.ok({"type": "deregisterInstance"})
_BATCH_REGISTERED = codec.ok({"type": "batchRegisterInstance"})

QUERY_RESPONSE = "QueryServiceResponse"

#: Shoal's persistent batch types of PersistentInstanceRequest (docs/protocol.md §3.5).
BATCH_REGISTER = "batchRegisterInstance"
BATCH_DEREGISTER = "batchDeregisterInstance"


def naming_handlers(naming: NamingService, fuzzy: FuzzyWatchContext) -> dict[str, Handler]:
    """The handler table for the naming module, the 3.x fuzzy watch included."""
    h = _NamingHandlers(naming, fuzzy)
    return {
        "InstanceRequest": Handler("InstanceResponse", h.instance),
        "BatchInstanceRequest": Handler("BatchInstanceResponse", h.batch_instance),
        "PersistentInstanceRequest": Handler("InstanceResponse", h.persistent_instance),
        "ServiceQueryRequest": Handler(QUERY_RESPONSE, h.query),
        "SubscribeServiceRequest": Handler("SubscribeServiceResponse", h.subscribe),
        "ServiceListRequest": Handler("ServiceListResponse", h.list_services),
        "NamingFuzzyWatchRequest": Handler("NamingFuzzyWatchResponse", h.fuzzy_watch),
    }


class _NamingHandlers:
    """Each naming request: parse the body, call the service layer, shape the response."""

    def __init__(self, naming: NamingService, fuzzy: FuzzyWatchContext) -> None:
        self.instances = naming.instance_ops
        self.reads = naming.reads
        self.subscriptions = naming.subscriptions
        self.fuzzy = fuzzy
        self.query_answers = codec.ServiceInfoAnswers(QUERY_RESPONSE)

    def instance(self, ctx: RequestContext, body: dict[str, Any]) -> bytes:
        service = service_of(body)
        kind = text(body, "type")
        inst = instance_of(body.get("instance"), "instance")
        if kind == "registerInstance":
            self.instances.register_connection(ctx.conn.connection_id, service, inst)
            return _REGISTERED
        if kind == "deregisterInstance":
            self.instances.deregister_connection(ctx.conn.connection_id, service)
            return _DEREGISTERED
        raise InvalidParam(f"Unsupported request type {kind}")

    def batch_instance(self, ctx: RequestContext, body: dict[str, Any]) -> bytes:
        service = service_of(body)
        kind = text(body, "type")
        if kind != "batchRegisterInstance":
            raise InvalidParam(f"Unsupported request type {kind}")
        raw, instances = instances_of(body)
        for i, (item, inst) in enumerate(zip(raw, instances, strict=True)):
            if isinstance(item, dict) and item.get("ephemeral") is False:
                # The SDKs' own check (NamingUtils.checkInstanceIsEphemeral), docs/protocol.md §3.5;
                # Shoal's persistent batch is a PersistentInstanceRequest.
                raise InvalidParam(f"Batch registration does not allow persistent instance registration , "
                                   f"Instance：instances[{i}] {inst.address}; send persistent instances in a "
                                   f"PersistentInstanceRequest of type {BATCH_REGISTER}")
        self.instances.batch_register_connection(ctx.conn.connection_id, service, instances)
        return _BATCH_REGISTERED

    def persistent_instance(self, ctx: RequestContext, body: dict[str, Any]) -> bytes | Awaitable[bytes]:
        """PersistentInstanceRequestHandler: register/deregister one persistent instance in the CP
        store (not bound to the connection); validation answers at once, the write is awaited."""
        service = service_of(body)
        kind = text(body, "type")
        if kind in (BATCH_REGISTER, BATCH_DEREGISTER):
            return self.batch_persistent(service, kind, body)
        inst = instance_of(body.get("instance"), "instance")
        if kind == "registerInstance":
            return _answered(self.instances.register_persistent(service, inst), kind)
        if kind == "deregisterInstance":
            return _answered(self.instances.deregister_persistent(service, inst), kind)
        raise InvalidParam(f"Unsupported request type {kind}")

    def batch_persistent(self, service: ServiceKey, kind: str, body: dict[str, Any]) -> Awaitable[bytes]:
        """Shoal's persistent batch (Nacos has none; docs/protocol.md §3.5): ``instances`` of one
        service registered or removed in one request; an empty list changes nothing. The service
        layer checks the whole batch before it writes anything."""
        _, instances = instances_of(body)
        return _answered(self.instances.batch_persistent(service, instances, remove=kind == BATCH_DEREGISTER), kind)

    def query(self, ctx: RequestContext, body: dict[str, Any]) -> codec.Encoded:
        service = service_of(body)
        healthy_only = flag(body, "healthyOnly", False) or flag(body, "healthOnly", False)
        return self.query_answers.answer(self.reads.query_parts(service, text(body, "cluster"), healthy_only))

    def subscribe(self, ctx: RequestContext, body: dict[str, Any]) -> bytes:
        service = service_of(body)
        clusters = text(body, "clusters")
        conn = ctx.conn
        if flag(body, "subscribe", True):
            app = conn.labels.get("AppName") or ctx.header("app") or "unknown"
            info = self.subscriptions.subscribe(conn.connection_id, service, clusters, conn.client_ip or conn.remote_ip,
                                         conn.client_version, app)
        else:
            info = self.subscriptions.unsubscribe(conn.connection_id, service, clusters)
        return codec.ok({"message": "success"}, raw={"serviceInfo": info})

    def list_services(self, ctx: RequestContext, body: dict[str, Any]) -> bytes:
        namespace = normalise_namespace(text(body, "namespace"))
        group = text(body, "groupName") or DEFAULT_GROUP
        page = self.reads.list_services(namespace, group, integer(body, "pageNo", 1), integer(body, "pageSize", 10))
        return codec.ok({"count": page.count, "serviceNames": page.names})

    def fuzzy_watch(self, ctx: RequestContext, body: dict[str, Any]) -> bytes:
        """NamingFuzzyWatchRequest (NamingFuzzyWatchRequestHandler): a limit is a typed 500 with its code."""
        pattern = text(body, "groupKeyPattern")
        if not pattern:
            raise InvalidParam("Param 'groupKeyPattern' is required")
        kind = text(body, "watchType")
        client_id = ctx.conn.connection_id
        if kind == WATCH_TYPE_WATCH:
            received = body.get("receivedGroupKeys") or []
            if not isinstance(received, list) or not all(isinstance(k, str) for k in received):
                raise InvalidParam("'receivedGroupKeys' must be a list of strings")
            # Jackson names the boolean field isInitializing "initializing" (getter isInitializing()).
            initializing = flag(body, "initializing", False) or flag(body, "isInitializing", False)
            try:
                self.fuzzy.watch(client_id, pattern, received, initializing)
            except (FuzzyWatchPatternOverLimit, FuzzyWatchMatchOverLimit) as exc:
                return codec.error(Code.SERVER_ERROR, exc.code, exc.message)
        elif kind == WATCH_TYPE_CANCEL_WATCH:
            self.fuzzy.cancel(client_id, pattern)
        else:
            raise InvalidParam(f"Unsupported request type {kind}")
        return codec.ok()


async def _answered(write: Awaitable[None], kind: str) -> bytes:
    await write
    return codec.ok({"type": kind})


# --- body parsing: wrong types are 400s that name the field ---------------------------------
def text(body: dict[str, Any], key: str, default: str = "") -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidParam(f"'{key}' must be a string")
    return value


def flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidParam(f"'{key}' must be a boolean")


def integer(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise InvalidParam(f"'{key}' must be an integer")
    return value


def number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParam(f"'{key}' must be a number")
    if not math.isfinite(value):
        raise InvalidParam(f"'{key}' must be a finite number")
    return float(value)


def instances_of(body: dict[str, Any]) -> tuple[list[Any], list[InstanceInfo]]:
    """A batch's ``instances`` (absent = none): the raw items and the parsed instances."""
    raw = body.get("instances")
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise InvalidParam("'instances' must be a list")
    return raw, [instance_of(item, f"instances[{i}]") for i, item in enumerate(raw)]


def service_of(body: dict[str, Any]) -> ServiceKey:
    name, group, namespace = body.get("serviceName"), body.get("groupName"), body.get("namespace")
    if type(name) is str and type(group) is str and type(namespace) is str:  # the usual shape, same result
        name, group, namespace = name.strip(), group.strip(), namespace.strip()
        if name and group and namespace:
            return ServiceKey(namespace, group, name)
    return _checked_service_of(body)


def _checked_service_of(body: dict[str, Any]) -> ServiceKey:
    name = text(body, "serviceName").strip()
    if not name:
        raise InvalidParam("Param 'serviceName' is required and must not be blank.")
    group = text(body, "groupName").strip() or DEFAULT_GROUP
    return ServiceKey(normalise_namespace(text(body, "namespace")), group, name)


def instance_of(raw: Any, where: str) -> InstanceInfo:
    if type(raw) is dict:  # the shape every SDK sends: read it directly (same result as the checked path)
        ip, port, weight = raw.get("ip"), raw.get("port"), raw.get("weight", 1.0)
        healthy, enabled = raw.get("healthy", True), raw.get("enabled", True)
        cluster, instance_id, metadata = raw.get("clusterName", ""), raw.get("instanceId", ""), raw.get("metadata")
        if (type(ip) is str and type(port) is int and type(weight) is float and math.isfinite(weight)
                and type(healthy) is bool and type(enabled) is bool and type(cluster) is str
                and type(instance_id) is str and (metadata is None or _plain_metadata(metadata))):
            ip = ip.strip()
            if ip:
                return InstanceInfo(ip, port, weight, healthy, enabled, cluster.strip(), instance_id,
                                    dict(metadata) if metadata else {})
    return _checked_instance_of(raw, where)


def _plain_metadata(metadata: Any) -> bool:
    return type(metadata) is dict and all(type(v) is str for v in metadata.values())


def _checked_instance_of(raw: Any, where: str) -> InstanceInfo:
    """Every field type-checked; a wrong one is a 400 that names it."""
    if not isinstance(raw, dict):
        raise InvalidParam(f"'{where}' must be an Instance object")
    ip = text(raw, "ip").strip()
    if not ip:
        raise InvalidParam(f"'{where}.ip' is required")
    port = raw.get("port")
    if isinstance(port, bool) or not isinstance(port, int):
        raise InvalidParam(f"'{where}.port' must be an integer")
    return InstanceInfo(
        ip=ip,
        port=port,
        weight=number(raw, "weight", 1.0),
        healthy=flag(raw, "healthy", True),
        enabled=flag(raw, "enabled", True),
        cluster=text(raw, "clusterName").strip(),
        instance_id=text(raw, "instanceId"),
        metadata=parse_metadata(raw.get("metadata"), f"{where}.metadata"),
    )


class NamingConnectionListener:
    """Tells the service layer of SDK connections whose labels say ``module=naming``: their
    naming client is created on setup and released when they go (ConnectionBasedClientManager)."""

    def __init__(self, naming: NamingService) -> None:
        self.connections = naming.connections

    def connected(self, conn: Connection) -> None:
        if conn.module == "naming":
            self.connections.connect_client(conn.connection_id, conn.client_ip, conn.app, conn.client_version)

    def disconnected(self, conn: Connection, reason: str) -> None:
        self.connections.release_client(conn.connection_id, reason)
