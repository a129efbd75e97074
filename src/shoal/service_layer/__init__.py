"""Transport-neutral naming use cases: every read and write both transports offer.

The gRPC SDK handlers and the HTTP Open API only parse their wire format into these calls
and shape the answers. Instance and service writes go through the two façades
(:mod:`.instances`, :mod:`.services`), the only place that chooses between the AP path and the
CP path on ``ephemeral``; validation (one rule set, :mod:`.validation`), each concern of the
use cases (see :mod:`.naming`) and the read results (:mod:`.views`) live here so the two
transports cannot drift.
"""

from shoal.service_layer.ip_port import BEAT_OK, BEAT_RESOURCE_NOT_FOUND
from shoal.service_layer.naming import NamingService
from shoal.service_layer.validation import (
    MAX_PORT,
    MAX_WEIGHT,
    MIN_PORT,
    MIN_WEIGHT,
    InstanceValidator,
    check_port,
    check_weight,
    parse_metadata,
)
from shoal.service_layer.views import ClientDetail, OperatorMetrics, ServiceDetail, ServiceList

__all__ = [
    "BEAT_OK", "BEAT_RESOURCE_NOT_FOUND", "MAX_PORT", "MAX_WEIGHT", "MIN_PORT", "MIN_WEIGHT",
    "ClientDetail", "InstanceValidator", "NamingService", "OperatorMetrics",
    "ServiceDetail", "ServiceList", "check_port", "check_weight", "parse_metadata",
]
