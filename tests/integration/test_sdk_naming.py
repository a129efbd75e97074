"""The real nacos-sdk-python 3.x gRPC client against a real `shoal server` process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from v2.nacos import (
    BatchRegisterInstanceParam,
    DeregisterInstanceParam,
    ListInstanceParam,
    ListServiceParam,
    RegisterInstanceParam,
    SubscribeServiceParam,
)

from shoal.testing import ServerProcess, http_get, metric_sum, wait_until
from shoal.testing.procs import metric_values


class Pushes:
    """Collects subscribe callbacks (the SDK calls them with the instance list)."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    async def __call__(self, instances: list[Any]) -> None:
        self.calls.append(list(instances))

    def latest_ips(self) -> set[tuple[str, int]] | None:
        return {(i.ip, i.port) for i in self.calls[-1]} if self.calls else None


async def instances(client: Any, service: str, group: str = "DEFAULT_GROUP") -> list[Any]:
    return await client.list_instances(ListInstanceParam(service_name=service, group_name=group,
                                                         subscribe=False, healthy_only=None))


async def test_register_is_visible_to_another_client_with_all_fields(server: ServerProcess, sdk: Any) -> None:
    a, b = await sdk(server.addr), await sdk(server.addr)
    assert await a.register_instance(RegisterInstanceParam(
        service_name="orders", group_name="SHOP", ip="10.1.0.5", port=8080, weight=3.5, cluster_name="east-1",
        metadata={"version": "1.2", "zone": "a"}))
    [inst] = await instances(b, "orders", "SHOP")
    assert (inst.ip, inst.port, inst.weight, inst.clusterName) == ("10.1.0.5", 8080, 3.5, "east-1")
    assert inst.metadata == {"version": "1.2", "zone": "a"}
    assert inst.healthy and inst.enabled and inst.ephemeral
    assert inst.serviceName == "SHOP@@orders"
    assert inst.instanceId == "10.1.0.5#8080#east-1#SHOP@@orders"


async def test_subscriber_is_pushed_on_register_and_deregister(server: ServerProcess, sdk: Any) -> None:
    subscriber, first, third = await sdk(server.addr), await sdk(server.addr), await sdk(server.addr)
    await first.register_instance(RegisterInstanceParam(service_name="pay", ip="10.2.0.1", port=1))
    pushes = Pushes()
    await subscriber.subscribe(SubscribeServiceParam(service_name="pay", subscribe_callback=pushes))
    await third.register_instance(RegisterInstanceParam(service_name="pay", ip="10.2.0.3", port=3))
    await wait_until(lambda: pushes.latest_ips() == {("10.2.0.1", 1), ("10.2.0.3", 3)}, what="push with both")
    await third.deregister_instance(DeregisterInstanceParam(service_name="pay", ip="10.2.0.3", port=3))
    await wait_until(lambda: pushes.latest_ips() == {("10.2.0.1", 1)}, what="push after deregister")
    await first.deregister_instance(DeregisterInstanceParam(service_name="pay", ip="10.2.0.1", port=1))
    await wait_until(lambda: pushes.latest_ips() == set(), what="empty push")
    status, metrics = http_get(server.url("/nacos/actuator/prometheus"))
    assert status == 200
    # read by labels: a node of workers labels Shoal's series by worker (docs/workers.md)
    assert metric_sum(metrics, "shoal_push_total", result="success") >= 1
    assert metric_values(metrics, "shoal_push_latency_seconds_count")


async def test_batch_register_then_batch_deregister(server: ServerProcess, sdk: Any) -> None:
    client, reader = await sdk(server.addr), await sdk(server.addr)
    batch = [RegisterInstanceParam(service_name="batch", ip="10.3.0.1", port=p) for p in (1, 2, 3)]
    assert await client.batch_register_instances(BatchRegisterInstanceParam(service_name="batch", instances=batch))
    got = await wait_until(lambda: instances(reader, "batch"), what="batch visible")
    assert sorted(i.port for i in got) == [1, 2, 3]
    assert await client.batch_deregister_instances(
        BatchRegisterInstanceParam(service_name="batch", instances=batch[:2]))
    # the reader's cache follows by push
    await wait_until(lambda: _ports(instances(reader, "batch"), [3]), what="batch deregistered")


async def _ports(awaitable: Any, expected: list[int]) -> bool:
    return sorted(i.port for i in await awaitable) == expected


