"""Owned background work: periodic loops with start()/stop(), and the one executor helper.

Every periodic loop of the node is a Periodic created by app.py, so shutdown can cancel all
of them; blocking work (file I/O, bulk CPU) goes through ``run_blocking`` so nothing blocks
the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


async def run_blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking call in the default executor and await its result."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


class Periodic:
    """Runs ``tick`` every ``interval_ms`` (fixed delay: a slow tick delays the next one).

    A failing tick is logged and the loop goes on; stop() cancels and waits.
    """

    def __init__(self, name: str, interval_ms: int, tick: Callable[[], Awaitable[object]],
                 initial_delay_ms: int | None = None) -> None:
        self.name = name
        self.interval_ms = interval_ms
        self.initial_delay_ms = interval_ms if initial_delay_ms is None else initial_delay_ms
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        await asyncio.sleep(self.initial_delay_ms / 1000)
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed; it runs again in %d ms", self.name, self.interval_ms)
            await asyncio.sleep(self.interval_ms / 1000)


async def wait_until_due(wake: asyncio.Event, due_ms: int | None, now_ms: int) -> None:
    """Sleep until ``due_ms`` (monotonic ms; None = no deadline) or until ``wake`` is set.

    The delay engines' idle wait: a loop timer sets the event, so no task is created per wait
    (``asyncio.wait_for`` would create one each time). The caller clears ``wake`` beforehand.
    """
    if due_ms is None:
        await wake.wait()
        return
    delay = (due_ms - now_ms) / 1000
    if delay <= 0:
        return
    timer = asyncio.get_running_loop().call_later(delay, wake.set)
    try:
        await wake.wait()
    finally:
        timer.cancel()
