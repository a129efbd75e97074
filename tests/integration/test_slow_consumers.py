"""Subscribers that stop reading must not make the node grow: their output is bounded, they
are closed (one log line each) once their peer reads nothing for the stall bound, and the
subscribers that do read keep getting pushes. On both gRPC transports."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from shoal.transport.selection import native_available

pytest.importorskip("h2", reason="the h2 dev dependency drives HTTP/2 frames directly")
from shoal.testing import ServerProcess, http_get, poll_until
from shoal.testing.ci import require
from shoal.testing.h2client import H2Client, grpc_frame, nacos
from shoal.testing.rawclient import register_body

MIB = 1024 * 1024
SERVICE = "slow-consumers"
SUBSCRIBE = {"namespace": "public", "serviceName": SERVICE, "groupName": "DEFAULT_GROUP", "subscribe": True}


def rss(server: ServerProcess) -> int:
    with open(f"/proc/{server.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_connections(server: ServerProcess) -> int:
    text = http_get(server.url("/nacos/actuator/prometheus"))[1]
    found = re.search(r"^shoal_connections(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert found, "no shoal_connections gauge"
    return int(float(found.group(1)))


def batch_body(round_no: int) -> dict[str, Any]:
    """200 instances whose metadata changes every round, as one BatchInstanceRequest."""
    instances = [register_body(SERVICE, ip=f"10.2.0.{i % 250}", port=1000 + i,
                               metadata={"round": str(round_no), "pad": "x" * 800})["instance"]
                 for i in range(200)]
    return {"headers": {}, "namespace": "public", "serviceName": SERVICE, "groupName": "DEFAULT_GROUP",
            "type": "batchRegisterInstance", "module": "naming", "instances": instances}


class Reader:
    """A subscriber that reads its pushes and acknowledges each one."""

    def __init__(self, port: int) -> None:
        self.client = H2Client(port)
        _, self.stream_id = self.client.connect()
        self.client.streams[self.stream_id].take_messages()  # the SetupAck
        self.client.nacos_call("SubscribeServiceRequest", SUBSCRIBE)
        self.last_round = -1

    def pump(self, timeout: float = 0.05) -> None:
        self.client.pump(timeout)
        for kind, body in self.client.streams[self.stream_id].take_messages():
            if kind == "NotifySubscriberRequest":
                hosts = body["serviceInfo"].get("hosts") or []
                self.last_round = int(hosts[0]["metadata"]["round"]) if hosts else -1
                self.client.send(self.stream_id, grpc_frame(nacos("NotifySubscriberResponse", {
                    "resultCode": 200, "errorCode": 0, "requestId": body["requestId"]})))


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_subscribers_that_stop_reading_are_closed_and_memory_stays_bounded(
        servers: Callable[..., ServerProcess], transport: str) -> None:
    require(transport != "native" or native_available(), "the h2grpc extension is not built")
    server = servers("-D", f"shoal.remote.transport={transport}",
                     "-D", "shoal.remote.write-stall-timeout-ms=2000",
                     "-D", f"shoal.remote.outbound-queue-bytes={MIB}",
                     "-D", "nacos.naming.push.pushTaskDelay=0")
    publisher = H2Client(server.grpc_port)
    publisher.connect()
    reader = Reader(server.grpc_port)
    start_rss = rss(server)

    slow: list[tuple[H2Client, str]] = []
    for _ in range(20):
        client = H2Client(server.grpc_port, rcvbuf=4096)
        conn_id, _ = client.connect()
        client.nacos_call("SubscribeServiceRequest", SUBSCRIBE)
        slow.append((client, conn_id))  # from now on it never reads
    peak = start_rss
    rounds = 0
    try:
        deadline = time.monotonic() + 60
        while open_connections(server) > 2 or rounds < 50:
            assert time.monotonic() < deadline, "slow subscribers were not closed"
            rounds += 1  # every change (~200 KiB of serviceInfo) is pushed to all 21 subscribers
            _, reply = publisher.nacos_call("BatchInstanceRequest", batch_body(rounds))
            assert reply["resultCode"] == 200, reply
            reader.pump()
            peak = max(peak, rss(server))
        assert peak - start_rss < 100 * MIB, f"RSS grew by {(peak - start_rss) / MIB:.0f} MiB"

        def reader_up_to_date() -> bool:
            reader.pump()
            return reader.last_round == rounds

        poll_until(reader_up_to_date, 20, what=f"the reading subscriber to see round {rounds} "
                                               f"(it saw {reader.last_round})")
        assert publisher.nacos_call("HealthCheckRequest", {})[1]["errorCode"] == 0
    finally:
        for client, _ in slow:
            client.close()
    poll_until(lambda: rss(server) - start_rss < 100 * MIB, 20, what="RSS back near its start")
    log = server.log()
    for _, conn_id in slow:
        lines = [line for line in log.splitlines() if conn_id in line]
        assert len(lines) <= 2, lines  # registered, then closed: one line each, no traceback spam
    assert "Traceback" not in log and "TOO_MANY_OPERATIONS" not in log


