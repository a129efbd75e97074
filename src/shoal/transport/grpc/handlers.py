"""Request handler table types and the per-request context handed to handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from shoal.transport.grpc.codec import Encoded
from shoal.transport.grpc.connections import Connection


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the caller: its connection and the merged headers."""

    conn: Connection
    headers: dict[str, str]

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


class Handler(NamedTuple):
    """A unary handler: the response type it answers with (also used for typed filter
    failures) and a function from the JSON body to the response body JSON (UTF-8 bytes), or to the
    whole answer Payload already encoded (``codec.Encoded``, the query's cached answers). Most
    handlers are synchronous; one that must wait (a CP store write) returns an awaitable of the body."""

    response_type: str
    handle: Callable[[RequestContext, dict[str, Any]], bytes | Encoded | Awaitable[bytes]]


# Requests that only peers may send (docs/protocol.md §1.6 step 1): refused on the SDK port.
CLUSTER_ONLY_TYPES = frozenset({"DistroDataRequest", "MemberReportRequest", "ServerLoaderInfoRequest",
                                "ServerReloadRequest"})
