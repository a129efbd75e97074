"""Page load and API time of the console's service list with N services on a real node.

Starts a standalone `shoal server`, registers N services (one instance each) through
nacos-sdk-python clients, then times ``/nacos/v1/ns/catalog/services`` over HTTP and the
console's services page in headless Chromium (open → first row and page count shown).
Not part of the suite; quote its figures with the box's load average.

    PYTHONPATH=src python bench/console/page_load.py --services 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from shoal.testing import OPEN, http_get, kill, start_server


async def register(addr: str, services: int, clients: int, root: Path) -> None:
    from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService, RegisterInstanceParam

    made = []
    for _ in range(clients):
        config = (ClientConfigBuilder().server_address(addr).log_level("WARNING").log_dir(str(root / "logs"))
                  .cache_dir(str(root / "cache")).grpc_config(GRPCConfig(grpc_timeout=30000)).build())
        made.append(await NacosNamingService.create_naming_service(config))

    async def one_client(k: int) -> None:
        for n in range(k, services, clients):
            await made[k].register_instance(RegisterInstanceParam(
                service_name=f"svc-{n:05d}", group_name=f"G{n % 10}", ip="10.9.0.1", port=10000 + n % 50000,
                healthy=n % 100 != 0))

    await asyncio.gather(*(one_client(k) for k in range(clients)))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="console-bench-"))
    server = start_server(root, auth=OPEN)
    try:
        start = time.perf_counter()
        loop = asyncio.new_event_loop()
        loop.run_until_complete(register(server.addr, args.services, args.clients, root))
        print(f"registered {args.services} services in {time.perf_counter() - start:.1f} s")
        for query in ("pageNo=1&pageSize=20", "pageNo=400&pageSize=20", "pageNo=1&pageSize=20&unhealthyOnly=true"):
            times = []
            for _ in range(7):
                t = time.perf_counter()
                status, body = http_get(server.url(f"/nacos/v1/ns/catalog/services?{query}"), 10)
                times.append((time.perf_counter() - t) * 1000)
                assert status == 200, body
                page = json.loads(body)
                wanted = args.services if "unhealthy" not in query else len(range(0, args.services, 100))
                assert page["count"] == wanted and len(page["serviceList"]) == 20, (query, page["count"])
            print(f"API {query}: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms")
        page_load(server.url("/nacos/"), root)
        print("load average:", os.getloadavg())
        loop.close()
    finally:
        kill(server)


def page_load(url: str, root: Path) -> None:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={root / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path="/usr/bin/chromedriver"))
    try:
        def shown(d: webdriver.Chrome) -> bool:
            info = d.find_elements(By.CSS_SELECTOR, "#page-info")
            rows = d.find_elements(By.CSS_SELECTOR, "tr[data-service]")
            return bool(info and rows and "services" in info[0].text)

        times = []
        for n in range(6):  # the first load also fetches the static files into the browser's cache
            # A new query string each time: a change of the fragment alone is a same-document
            # navigation, which would leave the previous load's rows on screen and time nothing.
            t = time.perf_counter()
            driver.get(f"{url}?load={n}#/services")
            WebDriverWait(driver, 30, poll_frequency=0.01, ignored_exceptions=(StaleElementReferenceException,)
                          ).until(shown)
            times.append((time.perf_counter() - t) * 1000)
        print(f"page load (open → rows and page count shown): first {times[0]:.0f} ms, then median "
              f"{statistics.median(times[1:]):.0f} ms, max {max(times[1:]):.0f} ms")
        # The same with the browser's cache off: every load fetches the page, its files and the APIs.
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
        uncached = []
        for n in range(5):
            t = time.perf_counter()
            driver.get(f"{url}?nocache={n}#/services")
            WebDriverWait(driver, 30, poll_frequency=0.01, ignored_exceptions=(StaleElementReferenceException,)
                          ).until(shown)
            uncached.append((time.perf_counter() - t) * 1000)
        print(f"page load, browser cache off: median {statistics.median(uncached):.0f} ms, max {max(uncached):.0f} ms")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
