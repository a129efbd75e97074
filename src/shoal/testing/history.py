"""Instance-history logs written by a node's own history code, for the jobs that read them.

:func:`write_node_log` runs a registry on a manual clock with a :class:`~shoal.export.history.HistoryLog`
attached, so the files are exactly what a node writes: ``10.0.0.9:8080`` of ``orders`` registered,
then deregistered (or expired for want of beats), next to a bystander ``10.0.0.7:8080``.
"""

from __future__ import annotations

from pathlib import Path

from shoal.export.history import HistoryLog
from shoal.model.events import no_beat_for
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing.model import make_registry

#: The service the written logs are about.
HISTORY_SERVICE = ServiceKey("public", "DEFAULT_GROUP", "orders")


async def write_node_log(directory: Path, node: str, start_ms: int, expire: bool) -> None:
    """One node's log under ``directory`` (see the module doc), starting at wall time ``start_ms``."""
    reg = make_registry()
    reg.clock.advance(start_ms - reg.clock.now_ms())
    history = HistoryLog(reg.bus, reg.clock, reg.clients, node, directory, 1_000_000, 100_000, 1000)
    reg.naming.ip_port.register(HISTORY_SERVICE, InstanceInfo("10.0.0.9", 8080))
    reg.naming.ip_port.register(HISTORY_SERVICE, InstanceInfo("10.0.0.7", 8080))
    reg.clock.advance(5_000)
    if expire:
        client = reg.clients.get("10.0.0.9:8080#true")
        assert client is not None
        reg.naming.beats.expire(client, HISTORY_SERVICE, no_beat_for(30_000))
    else:
        reg.naming.ip_port.deregister(HISTORY_SERVICE, "10.0.0.9", 8080)
    await history.close()
