"""A do-nothing Nacos gRPC endpoint: the cost floor of a transport (grpc.aio or native) on uvloop.

It serves the same two methods as Shoal with the same server options, answers ServerCheck,
sends SetupAck after ConnectionSetupRequest, and answers every other unary request with a
constant ``{"resultCode":200,...}`` body without parsing it. Point the load generator at it to
learn how many ops per CPU-second the transport alone allows on this machine:

    python bench/load/floor_server.py --port 19900 &
    python bench/load/run.py --addr 127.0.0.1:19900 --server-pid $! --phases register,query

``--transport native`` serves the same answers on Shoal's native transport (libnghttp2, the
``h2grpc`` extension) instead of grpc.aio. ``--hosts N`` makes the query/subscribe answer a
serviceInfo of N hosts shaped like Shoal's (4 metadata keys), so the floor pays for the same
response size as a real query; the default (0) answers an empty serviceInfo. ``run.py
--compare-transports`` starts these floors itself.

It keeps no registry, so the query phase's "verify" step reports 0 hosts; only the rates and
CPU figures mean anything.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
from typing import Any

import grpc

from shoal.transport.grpc._proto import Metadata, Payload

_OK = b'{"resultCode":200,"errorCode":0,"success":true}'
_EMPTY_INFO = (
    b'{"resultCode":200,"errorCode":0,"success":true,"serviceInfo":{"name":"x","groupName":"DEFAULT_GROUP",'
    b'"clusters":"","cacheMillis":10000,"hosts":[],"lastRefTime":0,"checksum":"","allIPs":false,'
    b'"reachProtectionThreshold":false,"valid":true}}'
)
_REPLY_TYPE = {
    "InstanceRequest": ("InstanceResponse", _OK),
    "BatchInstanceRequest": ("BatchInstanceResponse", _OK),
    "ServiceQueryRequest": ("QueryServiceResponse", _EMPTY_INFO),
    "SubscribeServiceRequest": ("SubscribeServiceResponse", _EMPTY_INFO),
    "HealthCheckRequest": ("HealthCheckResponse", _OK),
}
_ids = itertools.count(1)


def _host(i: int) -> dict[str, Any]:
    md = {"app": "load", "version": "1.0.0", "zone": "z1", "env": "bench"}
    ip = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
    return {"instanceId": f"{ip}#8080#DEFAULT#DEFAULT_GROUP@@load-svc-0", "ip": ip, "port": 8080, "weight": 1.0,
            "healthy": True, "enabled": True, "ephemeral": True, "clusterName": "DEFAULT",
            "serviceName": "DEFAULT_GROUP@@load-svc-0", "metadata": md, "instanceHeartBeatInterval": 5000,
            "instanceHeartBeatTimeOut": 15000, "ipDeleteTimeout": 30000}


def set_hosts(n: int) -> None:
    """Answer query and subscribe with a serviceInfo of ``n`` hosts."""
    info = json.loads(_EMPTY_INFO)
    info["serviceInfo"]["hosts"] = [_host(i) for i in range(n)]
    body = json.dumps(info, separators=(",", ":")).encode()
    _REPLY_TYPE["ServiceQueryRequest"] = ("QueryServiceResponse", body)
    _REPLY_TYPE["SubscribeServiceRequest"] = ("SubscribeServiceResponse", body)


class NativeFloor:
    """The same answers on Shoal's native transport: Payload bytes in, constant Payload bytes out."""

    _ack = b'{"headers":{},"abilityTable":{},"module":"internal"}'

    def __init__(self) -> None:
        from shoal.kernels.payload import decode, encode

        self._decode, self._encode = decode, encode
        self._replies = {name: encode(t, body) for name, (t, body) in _REPLY_TYPE.items()}
        self._error = encode("ErrorResponse", _OK)

    def unary(self, data: bytes, peer: str) -> bytes:
        type_name = self._decode(data)[0]
        if type_name == "ServerCheckRequest":
            body = b'{"resultCode":200,"errorCode":0,"connectionId":"c%d","supportAbilityNegotiation":true}' % next(
                _ids)
            return bytes(self._encode("ServerCheckResponse", body))
        return bytes(self._replies.get(type_name, self._error))

    def open_stream(self, peer: str, sink: Any) -> Any:
        return _FloorStream(sink)

    def stream_message(self, conn: Any, data: bytes) -> None:
        if self._decode(data)[0] == "ConnectionSetupRequest":
            conn.sink.send(self._encode("SetupAckRequest", self._ack))

    def stream_ended(self, conn: Any, reason: str = "") -> None:
        pass

    def eject(self, conn: Any, reason: str) -> None:
        pass

    def transport_closed(self, peer: str) -> None:
        pass


class _FloorStream:
    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.closed = False


async def serve_native(port: int) -> None:
    import dataclasses

    from shoal.config import Config
    from shoal.transport.grpc.native_server import NativeGrpcServer

    config = dataclasses.replace(Config(), host="127.0.0.1")
    floor = NativeFloor()
    server = NativeGrpcServer(config, port, "floor", floor, floor, config.max_inbound_message_size)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"native floor server on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    await stop.wait()
    await server.stop(1)


async def unary(request: Any, context: Any) -> Any:
    type_name = request.metadata.type
    if type_name == "ServerCheckRequest":
        body = b'{"resultCode":200,"errorCode":0,"connectionId":"c%d","supportAbilityNegotiation":true}' % next(_ids)
        return Payload(metadata=Metadata(type="ServerCheckResponse"), body={"value": body})
    reply_type, body = _REPLY_TYPE.get(type_name, ("ErrorResponse", _OK))
    return Payload(metadata=Metadata(type=reply_type), body={"value": body})


async def bi_stream(request_iterator: Any, context: Any) -> None:
    async for message in request_iterator:
        if message.metadata.type == "ConnectionSetupRequest":
            ack = b'{"headers":{},"abilityTable":{},"module":"internal"}'
            await context.write(Payload(metadata=Metadata(type="SetupAckRequest"), body={"value": ack}))


async def serve(port: int, extra: list[tuple[str, Any]]) -> None:
    server = grpc.aio.server(
        options=[
            *extra,
            ("grpc.max_receive_message_length", 10 * 1024 * 1024),
            ("grpc.max_send_message_length", -1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.so_reuseport", 0),
        ]
    )
    handlers = {
        "request": grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=Payload.FromString, response_serializer=Payload.SerializeToString
        )
    }
    stream = {
        "requestBiStream": grpc.stream_stream_rpc_method_handler(
            bi_stream, request_deserializer=Payload.FromString, response_serializer=Payload.SerializeToString
        )
    }
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler("Request", handlers),
            grpc.method_handlers_generic_handler("BiRequestStream", stream),
        ]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"floor server on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=19900, help="port to listen on at 127.0.0.1 (default 19900)")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=INT", help="extra grpc server channel option (repeatable)"
    )
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="event loop (default uvloop)")
    parser.add_argument("--transport", choices=["grpcio", "native"], default="grpcio",
                        help="grpc.aio (default) or Shoal's native libnghttp2 transport")
    parser.add_argument("--hosts", type=int, default=0, help="hosts in the query/subscribe answer (default 0)")
    args = parser.parse_args()
    extra = [(k, int(v)) for k, _, v in (o.partition("=") for o in args.option)]
    if args.hosts:
        set_hosts(args.hosts)
    if args.transport == "native":
        import uvloop

        uvloop.run(serve_native(args.port))
        return
    if args.loop == "asyncio":
        asyncio.run(serve(args.port, extra))
        return
    import uvloop

    uvloop.run(serve(args.port, extra))


if __name__ == "__main__":
    main()
