"""Polling with an explicit deadline (never sleep-and-hope)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,  # noqa: ASYNC109 - the deadline of a condition, not of one awaited call
    what: str = "condition",
    *,
    interval: float = 0.05,
) -> Any:
    """Await until ``predicate()`` (sync, or returning an awaitable) is truthy and return that value.

    Polls every ``interval`` seconds; raises AssertionError naming ``what`` after ``timeout`` s.
    """
    try:
        async with asyncio.timeout(timeout):
            while True:
                value = predicate()
                if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
                    value = await value
                if value:
                    return value
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


def poll_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    """Blocking twin of :func:`wait_until` for code outside an event loop (threads, benchmarks)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
