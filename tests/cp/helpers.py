"""Real etcd members on free loopback ports, a cuttable TCP proxy, and deadline polling."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.cp.supervisor import EtcdMember, EtcdSupervisor, plan_members
from shoal.testing import free_port_blocks

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def require_etcd() -> str:
    """The etcd binary; a missing one is a broken test machine, not a reason to skip."""
    if not Path(ETCD).exists():
        raise RuntimeError("etcd is not installed: run ci/setup.sh as root (Debian package etcd-server)")
    return ETCD


def free_main_ports(count: int, offsets: tuple[int, ...] = (0, -1000, -999)) -> list[int]:
    """``count`` main ports whose port+offsets are all free now and do not overlap each other."""
    return free_port_blocks(count, offsets)


def managed_cluster(data_root: Path, size: int, **kw: Any) -> list[EtcdSupervisor]:
    """Supervisors of ``size`` members planned from one member list, as every node plans them."""
    mains = free_main_ports(size)
    members = [("127.0.0.1", port) for port in mains]
    planned: list[EtcdMember] = plan_members(members)
    return [EtcdSupervisor(me, planned, data_root / f"node{i}", require_etcd(), **kw)
            for i, me in enumerate(planned)]


async def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
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


class TcpProxy:
    """A loopback TCP proxy whose connections can be cut (and new ones refused) at will, or
    frozen: connections stay open and new ones are accepted, but nothing is passed on (a
    blackholed or hung member, as seen from a client)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_main_ports(1, (0,))[0]
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    def freeze(self) -> None:
        """Stop passing bytes on, in both directions, on every connection old and new."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """Close the listener and every connection through it."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}
