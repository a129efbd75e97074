"""The Nacos 3.x first visit in headless Chromium: a node on the secure defaults with no users
opens its console on the page that sets the admin's password; once set, the console is logged in,
the password works for the APIs, and the next visit opens on the login page instead."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.testing import SECURE, ServerProcess, kill, start_server
from shoal.testing.http import call, call_json

from .test_console_browser import Browser, browser, pytestmark  # noqa: F401  (the fixture and skip marks)

PASSWORD = "console-chosen-pw"


@pytest.fixture
def fresh_node(tmp_path: Path) -> Iterator[ServerProcess]:
    """A node on the defaults (every API needs a login) whose store has no users yet."""
    node = start_server(tmp_path, auth=SECURE)
    yield node
    kill(node)


def first_visit(browser: Browser, node: ServerProcess) -> None:  # noqa: F811
    browser.open(node.url("/nacos/"))
    browser.find("#init-form")
    browser.screenshot("first-visit-asks-for-the-admin-password")
    browser.type_into("#init-password", PASSWORD)
    browser.type_into("#init-password-again", PASSWORD + "x")
    browser.click("#init-submit")
    browser.wait_text("#flash", "differ")
    browser.type_into("#init-password-again", PASSWORD)
    browser.click("#init-submit")
    browser.wait_exact("#who", "nacos")
    browser.find("#services")
    browser.screenshot("logged-in-after-setting-it")


def next_visit(browser: Browser, node: ServerProcess) -> None:  # noqa: F811
    browser.click("#logout")
    browser.open(node.url("/nacos/"))
    browser.find("#login-form")
    browser.log_in("nacos", PASSWORD)
    browser.wait_exact("#who", "nacos")


async def test_the_console_asks_for_the_first_admin_password_then_logs_in_with_it(
        fresh_node: ServerProcess, browser: Browser) -> None:  # noqa: F811
    assert call_json("GET", fresh_node.url("/nacos/v1/console/server/state"))["auth_admin_request"] == "true"
    await asyncio.to_thread(first_visit, browser, fresh_node)
    assert call_json("GET", fresh_node.url("/nacos/v1/console/server/state"))["auth_admin_request"] == "false"
    login = call_json("POST", fresh_node.url("/nacos/v1/auth/login"), data={"username": "nacos",
                                                                             "password": PASSWORD})
    assert login["globalAdmin"] is True
    assert call("POST", fresh_node.url("/nacos/v3/auth/user/admin"), data={"password": "again-pw"})[1].find(
        '"code":409') >= 0
    await asyncio.to_thread(next_visit, browser, fresh_node)
