"""The console at /nacos/ in headless Debian Chromium (Selenium, the system chromedriver), against
real `shoal server` nodes and real nacos-sdk-python clients: log in with auth on, find a service
the SDK registered, change an instance's weight and see the SDK subscriber pushed the new weight,
disable it and see it leave the healthy list; namespaces made in the console and registered into;
users, roles and permissions made by an admin, then used to log in; the cluster page with every
member's Distro figures. Every test saves screenshots under its tmp dir, prints their paths, and
copies them to ``$SHOAL_SCREENSHOT_DIR`` when that is set (to look at them after a run)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, NodeCluster, ServerProcess, call, http_get, poll_until, wait_until
from shoal.testing.auth import PASSWORD

from . import test_auth_e2e
from .test_auth_e2e import grpc_client
from .test_sdk_naming import Pushes

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = [
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="chromium / chromium-driver not installed (ci/test-deps.sh installs them)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
WAIT_S = 20
auth_server = test_auth_e2e.auth_server  # the `shoal server --auth` fixture, with an admin `nacos`


class Browser:
    """A headless Chromium page; blocking calls, run through ``asyncio.to_thread`` by async tests
    so the SDK clients' pushes keep arriving meanwhile."""

    def __init__(self, driver: WebDriver, shots: Path, test_name: str = "") -> None:
        self.driver = driver
        self.shots = shots
        self.test_name = test_name

    def open(self, url: str) -> None:
        self.driver.get(url)

    def find(self, css: str) -> Any:
        """The first element matching ``css``, polled for up to WAIT_S seconds."""
        try:
            return WebDriverWait(self.driver, WAIT_S, poll_frequency=0.1).until(
                lambda d: (d.find_elements(By.CSS_SELECTOR, css) or [None])[0])
        except TimeoutException:
            self.screenshot("failure")
            flash = self.driver.find_elements(By.CSS_SELECTOR, "#flash")
            raise AssertionError(f"no element {css}; page says {flash[0].text if flash else ''!r}") from None

    def text_of(self, css: str) -> str:
        return str(self.find(css).text)

    def wait_text(self, css: str, wanted: str) -> None:
        self._wait_for(css, lambda text: wanted in text, f"{css} never showed {wanted!r}")

    def wait_exact(self, css: str, wanted: str) -> None:
        self._wait_for(css, lambda text: text == wanted, f"{css} never showed exactly {wanted!r}")

    def _wait_for(self, css: str, match: Callable[[str], bool], message: str) -> None:
        # The console re-renders whole views: an element found a moment ago may be gone when its
        # text is read (stale); that is a "not yet", polled again like a missing one.
        WebDriverWait(self.driver, WAIT_S, poll_frequency=0.1,
                      ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
            lambda d: any(match(e.text) for e in d.find_elements(By.CSS_SELECTOR, css)), message=message)

    def type_into(self, css: str, text: str) -> None:
        el = self.find(css)
        el.clear()
        el.send_keys(text)

    def click(self, css: str) -> None:
        self.find(css).click()

    def screenshot(self, name: str, full_page: bool = False) -> Path:
        path = self.shots / f"{name}.png"
        if full_page:  # the whole page: the window grown to its height for the shot
            size = self.driver.get_window_size()
            height = int(self.driver.execute_script("return document.documentElement.scrollHeight"))
            self.driver.set_window_size(size["width"], max(height, size["height"]))
            self.driver.save_screenshot(str(path))
            self.driver.set_window_size(size["width"], size["height"])
        else:
            self.driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        copy_to = os.environ.get("SHOAL_SCREENSHOT_DIR")
        if copy_to:
            Path(copy_to).mkdir(parents=True, exist_ok=True)
            prefix = f"{self.test_name}-" if self.test_name else ""
            shutil.copyfile(path, Path(copy_to) / f"{prefix}{name}.png")
        return path

    def accept_confirm(self) -> None:
        """Accept the page's confirm() dialog."""
        WebDriverWait(self.driver, WAIT_S).until(lambda d: d.switch_to.alert).accept()

    def log_in(self, username: str, password: str) -> None:
        self.find("#login-form")
        self.type_into("#login-username", username)
        self.type_into("#login-password", password)
        self.click("#login-submit")


