"""How a worker process of a multi-worker node listens (issue 21; see shoal/workers/placement.py).

Every worker binds the node's public ports (HTTP, SDK, cluster) with ``SO_REUSEPORT``, so the
kernel spreads incoming connections over the workers, and, alone, its private HTTP and cluster
ports, where its siblings reach it by name. A single-process node has no :class:`PortSharing`:
its ports are bound exclusively and a used port is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The HTTP header every answer of a worker carries: which worker answered (its index).
WORKER_HEADER = "Shoal-Worker"


@dataclass(frozen=True, slots=True)
class PortSharing:
    """One worker's listening plan: its index and its private ports."""

    worker: int
    http_port: int
    cluster_port: int
    workers: int = 1  #: the node's worker count
