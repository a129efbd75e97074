"""The shape of a client sync record and the batch header: shared by both syncser implementations
and by the Distro code that builds and reads records (:mod:`shoal.distro.records`).

See :mod:`shoal.kernels.syncser_py` for the wire format.
"""

from __future__ import annotations

from typing import Final

# The records are plain tuples (the compiled kernel builds and reads them fastest that way).
# Unpack them, or index them with the named positions below — never with bare numbers.

#: (ip, port, weight, healthy, enabled, cluster, instance_id, metadata, last_beat_ms)
InstanceRecord = tuple[str, int, float, bool, bool, str, str, dict[str, str], int]
INSTANCE_IP: Final = 0
INSTANCE_PORT: Final = 1
INSTANCE_WEIGHT: Final = 2
INSTANCE_HEALTHY: Final = 3
INSTANCE_ENABLED: Final = 4
INSTANCE_CLUSTER: Final = 5
INSTANCE_ID: Final = 6
INSTANCE_METADATA: Final = 7
INSTANCE_LAST_BEAT: Final = 8
#: (namespace, group, service, is_batch, instances)
ServiceTuple = tuple[str, str, str, bool, list[InstanceRecord]]
SERVICE_NAMESPACE: Final = 0
SERVICE_GROUP: Final = 1
SERVICE_NAME: Final = 2
SERVICE_IS_BATCH: Final = 3
SERVICE_INSTANCES: Final = 4
#: (op, client_id, revision, services)
ClientRecord = tuple[int, str, int, list[ServiceTuple]]
CLIENT_OP: Final = 0
CLIENT_ID: Final = 1
CLIENT_REVISION: Final = 2
CLIENT_SERVICES: Final = 3
#: (op, client_id, revision, services each as its encoded bytes): ``split_batch``'s records
SplitRecord = tuple[int, str, int, list[bytes]]

MAGIC = b"SHSY"
FORMAT_VERSION = 1


class SyncDecodeError(ValueError):
    """The bytes are not a valid sync batch (both implementations raise this very class)."""
