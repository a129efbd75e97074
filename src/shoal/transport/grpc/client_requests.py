"""Server → client requests that wait for the client's ack, over the SDK connections: pushes
(``NotifySubscriberRequest``, the push engine's ``PushSender``) and fuzzy-watch notifications
(the fuzzy notifier's ``FuzzySender``).

They need only the connection table, not the server, so the node builds them before the SDK
server and hands them to the push engine and the fuzzy notifier at construction.
"""

from __future__ import annotations

from typing import Any

from shoal.errors import PushGone
from shoal.transport.grpc.connections import ConnectionGone, ConnectionManager, is_success


class ClientRequests:
    """Sends one request to a client's bi stream and awaits its answer."""

    def __init__(self, manager: ConnectionManager) -> None:
        self.manager = manager

    async def send_push(self, client_id: str, service_info_json: str, timeout_ms: int) -> bool:
        """NotifySubscriberRequest (PushSender); True when the client acked it."""
        try:
            reply = await self.manager.request(client_id, "NotifySubscriberRequest", {"module": "naming"},
                                               timeout_ms, raw={"serviceInfo": service_info_json})
        except ConnectionGone as exc:
            raise PushGone(str(exc)) from None
        return is_success(reply)

    async def send_server_request(self, client_id: str, type_name: str, fields: dict[str, Any],
                                  timeout_ms: int) -> bool:
        """One server request (fuzzy-watch sync or change) awaiting the client's ack (FuzzySender)."""
        try:
            reply = await self.manager.request(client_id, type_name, fields, timeout_ms)
        except ConnectionGone as exc:
            raise PushGone(str(exc)) from None
        return is_success(reply)
