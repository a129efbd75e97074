"""A minimal asyncio Nacos 2.x gRPC naming client for the load generator.

One :class:`NacosConnection` is one Nacos connection: its own grpc.aio channel (one HTTP/2
transport; ``grpc.use_local_subchannel_pool`` keeps channels from sharing a subchannel), the
ServerCheck unary call, the bi stream with ConnectionSetupRequest and the wait for
SetupAckRequest (docs/protocol.md §2.2). A reader task answers the server's requests on the stream
(ClientDetectionRequest, NotifySubscriberRequest) with a 200 response echoing ``requestId``
and hands every push to an optional callback together with its receive time.

It uses Shoal's own Payload classes (a private descriptor pool), never the SDK's generated
ones, and sends the request bodies real Java clients send (docs/protocol.md §3.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import grpc

from shoal.transport.grpc._proto import Metadata, Payload

CLIENT_VERSION = "Nacos-Java-Client:v2.5.1"
NAMESPACE = "public"
GROUP = "DEFAULT_GROUP"

_dumps = json.JSONEncoder(separators=(",", ":")).encode
_OK_PREFIX = b'{"resultCode":200,'
_REQUEST = "/Request/request"
_STREAM = "/BiRequestStream/requestBiStream"

#: Channel options of the real SDKs (Python: keepalive 60 s, 100 MiB receive, own subchannel).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 100 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 60_000),
]

#: push callback: (connection, receive time from time.time(), the pushed serviceInfo dict)
PushCallback = Callable[["NacosConnection", float, dict[str, Any]], None]


class NacosError(Exception):
    """A non-200 answer or a transport failure; ``code`` is errorCode or the grpc status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def payload(type_name: str, body: str | bytes, client_ip: str = "127.0.0.1") -> Any:
    raw = body.encode() if isinstance(body, str) else body
    return Payload(metadata=Metadata(type=type_name, clientIp=client_ip), body={"value": raw})


# --- request bodies, exactly as the Java 2.5.1 client serialises them ---------------------------
def instance(ip: str, port: int, metadata: dict[str, str] | None = None, cluster: str = "DEFAULT") -> dict[str, Any]:
    return {
        "ip": ip,
        "port": port,
        "weight": 1.0,
        "healthy": True,
        "enabled": True,
        "ephemeral": True,
        "clusterName": cluster,
        "metadata": metadata if metadata is not None else {},
        "instanceHeartBeatInterval": 5000,
        "instanceHeartBeatTimeOut": 15000,
        "ipDeleteTimeout": 30000,
    }


