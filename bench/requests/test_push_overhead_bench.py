"""What issue 23 added to every push, in process: the digest of the ServiceInfo (everything but
``lastRefTime``) compared with the subscriber's last acked one, and the lag bookkeeping of an
ack (one deque append and one histogram observation). Measured on the payload of a service of
100 instances with 4 metadata keys each (as ``bench/load`` registers) and of one of 10.

Run with ``bash ci/bench.sh -k push_overhead``; compare the figures with the cost of building
and sending the push itself (``test_requests_bench``: the subscribe answer builds the same
ServiceInfo)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from shoal.metrics import Metrics
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceView, service_info_json
from shoal.push.service import LAG_WINDOW, content_digest

SVC = ServiceKey("public", "DEFAULT_GROUP", "bench")


def payload(hosts: int) -> str:
    instances = [InstanceInfo(f"10.0.{i // 250}.{i % 250}", 8080, metadata={
        "version": "1.0", "zone": "a", "env": "bench", "idx": str(i)}) for i in range(hosts)]
    view = ServiceView(SVC, instances, True)
    return service_info_json(SVC, "", view.select(frozenset(), False, None), 1_700_000_000_000, 10_000)


@pytest.mark.parametrize("hosts", [10, 100])
def test_push_digest(benchmark: Any, hosts: int) -> None:
    text = payload(hosts)
    acked = content_digest(text)
    benchmark.extra_info["payload_bytes"] = len(text)
    assert benchmark(lambda: content_digest(text) == acked)


def test_ack_bookkeeping(benchmark: Any) -> None:
    metrics = Metrics()
    lags: deque[tuple[int, int]] = deque(maxlen=LAG_WINDOW)

    def ack() -> None:
        lags.append((1, 2))
        metrics.push_acked("public", "native", 0.002)

    benchmark(ack)
    assert len(lags) == LAG_WINDOW
