"""A bare Nacos gRPC client over grpc.aio for protocol tests: it sends exactly the Payload (or the
bytes) a test asks for, on one channel = one HTTP/2 transport = one Nacos connection.

Its frame-level twin is :mod:`shoal.testing.h2client`, for what grpc.aio will not send."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc

from shoal.transport.grpc._proto import Metadata, Payload

PYTHON_LABELS = {"source": "sdk", "module": "naming"}


def payload(type_name: str, body: Any = None, raw: bytes | None = None, client_ip: str = "127.0.0.1",
            headers: dict[str, str] | None = None) -> Any:
    value = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
    return Payload(metadata=Metadata(type=type_name, clientIp=client_ip, headers=headers or {}),
                   body={"value": value})


def parse(p: Any) -> tuple[str, dict[str, Any]]:
    return p.metadata.type, json.loads(p.body.value) if p.body.value else {}


class RawClient:
    """One channel = one HTTP/2 transport = one Nacos connection."""

    def __init__(self, grpc_port: int, credentials: Any = None, host: str = "127.0.0.1") -> None:
        """``credentials`` (grpc.ssl_channel_credentials): a TLS channel; None: plaintext."""
        target, options = f"{host}:{grpc_port}", [("grpc.use_local_subchannel_pool", 1)]
        self.channel = (grpc.aio.insecure_channel(target, options=options) if credentials is None
                        else grpc.aio.secure_channel(target, credentials, options=options))
        self._unary = self.channel.unary_unary("/Request/request", request_serializer=Payload.SerializeToString,
                                               response_deserializer=Payload.FromString)
        self._stream_factory = self.channel.stream_stream(
            "/BiRequestStream/requestBiStream", request_serializer=Payload.SerializeToString,
            response_deserializer=Payload.FromString)
        #: The same two methods on bytes, for what is not a Payload at all (garbage).
        self.unary_bytes = self.channel.unary_unary("/Request/request")
        self.stream_bytes = self.channel.stream_stream("/BiRequestStream/requestBiStream")
        self.stream: Any = None

    async def call(self, type_name: str, body: Any = None, **kw: Any) -> tuple[str, dict[str, Any]]:
        return parse(await self._unary(payload(type_name, body, **kw), timeout=30))

    async def open_stream(self) -> None:
        self.stream = self._stream_factory()

    async def send(self, type_name: str, body: Any = None, **kw: Any) -> None:
        await self.stream.write(payload(type_name, body, **kw))

    async def receive(self, timeout: float = 5) -> tuple[str, dict[str, Any]]:  # noqa: ASYNC109 - one read's deadline
        message = await asyncio.wait_for(self.stream.read(), timeout)
        if message is grpc.aio.EOF:
            raise EOFError("stream ended")
        return parse(message)

    async def connect(self, labels: dict[str, str] | None = None, ability_table: Any = None,
                      negotiate: bool = True) -> str:
        """ServerCheck, stream, ConnectionSetup (and wait for SetupAck when negotiating)."""
        kind, body = await self.call("ServerCheckRequest", {"headers": {}, "module": "internal"})
        assert kind == "ServerCheckResponse", body
        await self.open_stream()
        setup: dict[str, Any] = {"headers": {}, "clientVersion": "raw-test", "tenant": "",
                                 "labels": labels if labels is not None else PYTHON_LABELS, "module": "internal"}
        if negotiate:
            setup["abilityTable"] = ability_table if ability_table is not None else {}
        await self.send("ConnectionSetupRequest", setup)
        if negotiate:
            kind, ack = await self.receive()
            assert kind == "SetupAckRequest" and "abilityTable" in ack, (kind, ack)
        return str(body["connectionId"])

    async def close(self) -> None:
        await self.channel.close()


def register_body(service: str, ip: str = "10.0.0.1", port: int = 80, **instance: Any) -> dict[str, Any]:
    return {"headers": {}, "namespace": "public", "serviceName": service, "groupName": "DEFAULT_GROUP",
            "type": "registerInstance", "module": "naming",
            "instance": {"ip": ip, "port": port, "weight": 1.0, "healthy": True, "enabled": True,
                         "ephemeral": True, "clusterName": "DEFAULT", "metadata": {}, **instance}}
