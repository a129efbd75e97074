"""A node of two worker processes under one supervisor: shared ports, restarts, signals, ``shoal status``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, ServerProcess, call, free_port_block, http_get, poll_until, wait_until
from shoal.testing.openapi import register
from shoal.testing.workers import pid_alive, worker_connections, worker_listed_ips
from shoal.transport.sharing import WORKER_HEADER

pytestmark = pytest.mark.integration

READINESS = "/nacos/v1/console/health/readiness"


def test_an_http_registration_is_listed_by_every_worker(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    assert register(node, "wsvc", "10.1.0.1", 80)[0] == 200
    for index in (0, 1):
        poll_until(lambda i=index: worker_listed_ips(node, i, "wsvc") == {"10.1.0.1"}, 10,  # type: ignore[misc]
                   what=f"worker {index} to list the instance")
    status = subprocess.run([sys.executable, "-m", "shoal", "status", "--addr", node.addr, "--json",
                             "--data-dir", str(node.data_dir)], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0, status.stdout + status.stderr
    workers = json.loads(status.stdout)["workers"]
    assert workers["supervisor"] == node.pid and workers["alive"]
    assert [(w["index"], w["pid"], w["alive"]) for w in workers["workers"]] == [
        (i, pid, True) for i, pid in enumerate(node.worker_pids())]


def test_a_cp_write_on_one_worker_reaches_the_other(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()  # the workers share the node's embedded store; each watches what the other wrote
    status, text = call("POST", node.worker_url(0, "/nacos/v1/ns/instance"),
                        {"serviceName": "durable", "ip": "10.1.1.1", "port": 80, "ephemeral": "false"})
    assert status == 200, text
    poll_until(lambda: worker_listed_ips(node, 1, "durable") == {"10.1.1.1"}, 5,
               what="worker 1 to list worker 0's persistent instance")


def test_every_answer_names_its_worker_and_both_serve_the_public_port(
        two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    seen: set[str] = set()

    def both_seen() -> bool:
        with socket.create_connection((node.host, node.port), 2) as sock:  # a new connection each time
            sock.sendall(b"GET " + READINESS.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head = sock.recv(4096).decode(errors="replace")
        for line in head.split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == WORKER_HEADER.lower():
                seen.add(value.strip())
        return seen == {"0", "1"}

    poll_until(both_seen, 20, 0.0, what="both workers to answer on the public port")
    for index in (0, 1):
        status, _ = http_get(node.worker_url(index, READINESS))
        assert status == 200


async def test_a_push_crosses_workers(two_workers: Callable[..., ServerProcess], sdk: Any) -> None:
    from v2.nacos import ListServiceParam, RegisterInstanceParam, SubscribeServiceParam

    node = await asyncio.to_thread(two_workers)  # blocking harness calls off the loop the SDK clients run on
    by_worker: dict[int, Any] = {}
    for _ in range(40):  # new connections until each worker holds one
        before = [await asyncio.to_thread(worker_connections, node, i) for i in (0, 1)]
        client = await sdk(node.addr)
        await client.list_services(ListServiceParam())
        for i in (0, 1):
            if await asyncio.to_thread(worker_connections, node, i) - before[i]:
                by_worker.setdefault(i, client)
        if len(by_worker) == 2:
            break
    assert len(by_worker) == 2, "the kernel never gave the second worker a connection"
    pushed: list[set[str]] = []

    async def on_push(instances: list[Any]) -> None:
        pushed.append({i.ip for i in instances})

    await by_worker[0].subscribe(SubscribeServiceParam(service_name="crossing", subscribe_callback=on_push))
    await by_worker[1].register_instance(RegisterInstanceParam(service_name="crossing", ip="10.2.0.7", port=7))
    await wait_until(lambda: any("10.2.0.7" in ips for ips in pushed), 10, what="the push from the other worker")


async def _listed_on(node: ServerProcess, index: int, service: str, ips: set[str]) -> bool:
    return await asyncio.to_thread(worker_listed_ips, node, index, service) == ips


async def test_a_killed_worker_comes_back_on_its_port_and_clients_redo(
        two_workers: Callable[..., ServerProcess], sdk: Any) -> None:
    from v2.nacos import RegisterInstanceParam

    node = await asyncio.to_thread(two_workers)
    ports = node.worker_ports()
    assert (await asyncio.to_thread(register, node, "kept", "10.3.0.1", 80))[0] == 200
    clients = [await sdk(node.addr) for _ in range(4)]  # connections on both workers, most likely
    for n, client in enumerate(clients):
        await client.register_instance(RegisterInstanceParam(service_name="redo", ip=f"10.3.0.{n + 10}", port=2))
    redo = {f"10.3.0.{n + 10}" for n in range(len(clients))}
    for index in (0, 1):
        await wait_until(lambda i=index: _listed_on(node, i, "redo", redo), 10,  # type: ignore[misc]
                         what="the SDK instances on every worker")
    holding = [await asyncio.to_thread(worker_connections, node, i) for i in (0, 1)]
    victim = 0 if holding[0] else 1  # a worker that holds SDK connections
    held = holding[victim]
    old = node.worker_pids()[victim]
    os.kill(old, signal.SIGKILL)
    new = await asyncio.to_thread(node.wait_worker_restarted, victim, old)
    assert new != old and node.worker_ports() == ports
    state = node.workers_state()
    assert state is not None and state["workers"][victim]["restarts"] == 1
    for index in (0, 1):  # the SDK instances (redone by the clients the dead worker held) and the HTTP one
        await wait_until(lambda i=index: _listed_on(node, i, "redo", redo), 30,  # type: ignore[misc]
                         what=f"worker {index} to list every SDK instance again")
        await wait_until(lambda i=index: _listed_on(node, i, "kept", {"10.3.0.1"}), 10,  # type: ignore[misc]
                         what=f"worker {index} to list the HTTP instance")
    # the clients the killed worker held are connected again (to either worker): none was lost
    now_held = set().union(*[await asyncio.to_thread(worker_connections, node, i) for i in (0, 1)])
    assert len(now_held) >= len(clients) and not held & now_held


def test_killing_the_supervisor_takes_every_worker(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    pids = node.worker_pids()
    node.kill()
    poll_until(lambda: not any(pid_alive(p) for p in pids), 10, what="the workers to die with their supervisor")
    for port in (node.port, node.grpc_port, node.cluster_port, *node.worker_ports()):
        def free(port: int = port) -> bool:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((node.host, port))
                except OSError:
                    return False
                return True
        poll_until(free, 10, what=f"port {port} to be free")


def test_sigterm_under_load_exits_zero_within_five_seconds(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):  # the node is going away: refused or reset
                register(node, "busy", f"10.4.{threading.get_ident() % 200}.{int(time.time() * 1000) % 250}", 80)
    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        poll_until(lambda: worker_listed_ips(node, 0, "busy"), 10, what="load to reach the node")
        pids = node.worker_pids()
        node.signal(signal.SIGTERM)
        assert node.proc.wait(5) == 0
        assert not any(pid_alive(p) for p in pids)
    finally:
        stop.set()
        for t in threads:
            t.join(5)


def test_a_stopped_worker_leaves_the_node_answering(two_workers: Callable[..., ServerProcess]) -> None:
    node = two_workers()
    frozen = node.worker_pids()[0]
    os.kill(frozen, signal.SIGSTOP)
    try:
        assert http_get(node.worker_url(1, READINESS))[0] == 200

        def public_answers() -> bool:  # a new connection lands on either worker: some reach the live one
            try:
                return http_get(node.url(READINESS), 1.0)[0] == 200
            except OSError:
                return False
        poll_until(public_answers, 20, 0.0, what="the public port to answer through the running worker")
        status, _ = call("POST", node.worker_url(1, "/nacos/v1/ns/instance"),
                         {"serviceName": "thawed", "ip": "10.5.0.2", "port": 80}, timeout=10)
        assert status == 200
        assert worker_listed_ips(node, 1, "thawed") == {"10.5.0.2"}
    finally:
        os.kill(frozen, signal.SIGCONT)


@pytest.mark.parametrize("value", ["-1", "lots", "257"])
def test_bad_worker_counts_are_refused(tmp_path: Path, value: str) -> None:
    port = free_port_block()
    for how in (["--workers", value], ["-D", f"shoal.server.workers={value}"]):
        result = subprocess.run([sys.executable, "-m", "shoal", "server", "--host", "127.0.0.1", "--port", str(port),
                                 "--data-dir", str(tmp_path), *OPEN.value, *how],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 2, result.stderr
        assert "workers" in result.stderr and "Traceback" not in result.stderr


def test_dns_is_served_by_the_workers_together(two_workers: Callable[..., ServerProcess]) -> None:
    import dns.exception
    import dns.message
    import dns.query

    dns_port = free_port_block(offsets=(0,))
    node = two_workers("-D", "nacos.naming.dns.enabled=true", "-D", f"nacos.naming.dns.port={dns_port}",
                       "-D", "nacos.naming.dns.domain-suffix=shoal.test")
    assert register(node, "named", "10.6.0.1", 80)[0] == 200

    def resolved(tcp: bool) -> bool:
        query = dns.message.make_query("named.shoal.test", "A")
        try:
            reply = (dns.query.tcp(query, "127.0.0.1", timeout=2, port=dns_port) if tcp
                     else dns.query.udp(query, "127.0.0.1", timeout=2, port=dns_port))
        except (OSError, dns.exception.Timeout):
            return False
        return [rd.to_text() for rrset in reply.answer for rd in rrset] == ["10.6.0.1"]
    for tcp in (False, True):
        poll_until(lambda tcp=tcp: resolved(tcp), 10, what="an A answer")  # type: ignore[misc]
    assert all(pid_alive(p) for p in node.worker_pids())  # both bound the DNS port
