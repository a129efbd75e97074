"""The console's pictures (issue 23 item 6) in headless Debian Chromium, against a real `shoal
server` and real nacos-sdk-python clients: the cluster page draws the node's last minutes
(requests per second by kind, push p99, connections, instances, Distro sync per member,
services in disagreement) as inline SVG from ``/nacos/v1/console/cluster/charts``, and the
service page shows each subscriber's push lag. A short chart interval makes samples accumulate
quickly; screenshots are saved under the test's tmp dir (and ``$SHOAL_SCREENSHOT_DIR``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from shoal.testing import ServerProcess, http_get, wait_until

from .test_console_browser import WAIT_S, Browser, browser, in_browser, pytestmark  # noqa: F401  (fixture, marks)
from .test_sdk_naming import Pushes

pytest.importorskip("selenium.webdriver")


async def charts_of(server: ServerProcess) -> dict[str, Any]:
    status, body = await asyncio.to_thread(http_get, server.url("/nacos/v1/console/cluster/charts"))
    assert status == 200, body
    return dict(json.loads(body))


async def subscriber_lag(server: ServerProcess, service: str) -> list[dict[str, Any]]:
    status, body = await asyncio.to_thread(http_get, server.url(
        f"/nacos/v1/ns/service/subscribers?serviceName={service}"))
    assert status == 200, body
    return [s["pushLag"] for s in json.loads(body)["subscribers"]]


#: Read in one script, so a chart redrawn meanwhile (every interval) is read whole, never half.
CHART_FIGURES_JS = """
const box = document.getElementById(arguments[0]);
if (!box) return null;
const all = (css) => [...box.querySelectorAll(css)];
return {
  max: Number(box.dataset.max),
  lines: Object.fromEntries(all("svg path.line").map((p) => [p.dataset.series, Number(p.dataset.points)])),
  marks: all("svg path.line").map((p) => (p.getAttribute("d").match(/L/g) || []).length).reduce((a, b) => a + b, 0)
    + all("svg circle.dot").length,
  ylabels: all("svg text.ylabel").map((t) => t.textContent),
  xlabels: all("svg text.xlabel").map((t) => t.textContent),
  last: Object.fromEntries(all(".legend .key").map((k) => [k.dataset.series, k.querySelector(".last").textContent])),
  title: box.querySelector(".chart-title").textContent,
  text: box.textContent,
};
"""


def chart_figures(driver: Any, chart: str) -> dict[str, Any]:
    """What the page drew for one chart: its lines' point counts, axis labels, last values."""
    figures = driver.execute_script(CHART_FIGURES_JS, chart)
    assert figures is not None, f"no chart {chart}"
    return dict(figures)


