"""The gRPC naming handlers read SDK-shaped bodies on a fast path: it must give exactly what the
field-by-field checked path gives, and leave every other shape (and its named 400) to that path."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.errors import InvalidParam
from shoal.transport.grpc import naming_handlers as nh

JAVA_INSTANCE: dict[str, Any] = {
    "ip": "10.0.0.1", "port": 8080, "weight": 1.0, "healthy": True, "enabled": True, "ephemeral": True,
    "clusterName": "DEFAULT", "metadata": {"k": "v"}, "instanceHeartBeatInterval": 5000,
    "instanceHeartBeatTimeOut": 15000, "ipDeleteTimeout": 30000,
}

INSTANCES = [
    JAVA_INSTANCE,
    {**JAVA_INSTANCE, "ip": " 10.0.0.2 ", "clusterName": " A ", "instanceId": "id-1"},
    {**JAVA_INSTANCE, "metadata": {}},
    {**JAVA_INSTANCE, "metadata": None, "weight": None, "healthy": None, "clusterName": None},
    {"ip": "10.0.0.3", "port": 1},  # Python SDK minimal
    {**JAVA_INSTANCE, "weight": 2},  # an int weight
    {**JAVA_INSTANCE, "healthy": "false", "enabled": "TRUE"},  # booleans as strings
    {**JAVA_INSTANCE, "metadata": {"n": 1, "b": True}},  # stringified metadata values
]

BAD_INSTANCES = [
    "nope", {**JAVA_INSTANCE, "ip": "  "}, {**JAVA_INSTANCE, "port": True}, {**JAVA_INSTANCE, "port": "80"},
    {**JAVA_INSTANCE, "weight": "1"}, {**JAVA_INSTANCE, "healthy": 1}, {**JAVA_INSTANCE, "clusterName": 5},
    {**JAVA_INSTANCE, "metadata": {"k": None}}, {**JAVA_INSTANCE, "metadata": []},
]

SERVICES = [
    {"namespace": "public", "groupName": "DEFAULT_GROUP", "serviceName": "svc"},
    {"namespace": " ns ", "groupName": " G ", "serviceName": " svc "},
    {"namespace": "", "groupName": "", "serviceName": "svc"},
    {"serviceName": "svc"},
    {"namespace": None, "groupName": None, "serviceName": "svc"},
]


@pytest.mark.parametrize("raw", INSTANCES)
def test_instance_fast_path_equals_the_checked_path(raw: dict[str, Any]) -> None:
    fast, checked = nh.instance_of(raw, "instance"), nh._checked_instance_of(raw, "instance")
    assert fast == checked and dict(fast.metadata) == dict(checked.metadata)
    assert fast.metadata is not raw.get("metadata")  # never aliases the request's dict


@pytest.mark.parametrize("raw", BAD_INSTANCES)
def test_bad_instances_keep_their_named_errors(raw: Any) -> None:
    with pytest.raises(InvalidParam) as fast:
        nh.instance_of(raw, "instance")
    with pytest.raises(InvalidParam) as checked:
        nh._checked_instance_of(raw, "instance")
    assert fast.value.message == checked.value.message


@pytest.mark.parametrize("body", SERVICES)
def test_service_fast_path_equals_the_checked_path(body: dict[str, Any]) -> None:
    assert nh.service_of(body) == nh._checked_service_of(body)


@pytest.mark.parametrize("body", [{"serviceName": " "}, {"serviceName": 3}, {"serviceName": "s", "groupName": 1}])
def test_bad_services_keep_their_named_errors(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidParam):
        nh.service_of(body)
