"""Which gRPC server transport serves the node's gRPC ports (``shoal.remote.transport``).

A choice of the whole node, read by the gRPC transport that builds the servers and by the HTTP
transport that reports it (node state, console), so it lives beside both rather than in either:
the HTTP transport never imports the gRPC one.

* ``native``: HTTP/2 by libnghttp2 in the ``h2grpc`` Cython extension;
* ``grpcio``: grpc.aio.

The default is native when the extension is built (and ``SHOAL_NO_EXTENSIONS`` is unset).
"""

from __future__ import annotations

import importlib
import os

from shoal.config import Config
from shoal.errors import ConfigError

NATIVE = "native"
GRPCIO = "grpcio"


def native_available() -> bool:
    """True when the h2grpc extension is built and extensions are not switched off."""
    if os.environ.get("SHOAL_NO_EXTENSIONS", "") not in ("", "0"):
        return False
    try:
        importlib.import_module("shoal._ext.h2grpc")
    except ImportError:
        return False
    return True


def transport_name(config: Config) -> str:
    """The transport the gRPC ports run on; ConfigError for a bad or unavailable choice."""
    wanted = config.remote_transport or (NATIVE if native_available() else GRPCIO)
    if wanted not in (NATIVE, GRPCIO):
        raise ConfigError(f"shoal.remote.transport must be {NATIVE} or {GRPCIO}, not {wanted!r}")
    if wanted == NATIVE and not native_available():
        raise ConfigError("shoal.remote.transport=native needs the h2grpc extension (built with libnghttp2; "
                          "not available with SHOAL_NO_EXTENSIONS=1)")
    for name in ("max_inbound_message_size", "cluster_max_inbound_message_size", "outbound_queue_bytes",
                 "write_stall_timeout_ms"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name.replace('_', '-')} must be positive, got {getattr(config, name)}")
    return wanted
