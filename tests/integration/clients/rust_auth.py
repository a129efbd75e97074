"""The real nacos-sdk-rust (nacos-sdk-rust-binding-py) against a node that needs a login.

    python rust_auth.py <host:httpPort> <service name> [<username> <password>]

Run in a process of its own by ``tests/integration/test_secure_defaults.py`` (the binding keeps a
global runtime and writes under ``$HOME``). With credentials the SDK logs in with its own login
plugin before it connects; one instance is registered and the service read back. Prints one JSON
object: ``registered`` and ``hosts``, or ``registered: false`` and the SDK's ``error`` (the node's
refusal); the call must come back either way, never hang.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import nacos_sdk_rust_binding_py as nacos

GROUP = "DEFAULT_GROUP"
IP, PORT = "10.7.2.1", 8080
STEP_TIMEOUT_S = 20.0


async def run(addr: str, service: str, credentials: list[str]) -> dict[str, Any]:
    login = {"username": credentials[0], "password": credentials[1]} if credentials else {}
    client = nacos.AsyncNacosNamingClient(nacos.ClientOptions(
        server_addr=addr, namespace="", app_name="shoal-rust-auth-test", naming_push_empty_protection=False, **login))
    instance = nacos.NacosServiceInstance(ip=IP, port=PORT, weight=1.0, cluster_name="DEFAULT")
    try:
        await asyncio.wait_for(client.register_instance(service, GROUP, instance), STEP_TIMEOUT_S)
    except Exception as exc:  # the SDK raises its error as a plain exception with the server's message
        return {"registered": False, "error": str(exc)}
    found = await asyncio.wait_for(client.get_all_instances(service, GROUP, subscribe=False), STEP_TIMEOUT_S)
    return {"registered": True, "hosts": sorted(f"{i.ip}:{i.port}" for i in found)}


def main() -> int:
    try:
        out = asyncio.run(run(sys.argv[1], sys.argv[2], sys.argv[3:5]))
    except Exception as exc:
        print(json.dumps({"registered": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the binding's runtime threads outlive asyncio.run (see rust_sdk.py)
