"""Looking inside a multi-worker node (``shoal server --workers N``): what each worker holds.

The node's public ports spread connections over the workers; each worker also answers on its
private port (``ServerProcess.worker_url``), which is how a test asks one given worker.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shoal.testing.http import call
from shoal.testing.procs import ServerProcess
from shoal.testing.rawclient import RawClient
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


def worker_holding(node: ServerProcess, connection_id: str) -> int | None:
    """Which worker holds the SDK connection ``connection_id`` (None: none of them)."""
    return next((i for i in range(node.workers) if connection_id in worker_connections(node, i)), None)


async def connections_on_each_worker(node: ServerProcess, per_worker: int, attempts: int = 200) -> list[RawClient]:
    """Raw SDK connections to the node's public SDK port, ``per_worker`` held by each worker. The
    kernel picks the worker: a connection landing on one that holds its share already is closed
    and another is opened (at most ``attempts`` in all). The caller closes the clients."""
    held: dict[int, list[RawClient]] = {i: [] for i in range(node.workers)}
    for _ in range(attempts):
        if all(len(c) >= per_worker for c in held.values()):
            break
        client = RawClient(node.grpc_port)
        worker = await asyncio.to_thread(worker_holding, node, await client.connect())
        if worker is not None and len(held[worker]) < per_worker:
            held[worker].append(client)
        else:
            await client.close()
    clients = [c for group in held.values() for c in group]
    if any(len(c) < per_worker for c in held.values()):
        for client in clients:
            await client.close()
        raise AssertionError(f"the kernel did not give each worker {per_worker} connections in {attempts} tries")
    return clients


def worker_client_ids(node: ServerProcess, index: int) -> set[str]:
    """Every naming client worker ``index`` holds, its own and those replicated to it (``/v2/ns/client/list``)."""
    status, text = call("GET", node.worker_url(index, CLIENT_LIST), timeout=2.0, context=node.https)
    assert status == 200, text
    return set(json.loads(text)["data"])


def connection_holders(node: ServerProcess) -> dict[str, int]:
    """Which worker holds each SDK connection of ``node``: connection id → worker index."""
    return {conn: i for i in range(node.workers) for conn in worker_connections(node, i)}


def sdk_connection_id(client: Any) -> str | None:
    """The id of the connection a nacos-sdk-python 3.x ``NacosNamingService`` holds now (None
    while it has none): the id the server gave it, which :func:`worker_connections` lists."""
    rpc = getattr(client.grpc_client_proxy, "rpc_client", None)
    connection = getattr(rpc, "current_connection", None)
    return None if connection is None else str(connection.get_connection_id())


def worker_owner(node: ServerProcess, tag: str, up: Iterable[int] | None = None) -> int:
    """The worker of ``node`` responsible for the ``ip:port`` ``tag`` while the workers ``up``
    (default all) are healthy: each worker is the Distro member ``host:private_port``, and the
    mapper picks ``distro_hash(tag) % n`` over their sorted addresses (as
    :func:`shoal.testing.nodes.owner_index` does for nodes)."""
    from shoal.kernels import ownership

    ports = node.worker_ports()
    indices = list(range(len(ports))) if up is None else list(up)
    healthy = sorted(f"{node.host}:{ports[i]}" for i in indices)
    chosen = healthy[ownership.distro_hash(tag) % len(healthy)]
    return next(i for i in indices if f"{node.host}:{ports[i]}" == chosen)


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


__all__ = ["CLIENT_LIST", "LOADER_CURRENT", "SERVER_LIBRARIES", "call_answered_by", "connection_holders",
           "connections_on_each_worker", "every_worker", "listed_by_every_worker", "mapped_libraries", "pid_alive",
           "rss_bytes", "sdk_connection_id", "server_libraries", "worker_client_ids", "worker_connections",
           "worker_holding", "worker_listed_ips", "worker_owner"]


#: Where the compiled modules of the server live: its transports (grpc, aiohttp and its helpers,
#: protobuf), the Arrow export, the auth store's bcrypt, the compiled kernels. A node's supervisor
#: only starts, restarts and stops its workers, so none of them belongs in it.
SERVER_LIBRARIES = ("/grpc/", "/aiohttp/", "/multidict/", "/yarl/", "/frozenlist/", "/google/", "/pyarrow/",
                    "/bcrypt/", "/shoal/_ext/")


def mapped_libraries(pid: int) -> set[str]:
    """The shared objects (``.so`` files) mapped into process ``pid`` (/proc/<pid>/maps)."""
    text = Path(f"/proc/{pid}/maps").read_text()
    return {line.split(maxsplit=5)[5] for line in text.splitlines()
            if line.count(" ") >= 5 and ".so" in line.rsplit("/", 1)[-1]}


def server_libraries(pid: int) -> list[str]:
    """The server's compiled modules (:data:`SERVER_LIBRARIES`) loaded by process ``pid``."""
    return sorted(path for path in mapped_libraries(pid) if any(part in path for part in SERVER_LIBRARIES))
