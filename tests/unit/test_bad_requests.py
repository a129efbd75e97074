"""Requests aiohttp cannot parse (shoal/transport/http/bad_requests.py), on a real socket.

The 400 must not echo the client's bytes, and nothing of the request may outlive its answer
waiting for a collection (aiohttp kept each one in a reference cycle with its chunk and a repr of
it: 160 MB of a node under a garbage burst).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from shoal.testing import free_port_block
from shoal.transport.http.bad_requests import MAX_REASON, Runner
from shoal.transport.http.server import BAD_HTTP_FILTER


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    aiohttp_log = logging.getLogger("aiohttp.server")
    aiohttp_log.addFilter(BAD_HTTP_FILTER)  # as the node does (else pytest's log capture keeps the error)
    app = web.Application()
    app.router.add_get("/", hello)
    runner = Runner(app)
    await runner.setup()
    chosen = free_port_block()
    await web.TCPSite(runner, "127.0.0.1", chosen).start()
    try:
        yield chosen
    finally:
        await runner.cleanup()
        aiohttp_log.removeFilter(BAD_HTTP_FILTER)


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def _parse_errors() -> int:
    return sum(isinstance(o, HttpProcessingError) for o in gc.get_objects())


@pytest.mark.parametrize("garbage", [os.urandom(200_000).replace(b"\r\n", b"xx"),
                                     b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(100_000).replace(b"\r\n", b"xx")],
                         ids=["random", "h2-preface"])
async def test_garbage_is_answered_400_without_echo_nor_cycle(port: int, garbage: bytes) -> None:
    gc.disable()  # what is left must be left by reference counting alone
    try:
        before = _parse_errors()
        answer = await _exchange(port, garbage)
        await asyncio.sleep(0)
        status, size = answer[:12], len(answer)
        assert status in (b"HTTP/1.0 400", b"HTTP/1.1 400"), status
        assert size < 600 + MAX_REASON, f"{size} bytes: the request echoed"
        assert _parse_errors() == before, "the parse error outlived its answer"
    finally:
        gc.enable()


async def test_good_requests_still_served(port: int) -> None:
    answer = await _exchange(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    status, body = answer[:12], answer[-2:]
    assert status == b"HTTP/1.1 200" and body == b"ok"
