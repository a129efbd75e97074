"""What makes a process a worker of its node: tied to its supervisor, and its own per-process settings.

A worker serves the node's public ports beside its siblings, so whatever one process owns alone
differs per worker: the files it writes besides the shared CP store (export scratch, periodic
exports, its log and access-log files) go to a file or directory of its own, and its snowflake
worker id is the node's plus its index, so two workers never mint the same instance id.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
from pathlib import Path

from shoal.config import Config
from shoal.workers.placement import WorkerPlacement

#: Linux prctl option: the signal a process gets when its parent (thread) dies.
PR_SET_PDEATHSIG = 1
#: Exit code of a worker whose supervisor is gone before it could tie itself to it.
ORPHANED_EXIT = 70


def die_with_supervisor(placement: WorkerPlacement) -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG), and exit at once when the
    parent already is not the supervisor that started it (it died before the prctl took hold):
    a ``kill -9`` of the supervisor leaves no worker holding the node's ports."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if placement.supervisor_pid and os.getppid() != placement.supervisor_pid:
        sys.exit(ORPHANED_EXIT)


def worker_dir(config: Config, placement: WorkerPlacement) -> Path:
    """This worker's own directory under the data dir (scratch files, its default access log)."""
    return Path(config.data_dir) / "workers" / str(placement.index)


def _own_file(path: str, placement: WorkerPlacement) -> str:
    """``shoal.log`` → ``shoal.worker1.log``: one file per worker next to the one named."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.worker{placement.index}{p.suffix}"))


def worker_config(config: Config, placement: WorkerPlacement) -> Config:
    """The node's settings as this worker runs them (see the module doc)."""
    own = worker_dir(config, placement)
    changes: dict[str, object] = {
        "snowflake_worker_id": (_base_worker_id(config) + placement.index) % 1024,
        "access_log_file": (config.access_log_file if config.access_log_file == "-"
                            else _own_file(config.access_log_file, placement) if config.access_log_file
                            else str(own / "logs" / "access_log.log")),
    }
    if config.log_file:
        changes["log_file"] = _own_file(config.log_file, placement)
    if config.export_dir:
        changes["export_dir"] = str(Path(config.export_dir) / f"worker-{placement.index}")
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def _base_worker_id(config: Config) -> int:
    if config.snowflake_worker_id >= 0:
        return int(config.snowflake_worker_id)
    from shoal.service_layer.instance_ids import local_worker_id

    return local_worker_id()


def worker_ip(config: Config) -> str:
    """The ip the workers of a standalone node reach each other on: the bound address, loopback
    when it is a wildcard."""
    host = config.self_address or config.host
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "localhost") else host
