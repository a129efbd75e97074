"""The Nacos v1 Open API calls tests make of a real node: register an instance, list a service."""

from __future__ import annotations

import json
from typing import Any

from shoal.testing.http import call
from shoal.testing.procs import ServerProcess


def register(node: ServerProcess, service: str, ip: str, port: int = 7000, **params: Any) -> tuple[int, str]:
    """POST one instance of ``service`` to ``node`` (``params``: more Open API fields): (status, body)."""
    return call("POST", node.url("/nacos/v1/ns/instance"),
                {"serviceName": service, "ip": ip, "port": port, **params}, context=node.https)


def register_persistent(node: ServerProcess, service: str, ip: str, port: int = 7000) -> tuple[int, str]:
    """POST one persistent instance (``ephemeral=false``) to ``node``: (status, body)."""
    return register(node, service, ip, port, ephemeral="false")


def hosts(node: ServerProcess, service: str, **params: Any) -> list[dict[str, Any]]:
    """The ``hosts`` ``node`` lists for ``service`` (``params``: more query fields); asserts a 200."""
    status, text = call("GET", node.url("/nacos/v1/ns/instance/list"), {"serviceName": service, **params},
                        context=node.https)
    assert status == 200, text
    return list(json.loads(text)["hosts"])


def listed_ips(node: ServerProcess, service: str) -> set[str]:
    """The IPs ``node`` lists for ``service`` (empty when it answers an error)."""
    status, text = call("GET", node.url("/nacos/v1/ns/instance/list"), {"serviceName": service},
                        context=node.https)
    return {h["ip"] for h in json.loads(text)["hosts"]} if status == 200 else set()