async def test_cluster_charts_and_push_lag_per_subscriber(servers: Callable[..., ServerProcess], sdk: Any,
                                                          browser: Browser) -> None:  # noqa: F811
    from v2.nacos import ListInstanceParam, RegisterInstanceParam, SubscribeServiceParam

    server = servers("-D", "shoal.console.chart.interval-ms=200", "-D", "shoal.console.chart.window-ms=60000")
    publishers = [await sdk(server.addr) for _ in range(3)]
    watcher = await sdk(server.addr)
    pushes = Pushes()
    await watcher.subscribe(SubscribeServiceParam(service_name="orders", subscribe_callback=pushes))
    for n, publisher in enumerate(publishers):  # each registration pushes the watcher a new list
        assert await publisher.register_instance(RegisterInstanceParam(
            service_name="orders", ip=f"10.9.0.{n + 1}", port=8080))
        await wait_until(lambda n=n: len(pushes.latest_ips() or ()) == n + 1, timeout=WAIT_S,
                         what=f"push with {n + 1} instances")
    for _ in range(20):  # queries: gRPC requests counted in the next samples
        await watcher.list_instances(ListInstanceParam(service_name="orders", subscribe=False, healthy_only=None))
    for weight in range(2, 6):  # a push in each of several samples: the p99 line has points to join
        samples = (await charts_of(server))["samples"]
        taken = samples[-1]["time"] if samples else 0
        assert await publishers[0].register_instance(RegisterInstanceParam(
            service_name="orders", ip="10.9.0.1", port=8080, weight=float(weight)))
        await wait_until(lambda w=weight: any(float(i.weight) == w for i in (pushes.calls[-1] if pushes.calls else ())),
                         timeout=WAIT_S, what=f"push with weight {weight}")
        await wait_until(lambda t=taken: _sampled_since(server, t), timeout=WAIT_S, what="a sample after the push")

    # The ring buffer: samples every 200 ms, with the requests, an acked push's p99, the model's sizes.
    async def sampled() -> bool:
        samples = (await charts_of(server))["samples"]
        return (len(samples) >= 10 and any(s["requests"].get("grpc", 0) > 0 for s in samples)
                and any(s["pushP99Ms"] is not None for s in samples)
                and samples[-1]["instances"] == 3 and samples[-1]["connections"] == 4)
    await wait_until(sampled, timeout=WAIT_S, what="chart samples with requests, pushes, 3 instances")
    data = await charts_of(server)
    assert (data["intervalMs"], data["windowMs"], data["capacity"]) == (200, 60000, 300)
    assert data["samples"][-1]["sync"] == {}  # standalone: no peers
    assert [s["time"] for s in data["samples"]] == sorted(s["time"] for s in data["samples"])

    # The subscriber's push lag, on the service API the page reads.
    await wait_until(lambda: _acked(subscriber_lag(server, "orders")), timeout=WAIT_S, what="an acked push")

    # The cluster page draws them.
    await in_browser(browser.open, server.url("/nacos/#/cluster"))
    await in_browser(browser.find, "#chart-requests svg path.line")
    await in_browser(browser.wait_text, "#charts-title", "one sample every 200 ms")
    await in_browser(browser.wait_text, "#chart-instances .last", "3")
    requests = await in_browser(chart_figures, browser.driver, "chart-requests")
    assert requests["max"] > 0, requests  # the requests series is not flat zero
    assert requests["lines"]["gRPC (SDK)"] >= 10, requests
    assert requests["ylabels"][0] == "0" and len(requests["ylabels"]) == 3, requests
    assert all(":" in label for label in requests["xlabels"]) and len(requests["xlabels"]) == 2, requests
    p99 = await in_browser(chart_figures, browser.driver, "chart-push-p99")
    assert p99["lines"]["p99"] >= 2 and p99["max"] > 0, p99
    assert p99["marks"] >= 2, p99  # every point shows: a segment's end or a dot of its own
    assert "no push acked yet" not in p99["text"], p99
    for chart, last in (("chart-instances", "3"), ("chart-connections", "4")):
        figures = await in_browser(chart_figures, browser.driver, chart)
        assert list(figures["last"].values()) == [last], figures
        assert sum(figures["lines"].values()) >= 10, figures
    sync = await in_browser(chart_figures, browser.driver, "chart-sync")
    assert sync["lines"] == {} and "Distro sync" in sync["title"], sync
    assert "standalone" in sync["text"], sync
    # the page re-reads the series: more points a moment later
    before = requests["lines"]["gRPC (SDK)"]
    await wait_until(lambda: _more_points(browser, before), timeout=WAIT_S, what="the charts refreshed")
    await in_browser(browser.screenshot, "20-cluster-charts", True)

    # The service page: the subscriber's push lag (last, p99, pending).
    await in_browser(browser.open, server.url("/nacos/#/service?ns=public&group=DEFAULT_GROUP&name=orders"))
    await in_browser(browser.wait_text, "#subscribers tbody tr .last-lag", " ms")
    await in_browser(browser.wait_text, "#subscribers tbody tr .p99-lag", " ms")
    await in_browser(browser.wait_exact, "#subscribers tbody tr .pending", "0")
    await in_browser(browser.driver.execute_script, "document.getElementById('subscribers').scrollIntoView()")
    await in_browser(browser.screenshot, "21-service-push-lag")


async def _acked(rows: Any) -> bool:
    lags = await rows
    return bool(lags) and all(lag["lastMs"] is not None and lag["p99Ms"] is not None for lag in lags)


async def _more_points(page: Browser, before: int) -> bool:
    figures = await in_browser(chart_figures, page.driver, "chart-requests")
    return bool(figures["lines"].get("gRPC (SDK)", 0) > before)


async def _sampled_since(server: ServerProcess, last_time: int) -> bool:
    """Two samples ended after ``last_time``: the interval holding the push's ack is in."""
    return sum(s["time"] > last_time for s in (await charts_of(server))["samples"]) >= 2
