"""Client sync batches (bytes in, bytes out): the compiled kernel, or its pure-Python twin.

See :mod:`shoal.kernels.syncser_py` for the specification and the wire format. Both raise the
same :class:`SyncDecodeError` class, defined in the twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.kernels import load
from shoal.kernels.syncser_py import (
    CLIENT_ID,
    CLIENT_OP,
    CLIENT_REVISION,
    CLIENT_SERVICES,
    FORMAT_VERSION,
    INSTANCE_CLUSTER,
    INSTANCE_ENABLED,
    INSTANCE_HEALTHY,
    INSTANCE_ID,
    INSTANCE_IP,
    INSTANCE_LAST_BEAT,
    INSTANCE_METADATA,
    INSTANCE_PORT,
    INSTANCE_WEIGHT,
    MAGIC,
    SERVICE_GROUP,
    SERVICE_INSTANCES,
    SERVICE_IS_BATCH,
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    ClientRecord,
    InstanceRecord,
    ServiceTuple,
    SyncDecodeError,
)

__all__ = [
    "CLIENT_ID",
    "CLIENT_OP",
    "CLIENT_REVISION",
    "CLIENT_SERVICES",
    "FORMAT_VERSION",
    "INSTANCE_CLUSTER",
    "INSTANCE_ENABLED",
    "INSTANCE_HEALTHY",
    "INSTANCE_ID",
    "INSTANCE_IP",
    "INSTANCE_LAST_BEAT",
    "INSTANCE_METADATA",
    "INSTANCE_PORT",
    "INSTANCE_WEIGHT",
    "MAGIC",
    "SERVICE_GROUP",
    "SERVICE_INSTANCES",
    "SERVICE_IS_BATCH",
    "SERVICE_NAME",
    "SERVICE_NAMESPACE",
    "ClientRecord",
    "InstanceRecord",
    "ServiceTuple",
    "SyncDecodeError",
    "decode_batch",
    "encode_batch",
]

if TYPE_CHECKING:
    from shoal.kernels.syncser_py import decode_batch, encode_batch
else:
    _impl = load("syncser")
    encode_batch = _impl.encode_batch
    decode_batch = _impl.decode_batch