async def test_service_list_paging(server: ServerProcess, sdk: Any) -> None:
    client = await sdk(server.addr)
    names = [f"page-{i:02d}" for i in range(7)]
    for i, name in enumerate(names):
        await client.register_instance(RegisterInstanceParam(service_name=name, group_name="PAGING",
                                                             ip="10.4.0.1", port=1000 + i))
    seen: list[str] = []
    for page in (1, 2, 3):
        result = await client.list_services(ListServiceParam(group_name="PAGING", page_no=page, page_size=3))
        assert result.count == 7
        seen.extend(result.services)
    assert sorted(seen) == names and len(seen) == 7


async def test_namespaces_are_isolated(server: ServerProcess, sdk: Any) -> None:
    dev, prod = await sdk(server.addr, namespace="dev"), await sdk(server.addr, namespace="prod")
    await dev.register_instance(RegisterInstanceParam(service_name="iso", ip="10.5.0.1", port=1))
    assert [i.ip for i in await instances(dev, "iso")] == ["10.5.0.1"]
    assert await instances(prod, "iso") == []


CLIENT_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from v2.nacos import ClientConfigBuilder, NacosNamingService, RegisterInstanceParam
    async def main():
        cfg = (ClientConfigBuilder().server_address(sys.argv[1]).log_level("WARNING")
               .log_dir(sys.argv[2]).cache_dir(sys.argv[2]).build())
        client = await NacosNamingService.create_naming_service(cfg)
        await client.register_instance(RegisterInstanceParam(service_name=sys.argv[3], ip="10.6.0.9", port=9))
        print("registered", flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
""")


def spawn_client(server: ServerProcess, tmp_path: Path, service: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, server.addr, str(tmp_path / "child"), service],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "registered", f"client process failed to register: {line!r}"
    return proc


async def test_killed_client_process_loses_its_instances(server: ServerProcess, sdk: Any, tmp_path: Path) -> None:
    watcher = await sdk(server.addr)
    proc = await asyncio.to_thread(spawn_client, server, tmp_path, "killed")
    try:
        pushes = Pushes()
        await watcher.subscribe(SubscribeServiceParam(service_name="killed", subscribe_callback=pushes))
        await wait_until(lambda: instances(watcher, "killed"), what="child's instance")
        os.kill(proc.pid, signal.SIGKILL)
        await wait_until(lambda: pushes.latest_ips() == set(), what="instances of the killed client to go")
    finally:
        proc.kill()
        proc.wait()


async def test_frozen_client_is_probed_and_removed(servers: Callable[..., ServerProcess], sdk: Any,
                                                   tmp_path: Path) -> None:
    """A client that keeps its TCP connection but stops answering: only the keep-alive probe
    (ClientDetectionRequest) can find it. Short intervals here; the defaults are unit-tested."""
    server = servers("-D", "nacos.remote.server.connection.keep-alive-ms=1500",
                     "-D", "nacos.remote.server.connection.check-interval-ms=300",
                     "-D", "nacos.remote.server.connection.detection-timeout-ms=500")
    watcher = await sdk(server.addr)
    proc = await asyncio.to_thread(spawn_client, server, tmp_path, "frozen")
    try:
        await wait_until(lambda: instances(watcher, "frozen"), what="child's instance")
        os.kill(proc.pid, signal.SIGSTOP)
        await wait_until(lambda: _not(instances(watcher, "frozen")), timeout=15, what="frozen client removal")
        assert server.metric("connections_closed_total", reason="keep-alive probe failed") >= 1
    finally:
        proc.kill()
        os.kill(proc.pid, signal.SIGCONT) if proc.poll() is None else None
        proc.wait()
    # the watcher, which answers probes, survived several scans
    assert await watcher.server_health()


async def _not(awaitable: Any) -> bool:
    return not await awaitable


async def test_metrics_count_requests_by_type_and_code(server: ServerProcess, sdk: Any) -> None:
    client = await sdk(server.addr)
    await client.register_instance(RegisterInstanceParam(service_name="metered", ip="10.7.0.1", port=1))
    status, text = http_get(server.url("/nacos/actuator/prometheus"))
    assert status == 200
    assert metric_sum(text, "shoal_requests_total", code="200", transport="grpc", type="InstanceRequest") == 1
    assert server.gauge("connections") == 1
    # every worker of a node of workers holds the registry: the one scraped has it one sync later
    await wait_until(lambda: server.gauge("instances") == 1 and server.gauge("services") == 1,
                     what="the instance and its service counted")
    json.dumps(text)  # the body is text
