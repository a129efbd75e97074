"""The in-process SDK request path: Payload bytes in → ``SdkServer.unary`` → handler → Payload bytes out.

A whole :class:`~shoal.app.Node` is built (not started: no sockets, no loops), so every event
subscriber a running node has (indexes, views, push scheduling, change log, metrics) runs on each
request, exactly as behind the native transport; only the transport's HTTP/2 framing is left out.
Connections are opened the way an SDK opens them (ServerCheck, then ConnectionSetupRequest on a
bi stream whose sink is a no-op), and the request bodies are the Java 2.5.1 client's
(``bench/load/nacos_client.py``).

Used by ``test_requests_bench.py`` (pytest-benchmark) and ``profile_path.py`` (cProfile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
from collections.abc import Iterator
from typing import Any

from bench.load.nacos_client import CLIENT_VERSION, instance, instance_request, query_request, subscribe_request
from shoal.app import Node
from shoal.config import Config
from shoal.kernels.payload import decode, encode
from shoal.testing import OPEN_SETTINGS


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


METADATA = {"app": "bench", "version": "1.0.0", "zone": "z1", "env": "prod"}  # 4 keys, as bench/load registers


class _NullSink:
    """A bi stream that swallows what the server sends (SetupAck, pushes)."""

    def send(self, data: bytes) -> None:
        pass

    def close(self, status: int, message: str) -> None:
        pass


class RequestPath:
    """A node whose SDK request path is driven by direct calls: ``call(type, body) -> reply bytes``."""

    def __init__(self, **overrides: Any) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="shoal-bench-")
        config = dataclasses.replace(Config(), data_dir=self._tmp.name, **{**OPEN_SETTINGS, **overrides}).validate()
        self.loop = asyncio.new_event_loop()  # the push engine's Event wants a current loop
        asyncio.set_event_loop(self.loop)
        self.node = Node(config)
        self.node._serving = True  # serve without opening listeners
        self.server = self.node.sdk_server
        self._next_port = 40000

    def close(self) -> None:
        self.loop.close()
        asyncio.set_event_loop(None)
        self._tmp.cleanup()

    def connect(self) -> str:
        """Open one SDK connection (ServerCheck + stream setup); its peer string."""
        self._next_port += 1
        peer = f"ipv4:127.0.0.1:{self._next_port}"
        type_name, _, _, _ = decode(self.server.unary(self.request("ServerCheckRequest", {"headers": {},
                                                                                          "module": "internal"}), peer))
        assert type_name == "ServerCheckResponse", type_name
        conn = self.server.open_stream(peer, _NullSink())
        setup = {"headers": {}, "clientVersion": CLIENT_VERSION, "tenant": "", "labels": {
            "module": "naming", "source": "sdk", "AppName": "bench"}, "abilityTable": {}, "module": "internal"}
        self.server.stream_message(conn, encode("ConnectionSetupRequest", _dumps(setup), None, "127.0.0.1"))
        assert conn.registered
        return peer

    @staticmethod
    def request(type_name: str, body: dict[str, Any]) -> bytes:
        return bytes(encode(type_name, _dumps(body), None, "127.0.0.1"))

    def call(self, data: bytes, peer: str) -> bytes:
        return self.server.unary(data, peer)

    @staticmethod
    def check_ok(reply: bytes, want: str) -> dict[str, Any]:
        type_name, _, _, raw = decode(reply)
        body: dict[str, Any] = json.loads(raw)
        assert type_name == want and body.get("resultCode") == 200, (type_name, body)
        return body


def register_body(service: str, ip: str, port: int = 8080) -> dict[str, Any]:
    return instance_request("registerInstance", service, instance(ip, port, dict(METADATA)))


def deregister_body(service: str, ip: str, port: int = 8080) -> dict[str, Any]:
    return instance_request("deregisterInstance", service, instance(ip, port, dict(METADATA)))


def query_body(service: str) -> dict[str, Any]:
    return query_request(service)


def subscribe_body(service: str, subscribe: bool = True) -> dict[str, Any]:
    return subscribe_request(service, subscribe)


def ips(n: int) -> Iterator[str]:
    for i in range(n):
        yield f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def populate(path: RequestPath, service: str, hosts: int) -> list[str]:
    """``hosts`` connections each registering one instance into ``service``; their peers."""
    peers = []
    for ip in ips(hosts):
        peer = path.connect()
        path.check_ok(path.call(path.request("InstanceRequest", register_body(service, ip)), peer),
                      "InstanceResponse")
        peers.append(peer)
    return peers
