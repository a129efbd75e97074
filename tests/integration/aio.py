"""Async polling with an explicit deadline (never sleep-and-hope)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Await until ``predicate()`` (sync or async) is truthy, polling, or fail at the deadline."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                value = predicate()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return value
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None
