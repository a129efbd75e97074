"""Looking inside a multi-worker node (``shoal server --workers N``): what each worker holds.

The node's public ports spread connections over the workers; each worker also answers on its
private port (``ServerProcess.worker_url``), which is how a test asks one given worker.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping

from shoal.testing.http import call
from shoal.testing.procs import ServerProcess
from shoal.transport.sharing import WORKER_HEADER

LOADER_CURRENT = "/nacos/v2/core/loader/current"
CLIENT_LIST = "/nacos/v2/ns/client/list"


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


def worker_client_ids(node: ServerProcess, index: int) -> set[str]:
    """Every naming client worker ``index`` holds, its own and those replicated to it (``/v2/ns/client/list``)."""
    status, text = call("GET", node.worker_url(index, CLIENT_LIST), timeout=2.0, context=node.https)
    assert status == 200, text
    return set(json.loads(text)["data"])


def worker_holding(node: ServerProcess, connection_id: str) -> int | None:
    """The index of the worker holding the SDK connection ``connection_id`` (None: no worker lists it)."""
    return next((i for i in range(node.workers) if connection_id in worker_connections(node, i)), None)


def call_answered_by(method: str, url: str, params: Mapping[str, object] | None = None, *, timeout: float = 10.0,
                     context: ssl.SSLContext | None = None) -> tuple[int, str, str]:
    """One request on a connection of its own (as the 1.x HTTP SDK makes every call): (status, body,
    the worker that answered, from the ``Shoal-Worker`` header; "" when there is none)."""
    if params:
        url += "?" + urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    body = b"" if method in ("POST", "PUT", "PATCH") else None
    request = urllib.request.Request(url, data=body, method=method, headers={"Connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return int(resp.status), resp.read().decode(errors="replace"), resp.headers.get(WORKER_HEADER, "")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace"), exc.headers.get(WORKER_HEADER, "")


def every_worker(nodes: Iterable[ServerProcess]) -> list[tuple[ServerProcess, int]]:
    """(node, worker index) for every worker of every node in ``nodes``."""
    return [(node, i) for node in nodes for i in range(node.workers)]


def listed_by_every_worker(nodes: Iterable[ServerProcess], service: str, ips: set[str]) -> bool:
    """Whether every worker of every node in ``nodes`` lists exactly ``ips`` for ``service``."""
    return all(worker_listed_ips(node, i, service) == ips for node, i in every_worker(nodes))


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


__all__ = ["CLIENT_LIST", "LOADER_CURRENT", "call_answered_by", "every_worker",
           "listed_by_every_worker", "pid_alive", "rss_bytes", "worker_client_ids", "worker_connections",
           "worker_holding", "worker_listed_ips"]
