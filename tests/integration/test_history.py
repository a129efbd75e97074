"""Issue 23 item 5 against real `shoal server` processes: `shoal history` tells an instance's
lifecycle with the right reasons and times (HTTP register → deregister, HTTP register → beat
expiry, gRPC SDK register → connection closed), the log survives a restart, stays within its
bound under churn, and answers what a subscriber held at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import RegisterInstanceParam

from shoal.export.history_files import directory_bytes
from shoal.testing import ServerProcess, call, call_json, kill, poll_until, wait_until
from shoal.testing.auth import start_with_admin

SERVICE = "history-svc"


def history(server: ServerProcess, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "shoal", "history", "--addr", server.addr, *args],
                          capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def rows(server: ServerProcess, service: str = SERVICE, **query: str) -> list[dict[str, Any]]:
    answer = call_json("GET", server.url("/nacos/v1/shoal/history"), {"service": service, **query})
    return list(answer["rows"])


def kinds(server: ServerProcess, ip: str) -> list[str]:
    return [r["kind"] for r in rows(server, ip=ip)]


def register_http(server: ServerProcess, ip: str, port: int, **extra: str) -> None:
    status, text = call("POST", server.url("/nacos/v1/ns/instance"),
                        {"serviceName": SERVICE, "ip": ip, "port": port, "ephemeral": "true", **extra})
    assert status == 200, text


def test_http_register_then_deregister(servers: Callable[..., ServerProcess]) -> None:
    server = servers()
    before = int(time.time() * 1000)
    register_http(server, "10.9.0.1", 8080)
    assert call("DELETE", server.url("/nacos/v1/ns/instance"),
                {"serviceName": SERVICE, "ip": "10.9.0.1", "port": 8080, "ephemeral": "true"})[0] == 200
    found = rows(server, ip="10.9.0.1")
    assert [r["kind"] for r in found] == ["register", "deregister"]
    assert all(before <= r["ts"] <= int(time.time() * 1000) for r in found)
    assert found[1]["reason"] == "deregistered by its client" and found[1]["source"] == "http"
    text = history(server, "--service", SERVICE, "--ip", "10.9.0.1").stdout
    assert f"DEFAULT_GROUP@@{SERVICE} 10.9.0.1:8080" in text
    assert "registered by client 10.9.0.1:8080#true (http)" in text
    assert "deregistered at" in text and ": deregistered by its client" in text
    as_json = json.loads(history(server, "--service", SERVICE, "--json").stdout)
    assert [r["kind"] for r in as_json["rows"]] == ["register", "deregister"]


def test_http_register_then_expiry_names_the_missing_beats(servers: Callable[..., ServerProcess]) -> None:
    server = servers("-D", "shoal.naming.beat-check-interval-ms=200")
    metadata = json.dumps({"preserved.heart.beat.interval": "500", "preserved.heart.beat.timeout": "1000",
                           "preserved.ip.delete.timeout": "2000"})
    register_http(server, "10.9.0.2", 8080, metadata=metadata)
    poll_until(lambda: "expire" in kinds(server, "10.9.0.2"), 15, what="the beat check to expire the instance")
    found = rows(server, ip="10.9.0.2")
    assert [r["kind"] for r in found] == ["register", "health", "expire"]
    assert found[1]["healthy"] is False and found[1]["reason"] == "no beat for 1 s"
    assert found[2]["reason"] == "no beat for 2 s"
    assert 2000 <= found[2]["ts"] - found[0]["ts"] < 5000
    text = history(server, "--service", SERVICE, "--ip", "10.9.0.2").stdout
    assert "marked unhealthy at" in text and "expired at" in text and ": no beat for 2 s" in text


async def test_grpc_instance_goes_with_its_connection_and_the_log_survives_a_restart(
        servers: Callable[..., ServerProcess], sdk: Any) -> None:
    server = servers()
    client = await sdk(server.addr)
    assert await client.register_instance(RegisterInstanceParam(service_name=SERVICE, ip="10.9.0.3", port=9090))
    await wait_until(lambda: kinds(server, "10.9.0.3") == ["register"], what="the gRPC registration logged")
    registered = rows(server, ip="10.9.0.3")[0]
    assert registered["source"] == "grpc" and registered["owner"].endswith(f":{server.port}")
    await client.shutdown()
    await wait_until(lambda: kinds(server, "10.9.0.3") == ["register", "deregister"], what="the connection's end")
    gone = rows(server, ip="10.9.0.3")[1]
    assert gone["reason"].startswith("connection closed: ") and gone["client"] == registered["client"]

    server.stop()
    server.start()
    server.wait_ready()
    assert kinds(server, "10.9.0.3") == ["register", "deregister"]
    register_http(server, "10.9.0.3", 9091)  # the restarted node appends to a new segment
    assert kinds(server, "10.9.0.3") == ["register", "deregister", "register"]
    assert len(list((server.data_dir / "history").glob("history-*.jsonl"))) == 2
    text = history(server, "--service", SERVICE, "--ip", "10.9.0.3").stdout
    assert "(grpc)" in text and ": connection closed: " in text


def test_the_log_stays_within_its_bound_under_churn(servers: Callable[..., ServerProcess]) -> None:
    max_bytes = 64 * 1024
    server = servers("-D", f"shoal.history.max-bytes={max_bytes}", "-D", "shoal.history.segment-bytes=8192",
                     "-D", "shoal.history.flush-interval-ms=50")
    directory = server.data_dir / "history"
    for i in range(400):
        register_http(server, f"10.9.{i // 250}.{i % 250 + 1}", 8080)
        if i % 2:
            assert call("DELETE", server.url("/nacos/v1/ns/instance"),
                        {"serviceName": SERVICE, "ip": f"10.9.{i // 250}.{i % 250 + 1}", "port": 8080,
                         "ephemeral": "true"})[0] == 200
        if i % 50 == 0:
            assert directory_bytes(directory) <= max_bytes
    answer = call_json("GET", server.url("/nacos/v1/shoal/history"), {"service": SERVICE})
    assert answer["log"]["written"] >= 600 and answer["log"]["deletedSegments"] > 0
    assert directory_bytes(directory) <= max_bytes
    newest = answer["rows"][-1]
    assert (newest["kind"], newest["ip"]) == ("deregister", "10.9.1.150")  # the newest rows are kept


async def test_what_a_subscriber_held_at_a_time(servers: Callable[..., ServerProcess], sdk: Any) -> None:
    from v2.nacos import SubscribeServiceParam

    server = servers("-D", "nacos.naming.push.pushTaskDelay=0")
    subscriber = await sdk(server.addr)
    lists: list[set[tuple[str, int]]] = []

    async def callback(instances: list[Any]) -> None:
        lists.append({(i.ip, i.port) for i in instances})

    register_http(server, "10.9.0.4", 1)
    await subscriber.subscribe(SubscribeServiceParam(service_name=SERVICE, subscribe_callback=callback))
    register_http(server, "10.9.0.5", 2)
    await wait_until(lambda: lists and lists[-1] == {("10.9.0.4", 1), ("10.9.0.5", 2)}, what="both instances pushed")

    def pushes() -> list[dict[str, Any]]:
        listed = call_json("GET", server.url("/nacos/v2/ns/client/service/subscriber/list"), {"serviceName": SERVICE})
        client_id = listed["data"][0]["clientId"]
        answer = call_json("GET", server.url("/nacos/v1/shoal/history/subscriber"),
                           {"clientId": client_id, "at": str(int(time.time() * 1000))})
        return list(answer["services"])

    await wait_until(lambda: pushes() and len(pushes()[0]["hosts"]) == 2, what="the acked push logged")
    both_at = int(time.time() * 1000)
    client_id = call_json("GET", server.url("/nacos/v2/ns/client/service/subscriber/list"),
                          {"serviceName": SERVICE})["data"][0]["clientId"]
    assert call("DELETE", server.url("/nacos/v1/ns/instance"),
                {"serviceName": SERVICE, "ip": "10.9.0.4", "port": 1, "ephemeral": "true"})[0] == 200
    await wait_until(lambda: lists[-1] == {("10.9.0.5", 2)}, what="the push without 10.9.0.4")

    def held(at: int) -> set[tuple[str, int]]:
        answer = json.loads(history(server, "--subscriber", client_id, "--at", str(at), "--json").stdout)
        return {(h["ip"], h["port"]) for h in answer["services"][0]["hosts"]}

    assert held(both_at) == {("10.9.0.4", 1), ("10.9.0.5", 2)}
    await wait_until(lambda: held(int(time.time() * 1000)) == {("10.9.0.5", 2)}, what="the later list")
    text = history(server, "--subscriber", client_id, "--at", str(both_at)).stdout
    assert f"subscriber {client_id} at" in text and "10.9.0.4:1 weight 1.0 healthy" in text
    early = history(server, "--subscriber", client_id, "--at", "1000").stdout
    assert "no acknowledged push at or before that time" in early


def test_the_history_api_needs_an_admin_and_the_cli_logs_in(tmp_path: Path) -> None:
    server = start_with_admin(tmp_path)
    try:
        status, _ = call("GET", server.url("/nacos/v1/shoal/history"), {"service": SERVICE})
        assert status == 403
        refused = history(server, "--service", SERVICE, check=False)
        assert refused.returncode == 1 and "403" in refused.stderr
        done = history(server, "--service", SERVICE, "--username", "nacos", "--password-file", str(tmp_path / "pw"))
        assert "no history for that instance" in done.stdout
    finally:
        kill(server)


@pytest.mark.parametrize("args, message", [
    (["--service", "a/b/c@@"], "not a service name"),
    (["--subscriber", "x"], "--subscriber needs --at"),
    (["--service", SERVICE, "--since", "yesterday"], "not a time"),
])
def test_bad_options_are_usage_errors(server: ServerProcess, args: list[str], message: str) -> None:
    done = history(server, *args, check=False)
    assert done.returncode == 2 and message in done.stderr
