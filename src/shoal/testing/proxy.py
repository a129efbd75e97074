"""A loopback TCP proxy a test can cut or freeze: what a lost or hung member looks like from a client."""

from __future__ import annotations

import asyncio
import contextlib

from shoal.testing.procs import free_port_block


class TcpProxy:
    """A loopback TCP proxy whose connections can be cut (and new ones refused) at will, or
    frozen: connections stay open and new ones are accepted, but nothing is passed on (a
    blackholed or hung member, as seen from a client)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port_block((0,))
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
