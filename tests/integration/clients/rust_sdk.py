"""The real nacos-sdk-rust (through nacos-sdk-rust-binding-py, on tonic) against a Shoal node.

    python rust_sdk.py <host:httpPort> <service name>

Run in a process of its own by ``tests/integration/test_real_clients.py``: the binding keeps a
global runtime and connections it never closes, and writes its log under ``$HOME/logs/nacos``, so
the test gives it its own process and HOME. Two clients (two connections): the subscriber
subscribes, the publisher registers (the subscriber's listener must be called with the instance),
both read the service, the publisher deregisters (the listener must be called with the empty
list, which push-empty-protection off lets through). Prints one JSON object and exits 0, or prints
``{"error": ...}`` and exits 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from importlib.metadata import version
from typing import Any

import nacos_sdk_rust_binding_py as nacos

GROUP = "DEFAULT_GROUP"
IP, PORT = "10.9.0.3", 8083
STEP_TIMEOUT_S = 15.0


class Listener:
    """Collects the instance lists the SDK pushes to a subscribe callback.

    The SDK calls it on one of its own threads, so each call is handed to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.calls: list[list[str]] = []
        self._loop = loop
        self._changed = asyncio.Event()

    def __call__(self, instances: list[Any]) -> None:
        hosts = hosts_of(instances)
        self._loop.call_soon_threadsafe(self._add, hosts)

    def _add(self, hosts: list[str]) -> None:
        self.calls.append(hosts)
        self._changed.set()

    def mark(self) -> int:
        return len(self.calls)

    async def wait_for(self, hosts: list[str], since: int) -> list[str]:
        async def seen() -> list[str]:
            while hosts not in self.calls[since:]:
                self._changed.clear()
                await self._changed.wait()
            return hosts
        try:
            return await asyncio.wait_for(seen(), STEP_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"no push with {hosts} within {STEP_TIMEOUT_S}s; got {self.calls}") from None


def hosts_of(instances: list[Any]) -> list[str]:
    return sorted(f"{i.ip}:{i.port}" for i in instances)


def client(addr: str) -> Any:
    # The async client: its calls leave the GIL free while they wait, so the SDK's threads can
    # run the subscribe callback meanwhile (the blocking client can deadlock on it).
    return nacos.AsyncNacosNamingClient(nacos.ClientOptions(
        server_addr=addr, namespace="", app_name="shoal-rust-test", naming_push_empty_protection=False))


async def run(addr: str, service: str) -> dict[str, Any]:
    out: dict[str, Any] = {"client": "nacos-sdk-rust-binding-py", "version": version("nacos-sdk-rust-binding-py")}
    subscriber, publisher = client(addr), client(addr)
    listener = Listener(asyncio.get_running_loop())
    await subscriber.subscribe(service, GROUP, None, listener)
    since = listener.mark()
    instance = nacos.NacosServiceInstance(ip=IP, port=PORT, weight=2.0, cluster_name="DEFAULT",
                                          metadata={"client": "rust"})
    await publisher.register_instance(service, GROUP, instance)
    out["pushAfterRegister"] = await listener.wait_for([f"{IP}:{PORT}"], since)
    [got] = await publisher.get_all_instances(service, GROUP, subscribe=False)
    out["query"] = {"hosts": hosts_of([got]), "weight": got.weight, "metadata": dict(got.metadata or {}),
                    "healthy": got.healthy, "cluster": got.cluster_name}
    out["subscriberRead"] = hosts_of(await subscriber.get_all_instances(service, GROUP))
    since = listener.mark()
    await publisher.deregister_instance(service, GROUP, instance)
    out["pushAfterDeregister"] = await listener.wait_for([], since)
    out["queryAfterDeregister"] = hosts_of(await publisher.get_all_instances(service, GROUP, subscribe=False))
    return out


def main() -> int:
    try:
        out = asyncio.run(run(sys.argv[1], sys.argv[2]))
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # The binding has no shutdown and its runtime threads outlive asyncio.run; a normal interpreter
    # exit can then abort (SIGABRT) while they call back into Python. Leave without finalising.
    os._exit(code)
