"""A member that accepts connections but never answers (blackholed, or frozen) must not pin a
node's writes: the write sent to it fails (it cannot be retried, it may have been applied) and the
next write goes to another member. Found by the CP partition test in tests/faults."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from shoal.cp.etcd import EtcdStore
from shoal.cp.supervisor import EtcdSupervisor
from shoal.errors import CpUnavailable

from .helpers import free_main_ports


async def test_a_write_after_one_that_hung_goes_to_another_member(etcd: EtcdSupervisor) -> None:
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    port = free_main_ports(1, (0,))[0]
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    store = EtcdStore([f"127.0.0.1:{port}", *etcd.endpoints], request_timeout_ms=500, backoff_max_ms=200)
    await store.start()
    try:
        with pytest.raises(CpUnavailable):
            await store.put("/hung/first", b"1")
        assert await store.put("/hung/second", b"2") > 0
        got = await store.get("/hung/second")
        assert got is not None and got.value == b"2"
    finally:
        await store.close()
        for writer in held:
            writer.transport.abort()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