@pytest.fixture
def browser(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Browser]:
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,900", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield Browser(driver, tmp_path, request.node.name.removeprefix("test_"))
    finally:
        driver.quit()


async def in_browser(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


async def test_login_find_service_change_weight_and_disable(auth_server: Callable[..., ServerProcess],
                                                            browser: Browser, tmp_path: Path) -> None:
    from v2.nacos import ListInstanceParam, RegisterInstanceParam, SubscribeServiceParam

    server = auth_server()
    # One instance per SDK client (a client's registration of a service replaces its previous one).
    publishers = [await grpc_client(server, tmp_path, username="nacos", password=PASSWORD) for _ in range(2)]
    watcher = await grpc_client(server, tmp_path, username="nacos", password=PASSWORD)
    try:
        for publisher, ip in zip(publishers, ("10.3.0.1", "10.3.0.2"), strict=True):
            assert await publisher.register_instance(RegisterInstanceParam(
                service_name="checkout", group_name="SHOP", ip=ip, port=8080, metadata={"zone": "a"}))
        pushes = Pushes()
        await watcher.subscribe(SubscribeServiceParam(service_name="checkout", group_name="SHOP",
                                                      subscribe_callback=pushes))

        def weight_of(ip: str) -> float | None:
            for inst in pushes.calls[-1] if pushes.calls else []:
                if inst.ip == ip:
                    return float(inst.weight)
            return None

        # Auth is on: the console opens on its login page, then the service list.
        await in_browser(browser.open, server.url("/nacos/"))
        await in_browser(browser.find, "#login-form")
        await in_browser(browser.screenshot, "01-login")
        await in_browser(browser.type_into, "#login-username", "nacos")
        await in_browser(browser.type_into, "#login-password", PASSWORD)
        await in_browser(browser.click, "#login-submit")
        await in_browser(browser.find, 'tr[data-service="SHOP@@checkout"]')
        token = await in_browser(browser.driver.execute_script,
                                 "return JSON.parse(localStorage.getItem('token')).accessToken")
        assert token  # kept as the Nacos console keeps it

        # Search, then open the service.
        await in_browser(browser.type_into, "#search-name", "check")
        await in_browser(browser.click, "#search")
        await in_browser(browser.wait_exact, "#page-info", "Page 1 of 1 · 1 service")
        await in_browser(browser.screenshot, "02-services")
        await in_browser(browser.click, 'tr[data-service="SHOP@@checkout"] a')
        row = 'tr[data-instance="10.3.0.1:8080"]'
        await in_browser(browser.wait_text, f"{row} .owner", "this node")

        # Weight 1 → 7: the SDK subscriber is pushed the new weight.
        await in_browser(browser.type_into, f"{row} .weight-input", "7")
        await in_browser(browser.click, f"{row} .save-weight")
        await wait_until(lambda: weight_of("10.3.0.1") == 7.0, timeout=WAIT_S, what="push with weight 7")
        await in_browser(browser.wait_text, "#flash", "weight 7")
        await in_browser(browser.screenshot, "03-weight-7")

        # Disable: it leaves the healthy list (and the subscriber's push).
        await in_browser(browser.click, f"{row} .toggle-enabled")
        await wait_until(lambda: pushes.latest_ips() == {("10.3.0.2", 8080)}, timeout=WAIT_S,
                         what="push without the disabled instance")
        healthy = await watcher.list_instances(ListInstanceParam(service_name="checkout", group_name="SHOP",
                                                                 subscribe=False, healthy_only=True))
        assert {i.ip for i in healthy} == {"10.3.0.2"}
        await in_browser(browser.wait_text, row, "disabled")
        await in_browser(browser.screenshot, "04-disabled")

        # Service metadata and protect threshold, through the service API.
        await in_browser(browser.type_into, "#protect-threshold", "0.3")
        await in_browser(browser.type_into, "#service-metadata", "owner=team-a")
        await in_browser(browser.click, "#save-service")
        await in_browser(browser.wait_text, "#flash", "Service saved")
        await in_browser(browser.wait_text, "#service-metadata", "owner=team-a")
        status, body = await asyncio.to_thread(http_get, server.url(
            f"/nacos/v1/ns/catalog/service?serviceName=checkout&groupName=SHOP&accessToken={token}"))
        assert status == 200, body
        detail = json.loads(body)["service"]
        assert (detail["protectThreshold"], detail["metadata"]) == (0.3, {"owner": "team-a"})
        await in_browser(browser.screenshot, "04b-service-metadata")

        # The cluster page shows this node, UP.
        await in_browser(browser.open, server.url("/nacos/#/cluster"))
        await in_browser(browser.wait_text, "#members", "UP")
        await in_browser(browser.screenshot, "05-cluster")
    finally:
        for client in (*publishers, watcher):
            await client.shutdown()


async def test_unhealthy_filter_and_paging_without_auth(server: ServerProcess, sdk: Any, browser: Browser) -> None:
    from v2.nacos import RegisterInstanceParam

    client = await sdk(server.addr)
    for n in range(25):  # one SDK client, 25 services; svc-13's instance is registered unhealthy
        assert await client.register_instance(RegisterInstanceParam(
            service_name=f"svc-{n:02d}", ip="10.4.0.1", port=8000 + n, healthy=n != 13))
    await in_browser(browser.open, server.url("/nacos/"))
    await in_browser(browser.wait_text, "#page-info", "Page 1 of 2 · 25 services")
    await in_browser(browser.click, "#next")
    await in_browser(browser.wait_text, "#page-info", "Page 2 of 2")
    await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@svc-24"]')
    await in_browser(browser.click, "#unhealthy-only")
    await in_browser(browser.wait_exact, "#page-info", "Page 1 of 1 · 1 service")
    await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@svc-13"]')
    await in_browser(browser.screenshot, "06-unhealthy-filter")


def test_cluster_page_shows_three_members(tmp_path: Path, browser: Browser) -> None:
    from .test_cluster import FAST

    cluster = NodeCluster(tmp_path, 3, [*FAST, "-D", "shoal.console.chart.interval-ms=300"], auth=OPEN)
    try:
        cluster.start_all()
        node = cluster.nodes[0]
        poll_until(lambda: sum(m.get("state") == "UP" for m in node.members()) == 3, timeout=WAIT_S,
                   what="three members UP")
        for n in range(30):  # ip:port clients: each lands on (and is owned by) the node the mapper names
            status, _ = call("POST", node.url("/nacos/v1/ns/instance"), {
                "serviceName": "spread", "ip": f"10.11.0.{n + 1}", "port": "80", "ephemeral": "true"})
            assert status == 200
        browser.open(node.url("/nacos/#/cluster"))
        browser.wait_text("h1", "3 members · 3 up")
        for i in range(3):
            browser.wait_text(f'tr[data-member="{cluster.addr(i)}"]', "UP")
        browser.wait_text("#node-state", "cluster")
        browser.wait_text("#node-figures", "responsibleClientCount")
        # every peer's Distro figures as node 0 sees them: a sync queue, and a verify that agreed
        for i in (1, 2):
            row = f'tr[data-member="{cluster.addr(i)}"]'
            browser.wait_text(f"{row} .sync-queue", "0")
            browser.wait_text(f"{row} .last-verify", "ok")
        browser.wait_text(f'tr[data-member="{cluster.addr(0)}"]', "this node")
        browser.wait_text("#settings", "nacos.core.protocol.distro.data.verify.intervalMs")
        owned = [int(browser.text_of(f'tr[data-member="{cluster.addr(i)}"] .clients-owned')) for i in range(3)]
        assert sum(owned) == 30, owned
        browser.wait_text("#consistency", "All 3 members agree on 1 service.")  # issue 23 item 4
        # the charts (issue 23 item 6): the Distro sync queue towards each peer, one line each
        poll_until(lambda: set(browser.driver.execute_script(
            "return [...document.querySelectorAll('#chart-sync path.line')].map((p) => p.dataset.series)"))
            == {cluster.addr(1), cluster.addr(2)}, timeout=WAIT_S, what="a sync line per peer")
        browser.wait_text("#chart-instances .last", "30")
        browser.screenshot("07-cluster-3-nodes", full_page=True)
    finally:
        cluster.kill_all()


async def test_namespace_switcher_shows_a_namespaces_services(server: ServerProcess, sdk: Any,
                                                              browser: Browser) -> None:
    from selenium.webdriver.support.ui import Select
    from v2.nacos import RegisterInstanceParam

    status, _ = await asyncio.to_thread(call, "POST", server.url("/nacos/v1/console/namespaces"),
                                        data={"customNamespaceId": "dev", "namespaceName": "Development"})
    assert status == 200
    client = await sdk(server.addr, namespace="dev")
    assert await client.register_instance(RegisterInstanceParam(service_name="inventory", ip="10.5.0.1", port=7000))
    await in_browser(browser.open, server.url("/nacos/"))
    await in_browser(browser.wait_text, "#namespace", "Development")
    await in_browser(browser.wait_text, "#page-info", "0 services")
    await in_browser(lambda: Select(browser.find("#namespace")).select_by_value("dev"))
    await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@inventory"]')
    await in_browser(browser.wait_exact, "#page-info", "Page 1 of 1 · 1 service")
    await in_browser(browser.screenshot, "08-namespace-dev")


async def test_namespace_made_in_the_console_and_registered_into(server: ServerProcess, sdk: Any,
                                                               browser: Browser) -> None:
    from selenium.webdriver.support.ui import Select
    from v2.nacos import RegisterInstanceParam

    await in_browser(browser.open, server.url("/nacos/#/namespaces"))
    await in_browser(browser.find, 'tr[data-namespace="public"]')
    # Nacos's rules are shown before anything is sent ...
    await in_browser(browser.type_into, "#ns-id", "staging")
    await in_browser(browser.type_into, "#ns-name", "Stag#ing")
    await in_browser(browser.click, "#ns-create-submit")
    await in_browser(browser.wait_text, "#flash", "may not contain")
    await in_browser(browser.type_into, "#ns-name", "Staging")
    await in_browser(browser.type_into, "#ns-desc", "pre-production")
    await in_browser(browser.click, "#ns-create-submit")
    await in_browser(browser.wait_text, 'tr[data-namespace="staging"]', "pre-production")
    # ... and the server's own refusal is shown as it says it
    await in_browser(browser.type_into, "#ns-id", "staging")
    await in_browser(browser.type_into, "#ns-name", "Staging again")
    await in_browser(browser.click, "#ns-create-submit")
    await in_browser(browser.wait_text, "#flash", "already exist")
    await in_browser(browser.screenshot, "09-namespaces-error")

    # edit it
    await in_browser(browser.click, 'tr[data-namespace="staging"] button.edit')
    await in_browser(browser.type_into, 'tr[data-namespace="staging"] .ns-desc-input', "pre-production, EU")
    await in_browser(browser.click, 'tr[data-namespace="staging"] button.save')
    await in_browser(browser.wait_text, 'tr[data-namespace="staging"]', "pre-production, EU")
    await in_browser(browser.screenshot, "10-namespaces")

    # the SDK registers into it by its id; the console shows the service once switched to it
    client = await sdk(server.addr, namespace="staging")
    assert await client.register_instance(RegisterInstanceParam(service_name="billing", ip="10.7.0.1", port=7100))
    await in_browser(browser.click, 'tr[data-namespace="staging"] a')
    await in_browser(browser.wait_text, "#namespace", "Staging")
    await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@billing"]')
    await in_browser(lambda: Select(browser.find("#namespace")).select_by_value("public"))
    await in_browser(browser.wait_text, "#page-info", "0 services")
    await in_browser(lambda: Select(browser.find("#namespace")).select_by_value("staging"))
    await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@billing"]')
    await in_browser(browser.wait_exact, "#page-info", "Page 1 of 1 · 1 service")
    await in_browser(browser.screenshot, "11-namespace-staging-services")

    # a namespace made and deleted in the console is gone from the API too
    await in_browser(browser.open, server.url("/nacos/#/namespaces"))
    await in_browser(browser.type_into, "#ns-id", "scratch")
    await in_browser(browser.type_into, "#ns-name", "Scratch")
    await in_browser(browser.click, "#ns-create-submit")
    await in_browser(browser.click, 'tr[data-namespace="scratch"] button.delete')
    await in_browser(browser.accept_confirm)
    await in_browser(browser.wait_text, "#flash", "Namespace scratch deleted")
    status, body = await asyncio.to_thread(http_get, server.url("/nacos/v1/console/namespaces"))
    ids = {n["namespace"] for n in json.loads(body)["data"]}
    assert status == 200 and "staging" in ids and "scratch" not in ids


async def test_admin_makes_a_user_role_and_permission_then_that_user_logs_in(
        auth_server: Callable[..., ServerProcess], browser: Browser, tmp_path: Path) -> None:
    from v2.nacos import RegisterInstanceParam

    server = auth_server()
    publisher = await grpc_client(server, tmp_path, username="nacos", password=PASSWORD)
    try:
        assert await publisher.register_instance(RegisterInstanceParam(service_name="ledger", ip="10.8.0.1", port=80))
        await in_browser(browser.open, server.url("/nacos/"))
        await in_browser(browser.log_in, "nacos", PASSWORD)
        await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@ledger"]')

        # users: create, change the password
        await in_browser(browser.click, "#nav-users")
        await in_browser(browser.type_into, "#user-name", "carol")
        await in_browser(browser.type_into, "#user-password", "first-password")
        await in_browser(browser.click, "#user-create-submit")
        await in_browser(browser.find, 'tr[data-user="carol"]')
        await in_browser(browser.type_into, 'tr[data-user="carol"] .new-password', "carol-password")
        await in_browser(browser.click, 'tr[data-user="carol"] .change-password')
        await in_browser(browser.wait_text, "#flash", "Password of carol changed")
        await in_browser(browser.screenshot, "12-users")

        # roles: bind (the username is suggested by the users search)
        await in_browser(browser.click, "#nav-roles")
        await in_browser(browser.type_into, "#role-name", "ledger-readers")
        await in_browser(browser.type_into, "#role-user", "car")
        await in_browser(lambda: WebDriverWait(browser.driver, WAIT_S).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, '#role-user-list option[value="carol"]')))
        await in_browser(browser.type_into, "#role-user", "carol")
        await in_browser(browser.click, "#role-bind-submit")
        await in_browser(browser.find, 'tr[data-role="ledger-readers"][data-user="carol"]')
        await in_browser(browser.screenshot, "13-roles")

        # permissions: grant read on the public namespace; a bad one is refused with Nacos's message
        await in_browser(browser.click, "#nav-permissions")
        await in_browser(browser.type_into, "#perm-role", "nobody-has-this")
        await in_browser(browser.type_into, "#perm-resource", "public:*:*")
        await in_browser(browser.click, "#perm-grant-submit")
        await in_browser(browser.wait_text, "#flash", "role nobody-has-this not found")
        await in_browser(browser.type_into, "#perm-role", "ledger-readers")
        await in_browser(browser.click, "#perm-grant-submit")
        await in_browser(browser.wait_text, 'tr[data-role="ledger-readers"]', "public:*:*")
        await in_browser(browser.screenshot, "14-permissions")

        # carol logs in: she sees the services her role may read, and no admin pages
        await in_browser(browser.click, "#logout")
        await in_browser(browser.log_in, "carol", "carol-password")
        await in_browser(browser.find, 'tr[data-service="DEFAULT_GROUP@@ledger"]')
        await in_browser(browser.wait_text, "#who", "carol")
        assert not await in_browser(lambda: browser.find("#nav-users").is_displayed())
        assert not await in_browser(lambda: browser.find("#nav-cluster").is_displayed())
        await in_browser(browser.screenshot, "15-logged-in-as-carol")
        # the cluster page (admin APIs) says why it shows nothing, instead of hanging on "Loading…"
        await in_browser(browser.open, server.url("/nacos/#/cluster"))
        await in_browser(browser.wait_text, "#cluster-admin-only", "admins only")
        await in_browser(browser.screenshot, "16-cluster-not-admin")
    finally:
        await publisher.shutdown()
