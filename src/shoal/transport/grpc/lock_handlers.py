"""The lock module's request handler (Nacos ``LockRequestHandler``): JSON body → lock use case.

``LockOperationRequest`` carries ``lockInstance`` (``key``, ``expiredTime``, ``params``,
``lockType``) and ``lockOperationEnum`` (``ACQUIRE`` or ``RELEASE``); the answer is a
``LockOperationResponse`` whose ``result`` is the boolean outcome (docs/protocol.md §9).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from shoal.errors import InvalidParam
from shoal.service_layer.lock import LockRequest, LockService, check_lock
from shoal.transport.grpc import codec
from shoal.transport.grpc.connections import Connection
from shoal.transport.grpc.handlers import Handler, RequestContext

ACQUIRE = "ACQUIRE"
RELEASE = "RELEASE"


def lock_handlers(locks: LockService) -> dict[str, Handler]:
    """The handler table of the lock module."""
    return {"LockOperationRequest": Handler("LockOperationResponse", _LockHandlers(locks).operate)}


class LockConnectionListener:
    """Releases a closed connection's locks (an ``on_unregister_hooks`` entry of the SDK port)."""

    def __init__(self, locks: LockService) -> None:
        self.locks = locks

    def __call__(self, conn: Connection, reason: str) -> None:
        self.locks.connection_closed(conn.connection_id)


class _LockHandlers:
    def __init__(self, locks: LockService) -> None:
        self.locks = locks

    def operate(self, ctx: RequestContext, body: dict[str, Any]) -> Awaitable[bytes]:
        """Checks answer at once (InvalidParam); the store call is awaited."""
        operation = body.get("lockOperationEnum")
        req = _lock_of(body.get("lockInstance"))
        holder = self.locks.holder_of(ctx.conn.connection_id)
        if operation == ACQUIRE:
            return _answered(self.locks.acquire(req, holder))
        if operation == RELEASE:
            return _answered(self.locks.release(req, holder))
        # Nacos: EXPIRE (and anything else) has no handler
        raise InvalidParam("There is no Handler of such operations!")


def _lock_of(raw: Any) -> LockRequest:
    if not isinstance(raw, dict):
        raise InvalidParam("lockInstance must be an object")
    params = raw.get("params")
    if params is not None and not isinstance(params, dict):
        raise InvalidParam("lockInstance.params must be an object")
    owner = (params or {}).get("owner", raw.get("owner"))
    return check_lock(raw.get("key"), raw.get("lockType"), raw.get("expiredTime"), owner)


async def _answered(outcome: Awaitable[bool]) -> bytes:
    return codec.ok({"result": await outcome})
