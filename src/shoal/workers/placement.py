"""Where a worker sits in its node: the contract between the supervisor and its workers.

A node run with ``--workers N`` is one supervisor and N worker processes. Every worker serves
the node's public ports (HTTP on ``port``, the SDK port ``port + 1000`` and the cluster port
``port + 1001``, each bound with ``SO_REUSEPORT``) and, besides, a *private* main port of its
own: its HTTP on ``private_port`` and its cluster port on ``private_port + 1001``. A worker is a
Distro member named ``ip:private_port`` (so the Distro protocol, its transport and the HTTP
forwarder see one more member and nothing new); the node, to the outside, stays ``ip:port``.

The supervisor picks the private ports once (free pairs), so a restarted worker comes back under
the same name, and hands them to each worker in the environment:

``SHOAL_WORKER_INDEX``   this worker, 0-based
``SHOAL_WORKER_PORTS``   every worker's private port, comma-separated, in index order
``SHOAL_SUPERVISOR_PID`` the supervisor (a worker exits when it is gone)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.errors import ConfigError

INDEX_ENV = "SHOAL_WORKER_INDEX"
PORTS_ENV = "SHOAL_WORKER_PORTS"
SUPERVISOR_ENV = "SHOAL_SUPERVISOR_PID"


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    """One worker's place in its node (see the module doc)."""

    index: int
    ports: tuple[int, ...]
    supervisor_pid: int = 0

    def __post_init__(self) -> None:
        if not self.ports or not 0 <= self.index < len(self.ports):
            raise ConfigError(f"worker index {self.index} outside the {len(self.ports)} worker ports")
        if any(not 0 < p < 65536 for p in self.ports) or len(set(self.ports)) != len(self.ports):
            raise ConfigError(f"worker ports must be distinct ports, got {self.ports}")

    @property
    def count(self) -> int:
        return len(self.ports)

    @property
    def private_port(self) -> int:
        """This worker's private main port (its member name's port)."""
        return self.ports[self.index]

    def siblings(self) -> tuple[int, ...]:
        """The other workers' private ports."""
        return tuple(p for i, p in enumerate(self.ports) if i != self.index)

    def to_env(self) -> dict[str, str]:
        return {INDEX_ENV: str(self.index), PORTS_ENV: ",".join(map(str, self.ports)),
                SUPERVISOR_ENV: str(self.supervisor_pid)}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerPlacement | None:
        """The placement the supervisor gave this process; None when it is not a worker."""
        env = os.environ if env is None else env
        index = env.get(INDEX_ENV, "").strip()
        if not index:
            return None
        try:
            ports = tuple(int(p) for p in env.get(PORTS_ENV, "").split(",") if p.strip())
            return cls(int(index), ports, int(env.get(SUPERVISOR_ENV, "0") or 0))
        except ValueError:
            raise ConfigError(f"bad worker placement in the environment: {INDEX_ENV}={index!r}, "
                              f"{PORTS_ENV}={env.get(PORTS_ENV)!r}") from None
