"""Transport-neutral naming use cases: every read and write both transports offer.

The gRPC SDK handlers and the HTTP Open API only parse their wire format into these calls
and shape the answers; validation (one rule set, :mod:`.validation`), the use cases
(:mod:`.naming`) and the read results (:mod:`.views`) live here so the two cannot drift.
"""

from shoal.service_layer.naming import BEAT_OK, BEAT_RESOURCE_NOT_FOUND, NamingService
from shoal.service_layer.validation import (
    MAX_PORT,
    MAX_WEIGHT,
    MIN_PORT,
    MIN_WEIGHT,
    PERSISTENT_UNSUPPORTED,
    InstanceValidator,
    check_port,
    check_weight,
    parse_metadata,
)
from shoal.service_layer.views import ClientDetail, OperatorMetrics, ServiceDetail, ServiceList

__all__ = [
    "BEAT_OK", "BEAT_RESOURCE_NOT_FOUND", "MAX_PORT", "MAX_WEIGHT", "MIN_PORT", "MIN_WEIGHT",
    "PERSISTENT_UNSUPPORTED", "ClientDetail", "InstanceValidator", "NamingService", "OperatorMetrics",
    "ServiceDetail", "ServiceList", "check_port", "check_weight", "parse_metadata",
]
