"""Which gRPC transport serves the node's gRPC ports (``shoal.remote.transport``), and which one
calls its peers' cluster ports (``shoal.cluster.client.transport``).

A choice of the whole node, read by the gRPC transport that builds the servers and by the HTTP
transport that reports it (node state, console), so it lives beside both rather than in either:
the HTTP transport never imports the gRPC one.

* ``native``: HTTP/2 by libnghttp2 in the ``h2grpc`` Cython extension;
* ``grpcio``: grpc.aio.

The default is native when the extension is built (and ``SHOAL_NO_EXTENSIONS`` is unset). The
peer client has the same two: ``native``, a libnghttp2 client session in the ``h2client``
extension (``transport/grpc/native_peer_client.py``), or ``grpcio``
(``transport/grpc/peer_client.py``); :func:`make_peer_transport` builds the chosen one.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from shoal.config import Config
from shoal.errors import ConfigError

if TYPE_CHECKING:
    from shoal.distro.transport import PeerTransport
    from shoal.tls import PortTls

NATIVE = "native"
GRPCIO = "grpcio"

log = logging.getLogger(__name__)


_explained = False  # the fallback to grpc.aio for an unusable extension was logged


def native_unavailable_reason() -> str | None:
    """Why the native transport cannot run here (None when it can): extensions switched off,
    the extension not built, or its import refused (e.g. an untested libnghttp2)."""
    if os.environ.get("SHOAL_NO_EXTENSIONS", "") not in ("", "0"):
        return "SHOAL_NO_EXTENSIONS is set"
    try:
        importlib.import_module("shoal._ext.h2grpc")
    except ImportError as exc:
        return str(exc) or "the h2grpc extension is not built"
    return None


def native_available() -> bool:
    """True when the h2grpc extension is built, imports, and extensions are not switched off."""
    return native_unavailable_reason() is None


def transport_name(config: Config) -> str:
    """The transport the gRPC ports run on; ConfigError for a bad or unavailable choice."""
    global _explained
    reason = native_unavailable_reason()
    wanted = config.remote_transport or (NATIVE if reason is None else GRPCIO)
    if wanted not in (NATIVE, GRPCIO):
        raise ConfigError(f"shoal.remote.transport must be {NATIVE} or {GRPCIO}, not {wanted!r}")
    if wanted == NATIVE and reason is not None:
        raise ConfigError("shoal.remote.transport=native needs the h2grpc extension (built with libnghttp2; "
                          f"not available with SHOAL_NO_EXTENSIONS=1): {reason}")
    if not config.remote_transport and reason is not None and not _explained and \
            reason != "SHOAL_NO_EXTENSIONS is set":
        _explained = True  # an unusable build is worth one line; extensions switched off on purpose are not
        log.warning("the gRPC ports run on grpc.aio: the native transport is unavailable (%s)", reason)
    for name in ("max_inbound_message_size", "cluster_max_inbound_message_size", "outbound_queue_bytes",
                 "write_stall_timeout_ms"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(config, name)}")
    return wanted


def native_client_unavailable_reason() -> str | None:
    """Why the native peer client cannot run here (None when it can): what keeps the native server
    transport from running (the same library, checked by h2grpc at import), or h2client not built."""
    reason = native_unavailable_reason()
    if reason is not None:
        return reason
    try:
        importlib.import_module("shoal._ext.h2client")
    except ImportError as exc:
        return str(exc) or "the h2client extension is not built"
    return None


def peer_client_name(config: Config) -> str:
    """The transport calls to peers go over; ConfigError for an unavailable choice."""
    reason = native_client_unavailable_reason()
    wanted = config.cluster_client_transport or (NATIVE if reason is None else GRPCIO)
    if wanted not in (NATIVE, GRPCIO):
        raise ConfigError(f"shoal.cluster.client.transport must be {NATIVE} or {GRPCIO}, not {wanted!r}")
    if wanted == NATIVE and reason is not None:
        raise ConfigError("shoal.cluster.client.transport=native needs the h2client extension (built with "
                          f"libnghttp2; not available with SHOAL_NO_EXTENSIONS=1): {reason}")
    return wanted


def make_peer_transport(config: Config, self_address: str, identity: tuple[str, str] | None,
                        tls: PortTls | None, introduction: Mapping[str, str] | None = None) -> PeerTransport:
    """The configured client for Distro calls to peers (``shoal.cluster.client.transport``): calls
    carry ``identity`` (the cluster identity header, if any) and ``introduction`` (a worker's node
    and workers) and go over TLS with ``tls``."""
    if peer_client_name(config) == NATIVE:
        from shoal.transport.grpc.native_peer_client import NativePeerTransport
        return NativePeerTransport(self_address, config.cluster_port_offset, identity, tls=tls,
                                   introduction=introduction)
    from shoal.transport.grpc.peer_client import GrpcPeerTransport
    return GrpcPeerTransport(self_address, config.cluster_port_offset, identity, tls=tls, introduction=introduction)
