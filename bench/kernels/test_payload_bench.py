"""Payload codec micro-benchmarks: decode and encode of typical Nacos gRPC messages, compiled and
pure Python.

Run with ``bash ci/bench.sh -k payload`` (or ``make bench``). Two workloads, as the SDK port sees
them: an ``InstanceRequest`` (register, a ~400 B JSON body, type, client ip and a few headers in
the metadata) and a ``NotifySubscriberRequest`` push of a 100-instance service (~30 KB body, no
headers). One call takes well under a millisecond, so each round times a batch of calls
(``ITERATIONS``) and pytest-benchmark reports the time per call; each group holds the "cython"
and the "py" run so ``bench/report_ratios.py`` prints the speed-up.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

IMPLS = ["cython", "py"]
ITERATIONS = {"cython": 2_000, "py": 200}
ROUNDS = {"cython": 30, "py": 10}


def load(impl: str) -> ModuleType:
    return importlib.import_module("shoal._ext.payload" if impl == "cython" else "shoal.kernels.payload_py")


def run(benchmark: Any, impl: str, group: str, fn: Callable[..., Any], *args: Any) -> Any:
    benchmark.group = group
    benchmark.extra_info["items"] = 1
    return benchmark.pedantic(fn, args=args, rounds=ROUNDS[impl], iterations=ITERATIONS[impl], warmup_rounds=1)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _instance(i: int, service: str) -> dict[str, Any]:
    ip = f"10.12.{i // 250}.{i % 250 + 1}"
    return {
        "instanceId": f"{ip}#8080#DEFAULT#DEFAULT_GROUP@@{service}",
        "ip": ip,
        "port": 8080,
        "weight": 1.0,
        "healthy": True,
        "enabled": True,
        "ephemeral": True,
        "clusterName": "DEFAULT",
        "serviceName": f"DEFAULT_GROUP@@{service}",
        "metadata": {"preserved.register.source": "SPRING_CLOUD", "version": "1.4.2", "zone": f"az-{i % 3}"},
    }


REGISTER_HEADERS = {"app": "order-service", "clientVersion": "Nacos-Java-Client:v2.4.3", "accessToken": ""}
REGISTER = (
    "InstanceRequest",
    _dumps(
        {
            "headers": {},
            "requestId": "1042",
            "namespace": "public",
            "serviceName": "order-service",
            "groupName": "DEFAULT_GROUP",
            "module": "naming",
            "type": "registerInstance",
            "instance": _instance(7, "order-service"),
        }
    ),
    REGISTER_HEADERS,
    "10.12.0.8",
)
PUSH = (
    "NotifySubscriberRequest",
    _dumps(
        {
            "headers": {},
            "requestId": "77",
            "module": "naming",
            "serviceInfo": {
                "name": "DEFAULT_GROUP@@order-service",
                "groupName": "DEFAULT_GROUP",
                "clusters": "",
                "cacheMillis": 10000,
                "hosts": [_instance(i, "order-service") for i in range(100)],
                "lastRefTime": 1_700_000_000_000,
                "checksum": "",
                "allIPs": False,
                "reachProtectionThreshold": False,
                "valid": True,
            },
        }
    ),
    None,
    "",
)
WORKLOADS = {"register request": REGISTER, "100-instance push": PUSH}


def _label(name: str) -> str:
    return f"{name} ({len(WORKLOADS[name][1]):,} B body)"


def test_workload_sizes() -> None:
    assert 350 <= len(REGISTER[1]) <= 550
    assert 25_000 <= len(PUSH[1]) <= 35_000


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("impl", IMPLS)
def test_payload_decode(benchmark: Any, impl: str, workload: str) -> None:
    type_, body, headers, client_ip = WORKLOADS[workload]
    data = load("py").encode(type_, body, headers, client_ip)
    result = run(benchmark, impl, f"payload.decode {_label(workload)}", load(impl).decode, data)
    assert result == (type_, headers or {}, client_ip, body)


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("impl", IMPLS)
def test_payload_encode(benchmark: Any, impl: str, workload: str) -> None:
    type_, body, headers, client_ip = WORKLOADS[workload]
    expected = load("py").encode(type_, body, headers, client_ip)
    result = run(benchmark, impl, f"payload.encode {_label(workload)}", load(impl).encode, *WORKLOADS[workload])
    assert result == expected