def instance_request(
    kind: str, service: str, inst: dict[str, Any], group: str = GROUP, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """InstanceRequest; ``kind`` is ``registerInstance`` or ``deregisterInstance``."""
    return {
        "headers": {},
        "namespace": namespace,
        "serviceName": service,
        "groupName": group,
        "type": kind,
        "instance": inst,
        "module": "naming",
    }


def batch_instance_request(
    service: str, instances: list[dict[str, Any]], group: str = GROUP, namespace: str = NAMESPACE
) -> dict[str, Any]:
    return {
        "headers": {},
        "namespace": namespace,
        "serviceName": service,
        "groupName": group,
        "type": "batchRegisterInstance",
        "instances": instances,
        "module": "naming",
    }


def query_request(
    service: str, group: str = GROUP, namespace: str = NAMESPACE, cluster: str = "", healthy_only: bool = False
) -> dict[str, Any]:
    return {
        "headers": {},
        "namespace": namespace,
        "serviceName": service,
        "groupName": group,
        "cluster": cluster,
        "healthyOnly": healthy_only,
        "udpPort": 0,
        "module": "naming",
    }


def subscribe_request(
    service: str, subscribe: bool = True, group: str = GROUP, namespace: str = NAMESPACE, clusters: str = ""
) -> dict[str, Any]:
    return {
        "headers": {},
        "namespace": namespace,
        "serviceName": service,
        "groupName": group,
        "subscribe": subscribe,
        "clusters": clusters,
        "module": "naming",
    }


_SERVER_CHECK = _dumps({"headers": {}, "module": "internal"})
_HEALTH_CHECK = _SERVER_CHECK


class NacosConnection:
    """One Nacos gRPC connection (channel + bi stream)."""

    def __init__(
        self,
        target: str,
        *,
        client_ip: str = "127.0.0.1",
        tenant: str = "",
        on_push: PushCallback | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.target = target
        self.client_ip = client_ip
        self.tenant = tenant
        self.labels = labels if labels is not None else {"source": "sdk", "module": "naming"}
        self.on_push = on_push
        self.connection_id = ""
        self.pushes = 0
        self.detections = 0
        self.stream_error: str | None = None  # why the stream ended, once it has
        self._channel: Any = None
        self._unary: Any = None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._setup_ack: asyncio.Future[dict[str, Any]] | None = None
        self._write_lock = asyncio.Lock()
        self._closing = False

    @property
    def alive(self) -> bool:
        """The stream is open (the server has not ended it) and close() was not called."""
        return self._reader is not None and not self._reader.done() and not self._closing

    # --- lifecycle ----------------------------------------------------------------------
    async def connect(self, timeout_s: float = 10.0) -> None:
        """ServerCheck, open the stream, ConnectionSetupRequest, wait for SetupAckRequest."""
        self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        self._unary = self._channel.unary_unary(
            _REQUEST, request_serializer=Payload.SerializeToString, response_deserializer=Payload.FromString
        )
        try:
            type_name, body = await self.request_json("ServerCheckRequest", _SERVER_CHECK, timeout_s=timeout_s)
            if type_name != "ServerCheckResponse":
                raise NacosError(str(body.get("errorCode", "?")), f"ServerCheck answered {type_name}: {body}")
            self.connection_id = str(body.get("connectionId", ""))
            stream = self._channel.stream_stream(
                _STREAM, request_serializer=Payload.SerializeToString, response_deserializer=Payload.FromString
            )
            self._call = stream()
            self._setup_ack = asyncio.get_running_loop().create_future()
            self._reader = asyncio.create_task(self._read_loop())
            setup = {
                "headers": {},
                "clientVersion": CLIENT_VERSION,
                "tenant": self.tenant,
                "labels": self.labels,
                "abilityTable": {},
                "module": "internal",
            }
            await self._write(payload("ConnectionSetupRequest", _dumps(setup), self.client_ip))
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._setup_ack)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._closing = True
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None

    # --- unary requests -----------------------------------------------------------------
    async def request_raw(self, type_name: str, body_json: str | bytes, timeout_s: float = 10.0) -> tuple[str, bytes]:
        """Send one request; the response type and its raw JSON body. Transport errors raise."""
        try:
            reply = await self._unary(payload(type_name, body_json, self.client_ip), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise NacosError(exc.code().name, exc.details() or "") from None
        return reply.metadata.type, reply.body.value

    async def request_json(
        self, type_name: str, body_json: str | bytes, timeout_s: float = 10.0
    ) -> tuple[str, dict[str, Any]]:
        reply_type, raw = await self.request_raw(type_name, body_json, timeout_s)
        return reply_type, (json.loads(raw) if raw else {})

    async def request(
        self, type_name: str, body: dict[str, Any], timeout_s: float = 10.0
    ) -> tuple[str, dict[str, Any]]:
        """``request(type, body_dict) -> (response type, response dict)``."""
        return await self.request_json(type_name, _dumps(body), timeout_s)

    async def call_ok(self, type_name: str, body_json: str | bytes, timeout_s: float = 10.0) -> bytes:
        """Send one request and raise NacosError unless the answer is resultCode 200.

        The check looks at the first bytes (Shoal writes resultCode first) and parses the
        body only when that does not settle it, so the generator spends little CPU per call.
        """
        _, raw = await self.request_raw(type_name, body_json, timeout_s)
        if raw.startswith(_OK_PREFIX):
            return raw
        body = json.loads(raw) if raw else {}
        if body.get("resultCode") != 200:
            raise NacosError(str(body.get("errorCode", body.get("resultCode", "?"))), str(body.get("message", "")))
        return raw

    async def health_check(self, timeout_s: float = 10.0) -> None:
        await self.call_ok("HealthCheckRequest", _HEALTH_CHECK, timeout_s)

    # --- the stream -----------------------------------------------------------------------
    async def _write(self, message: Any) -> None:
        async with self._write_lock:
            await self._call.write(message)

    async def _read_loop(self) -> None:
        call = self._call
        try:
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    self.stream_error = "EOF"
                    break
                received = time.time()
                type_name = message.metadata.type
                raw = message.body.value
                if type_name == "SetupAckRequest":
                    if self._setup_ack is not None and not self._setup_ack.done():
                        self._setup_ack.set_result(json.loads(raw) if raw else {})
                    continue
                body = json.loads(raw) if raw else {}
                request_id = body.get("requestId")
                if type_name == "NotifySubscriberRequest":
                    self.pushes += 1
                    reply_type = "NotifySubscriberResponse"
                    if self.on_push is not None:
                        self.on_push(self, received, body.get("serviceInfo") or {})
                elif type_name == "ClientDetectionRequest":
                    self.detections += 1
                    reply_type = "ClientDetectionResponse"
                else:  # ConnectResetRequest and anything else: answer, do nothing
                    reply_type = type_name.replace("Request", "Response")
                if request_id is not None:
                    answer = '{"resultCode":200,"errorCode":0,"requestId":' + _dumps(request_id) + ',"success":true}'
                    await self._write(payload(reply_type, answer, self.client_ip))
        except asyncio.CancelledError:
            self.stream_error = self.stream_error or "cancelled"
            raise
        except grpc.aio.AioRpcError as exc:
            self.stream_error = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # recorded: the connection counts as dead
            self.stream_error = f"{type(exc).__name__}: {exc}"
        finally:
            if self._setup_ack is not None and not self._setup_ack.done():
                self._setup_ack.set_exception(
                    NacosError("STREAM", f"stream ended before SetupAck: {self.stream_error}")
                )


__all__ = [
    "CHANNEL_OPTIONS",
    "GROUP",
    "NAMESPACE",
    "NacosConnection",
    "NacosError",
    "batch_instance_request",
    "instance",
    "instance_request",
    "payload",
    "query_request",
    "subscribe_request",
]
