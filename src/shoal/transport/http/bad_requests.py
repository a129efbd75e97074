"""Requests aiohttp cannot parse, answered without keeping or echoing them.

aiohttp (3.14) turns an unparseable request into an ``HttpProcessingError`` whose message holds
the ``repr`` of the bad line (for random bytes: the whole chunk read, up to 256 kB, so a string of
up to 1 MB), keeps it in a reference cycle (the error → its traceback → the ``data_received``
frame, holding that chunk → the list of messages → the error) and answers the 400 with that
message as its body. The cycle lives until a collection (the server collects every 50,000
allocations, ``shoal/gcpolicy.py``): after 20 s of the soak's garbage under load, 653 of them held
~160 MB of node 0 at once (RSS 96 → 268 MB; bound 2 x 96 + 50). So each connection's handler here

* breaks the cycle as soon as aiohttp has queued the error (the error's traceback dropped): the
  chunk, the frames and, once answered, the message go by reference counting;
* answers 400 with the error's kind (e.g. ``Invalid method encountered``), never the client's bytes.

What is logged is unchanged (``BadHttpFilter`` in ``server.py``: one rate-limited line).
"""

from __future__ import annotations

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError

#: The longest reason an answer carries.
MAX_REASON = 200


class BadRequestHandler(web_protocol.RequestHandler):
    """aiohttp's ``RequestHandler`` (one per connection), with what the module doc says."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        queued = self._messages  # aiohttp's queue of parsed messages: a parse error is appended last
        if queued:
            last = queued[-1][0]
            if isinstance(last, web_protocol._ErrInfo):
                last.exc.__traceback__ = None

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, HttpProcessingError):
            exc.__traceback__ = None
            reason = str(exc.message).split("\n", 1)[0].rstrip(": ")[:MAX_REASON]
            message = f"{status} Bad Request: {reason}" if reason else f"{status} Bad Request"
        return super().handle_error(request, status, exc, message)


class BadRequestServer(web.Server):
    """aiohttp's protocol factory, making :class:`BadRequestHandler` s."""

    def __call__(self) -> web_protocol.RequestHandler:
        return BadRequestHandler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections get :class:`BadRequestHandler`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = BadRequestServer  # same object, same state: only __call__ differs
        return server
