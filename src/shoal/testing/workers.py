"""Looking inside a multi-worker node (``shoal server --workers N``): what each worker holds.

The node's public ports spread connections over the workers; each worker also answers on its
private port (``ServerProcess.worker_url``), which is how a test asks one given worker.
"""

from __future__ import annotations

import json

from shoal.testing.http import call
from shoal.testing.procs import ServerProcess

LOADER_CURRENT = "/nacos/v2/core/loader/current"


def worker_listed_ips(node: ServerProcess, index: int, service: str) -> set[str]:
    """The IPs worker ``index`` lists for ``service`` (empty when it answers an error or not at all)."""
    try:
        status, text = call("GET", node.worker_url(index, "/nacos/v1/ns/instance/list"), {"serviceName": service},
                            timeout=2.0, context=node.https)
    except OSError:
        return set()
    return {h["ip"] for h in json.loads(text)["hosts"]} if status == 200 else set()


def worker_connections(node: ServerProcess, index: int) -> set[str]:
    """The ids of the SDK connections worker ``index`` holds (the loader API's ``current``)."""
    status, text = call("GET", node.worker_url(index, LOADER_CURRENT), timeout=2.0, context=node.https)
    assert status == 200, text
    return set(json.loads(text))


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


__all__ = ["LOADER_CURRENT", "pid_alive", "rss_bytes", "worker_connections", "worker_listed_ips"]
