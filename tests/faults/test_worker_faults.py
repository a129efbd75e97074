"""Issue 21 ("Faults"): the faults of a multi-worker node, under load.

One node of two workers (``--workers 2``) carries, all on its public ports: 20 real
nacos-sdk-python 3.x gRPC clients with an instance each (connections on both workers, asserted),
50 ip:port instances beating every 5 s on keep-alive connections, and 8 closed-loop HTTP writers
at 10 writes a second each (register then deregister); every worker's list of the live services
is polled every 0.5 s on its private port (:class:`shoal.testing.nodeload.NodeLoad`). Then:

* ``kill -9`` of one worker: it is restarted; no HTTP instance is ever missing nor unhealthy on a
  worker that answers; the SDK clients the dead worker held are on a live worker again and their
  instances listed by every worker within :data:`REDO_BOUND_S`; the only writes that fail are
  the ones on the dead worker's connections, at most one per writer it held. The same on node B
  of three nodes of two workers each, with every worker of A and C polled as well. (The dead
  worker's SDK instances are not listed between the kill and the SDK's redo, ~26 s here: the
  restarted worker deletes its previous run's connection clients from every peer at once, the
  clients reconnected within milliseconds, and the SDK registers again only on its redo timer.)
* SIGSTOP of one worker for :data:`PAUSE_S`: writes on the other worker's connections (those
  whose ip:port the stopped worker is responsible for included) all succeed, p99 within the
  hung-peer bound of test_hung_peer.py; what the connections the kernel gives the stopped
  worker do is measured and printed (they hang: SO_REUSEPORT keeps handing it connections);
  after SIGCONT the workers agree within 10 s, no ghost connection left;
* SIGTERM: the node exits 0 within 5 s, every worker gone, every port free;
* ``kill -9`` of the supervisor: every worker gone, every port free, and the clients see their
  connections drop (no request waits for its timeout).

Run with ``-s`` for the figures (``worker fault ...`` lines).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, CpCluster, ServerProcess, start_server, wait_until
from shoal.testing.faults import tracebacks
from shoal.testing.nodeload import Listings, NodeLoad, loadavg, p99
from shoal.testing.workers import (
    connection_holders,
    every_worker,
    pid_alive,
    sdk_connection_id,
    worker_client_ids,
    worker_connections,
    worker_listed_ips,
    worker_owner,
)

pytestmark = pytest.mark.faults

#: nacos-sdk-python 3.x (3.2.0) redoes a lost registration only from its redo task, which wakes every 30 s
#: (``AbstractRedoService._execute_redo_task``: ``wait_for(queue.get(), timeout=30)``, nothing ever
#: queued), whatever the reconnection; the broken stream is seen at once (the kernel resets the dead
#: worker's connections) and the client reconnects within a second (``RpcClient.reconnect``: 0.1 s
#: between tries). So: 30 s of timer, 5 s for the reconnection and its health check, 5 s for the
#: registration to reach every worker (the sync delay, a verify round, the restarted worker's snapshot).
REDO_BOUND_S = 40.0
#: How long a worker stays SIGSTOPped (the point of the test: a window, not a sleep).
PAUSE_S = 15.0
#: The hung-peer bound (tests/faults/test_hung_peer.py): write p99 while a member hangs.
WRITE_P99_S = 0.2
#: A connection client's id (``<ms>_<ip>_<port>``), as opposed to an ip:port client's (``ip:port#true``).
CONNECTION_ID = re.compile(r"^\d+_[0-9.]+_\d+$")
VICTIM, SURVIVOR = 0, 1


@pytest.fixture
async def loaded(tmp_path: Path) -> AsyncIterator[tuple[ServerProcess, NodeLoad]]:
    """A node of two workers under :class:`NodeLoad`, the SDK connections on both workers; at
    teardown the load stops and every process of the node is continued and killed."""
    node = await asyncio.to_thread(start_server, tmp_path, auth=OPEN, workers=2)
    pids = node.worker_pids()
    load = NodeLoad(node, tmp_path)
    try:
        await running(load)
        yield node, load
    finally:
        await load.stop()
        for pid in {*pids, *node.worker_pids()}:
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGCONT)
        node.kill()
        for pid in {*pids, *node.worker_pids()}:
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


async def running(load: NodeLoad) -> None:
    """Start ``load`` and wait until it runs: the SDK connections on both workers, every writer writing."""
    await load.start()
    held = await holders(load.node, load)
    assert set(held) >= {VICTIM, SURVIVOR}, f"the kernel gave every SDK connection one worker: {held}"
    await wait_until(lambda: all(len([a for ww, _, a in load.writers.answers if ww == w]) >= 4
                                 for w in range(load.writers.count)), 20, what="every writer to write")


async def holders(node: ServerProcess, load: NodeLoad) -> list[int | None]:
    """Which worker holds each SDK client's connection now (None: none, or not known to any worker)."""
    held = await asyncio.to_thread(connection_holders, node)
    return [held.get(cid) if cid else None for cid in (sdk_connection_id(c) for c in load.sdk.clients)]


def node_ports(node: ServerProcess) -> list[int]:
    """Every port the node listens on: the shared HTTP, SDK and cluster ports, each worker's private pair."""
    return [node.port, node.grpc_port, node.cluster_port,
            *(p for port in node.worker_ports() for p in (port, port + 1001))]


def bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


async def listed_by_every_worker(nodes: list[ServerProcess], service: str, ips: set[str]) -> bool:
    """Whether every worker of every node of ``nodes`` lists at least ``ips`` for ``service``."""
    seen = await asyncio.gather(*(asyncio.to_thread(worker_listed_ips, node, w, service)
                                  for node, w in every_worker(nodes)))
    return all(ips <= listed for listed in seen)


def check_live_listings(listings: Listings, load: NodeLoad, since: float, sdk_kept: set[str],
                        fault: int | None) -> list[str]:
    """What ``listings``' polls since ``since`` show wrong: a worker other than ``fault`` not
    answering; on a worker that answered, an HTTP instance of ``load`` missing or unhealthy, or
    an SDK instance of ``sdk_kept`` (clients whose connection the fault left alone) missing."""
    wrong = []
    where = f"{listings.node.host}:{listings.node.port}"
    for poll in listings.polls:
        at = f"{poll.at - since:.1f} s: {where} worker {poll.worker}"
        if poll.at < since:
            continue
        if poll.hosts is None:
            if poll.worker != fault:
                wrong.append(f"{at} did not answer for {poll.service}")
        elif poll.service == load.beaters.service:
            missing = load.beaters.ips - set(poll.hosts)
            unhealthy = {ip for ip in load.beaters.ips & set(poll.hosts) if not poll.hosts[ip]}
            if missing or unhealthy:
                wrong.append(f"{at} misses {len(missing)} HTTP instances, {len(unhealthy)} unhealthy: "
                             f"{sorted(missing | unhealthy)[:5]}")
        elif poll.service == load.sdk.service and sdk_kept - set(poll.hosts):
            wrong.append(f"{at} misses SDK instances {sorted(sdk_kept - set(poll.hosts))[:5]}")
    return wrong


async def warm(load: NodeLoad, seconds: float = 2.0) -> None:
    """Wait until the writers have written for about ``seconds`` more (the load runs, it is not starting)."""
    target = len(load.writers.answers) + int(load.writers.count * load.writers.rate * 2 * seconds * 0.8)
    await wait_until(lambda: len(load.writers.answers) >= target, seconds * 5, what="the writes to flow")


# --- kill -9 of one worker --------------------------------------------------------------------
async def kill_a_worker(load: NodeLoad, nodes: list[ServerProcess], others: list[Listings]) -> None:
    """The kill -9 scenario on ``load``'s node, while ``others`` poll the other nodes of ``nodes``
    (a cluster's) too; asserts what the module doc says."""
    node = load.node
    everything = {load.sdk.service: set(load.sdk.ips), load.beaters.service: load.beaters.ips}
    for service, ips in everything.items():  # replicated everywhere (a sibling sees a write ~10 ms later)
        await wait_until(lambda s=service, i=ips: listed_by_every_worker(nodes, s, i), 10,  # type: ignore[misc]
                         what=f"every worker to list every instance of {service} before the kill")
    settled = time.monotonic()
    await warm(load)
    held = await holders(node, load)
    on_victim = {n for n, w in enumerate(held) if w == VICTIM}
    sdk_kept = {load.sdk.ip(n) for n, w in enumerate(held) if w == SURVIVOR}
    writers_on_victim = {w for w, by in load.writers.held_by().items() if by == VICTIM}
    ports = node.worker_ports()
    old = node.worker_pids()[VICTIM]
    load.listings.watching.discard(VICTIM)
    killed_at = time.monotonic()
    os.kill(old, signal.SIGKILL)
    new = await asyncio.to_thread(node.wait_worker_restarted, VICTIM, old, 30)
    restarted_s = time.monotonic() - killed_at
    load.listings.watching.add(VICTIM)
    state = node.workers_state()
    assert new != old and node.worker_ports() == ports
    assert state is not None and state["workers"][VICTIM]["restarts"] == 1

    sdk_ips = set(load.sdk.ips)
    await wait_until(lambda: listed_by_every_worker(nodes, load.sdk.service, sdk_ips),
                     REDO_BOUND_S - (time.monotonic() - killed_at),
                     what="every SDK instance listed by every worker again (the SDK's redo)")
    back_s = time.monotonic() - killed_at
    after = await holders(node, load)
    moved = [after[n] for n in sorted(on_victim)]
    await load.stop_writes()

    assert not [a for _, _, a in load.writes(until=killed_at) if not a.ok], "writes failed before the kill"
    failed = [(w, a) for w, _, a in load.writes(since=killed_at) if not a.ok]
    logs = sum(tracebacks(n.log()) for n in nodes)
    gaps = sdk_gap_seconds(load, sorted(load.sdk.ip(n) for n in on_victim), killed_at)
    print(f"worker fault kill -9 ({len(nodes)} node(s), worker {VICTIM} of {node.addr} killed): restarted after "
          f"{restarted_s:.1f} s; "
          f"SDK clients it held {len(on_victim)}/{len(held)}, every SDK instance listed everywhere {back_s:.1f} s "
          f"after the kill (longest gap on worker {SURVIVOR}: {max(gaps, default=0):.1f} s), now held by {moved}; "
          f"{len(load.writers.answers)} writes, {len(failed)} failed after the kill "
          f"({sorted({a.error or str(a.status) for _, a in failed})}), {len(writers_on_victim)} writers on the "
          f"killed worker; beats {len(load.beaters.answers)}, {sum(not a.ok for _, a in load.beaters.answers)} "
          f"failed; tracebacks {logs}; load {loadavg()}")
    assert all(w is not None for w in moved), f"SDK clients of the dead worker not on a live worker: {moved}"
    assert all(a.held_by == VICTIM for _, a in failed), f"a write failed elsewhere: {failed}"
    assert len(failed) <= len(writers_on_victim), "more than the in-flight write of a writer failed"
    beats = [(a.held_by, a.error or a.status, round(a.took, 2)) for _, a in load.beaters.answers
             if not a.ok and a.held_by != VICTIM]
    assert not beats, f"beats failed on connections the dead worker did not hold: {beats}"
    wrong = [w for listings, fault in [(load.listings, VICTIM), *((o, None) for o in others)]
             for w in check_live_listings(listings, load, settled, sdk_kept, fault)]
    for line in wrong:
        print(f"worker fault kill -9: {line}")
    assert not wrong, wrong[:10]
    assert logs == 0


async def test_kill9_of_a_worker_under_load(loaded: tuple[ServerProcess, NodeLoad]) -> None:
    node, load = loaded
    await kill_a_worker(load, [node], [])


async def test_kill9_of_a_worker_of_a_cluster_node_under_load(tmp_path: Path) -> None:
    """The same on node B of three nodes of two workers each (CP on managed etcd); every worker
    of A and C is polled too, and must list every live instance throughout."""
    with CpCluster(tmp_path, 3, auth=OPEN, workers=2) as cluster:
        await asyncio.to_thread(cluster.start_all)
        b = cluster.node(1)
        load = NodeLoad(b, tmp_path)
        others = [Listings(cluster.node(i), (load.beaters.service, load.sdk.service)) for i in (0, 2)]
        stop = asyncio.Event()
        polling: list[asyncio.Task[None]] = []
        try:
            await running(load)  # every instance registered: from now on every worker lists them
            polling = [asyncio.create_task(o.run(stop)) for o in others]
            await kill_a_worker(load, cluster.all(), others)
        finally:
            stop.set()
            await asyncio.gather(*polling, return_exceptions=True)
            await load.stop()
            await asyncio.to_thread(cluster.kill_all)


def sdk_gap_seconds(load: NodeLoad, ips: list[str], since: float) -> list[float]:
    """For each of ``ips``, how long the survivor's polls since ``since`` did not list it."""
    polls = [p for p in load.listings.polls if p.at >= since and p.worker == SURVIVOR
             and p.service == load.sdk.service and p.hosts is not None]
    gaps = []
    for ip in ips:
        missing = [p.at for p in polls if ip not in (p.hosts or {})]
        gaps.append(max(missing) - min(missing) if missing else 0.0)
    return gaps


# --- SIGSTOP of one worker --------------------------------------------------------------------
async def test_sigstop_of_a_worker_under_load(loaded: tuple[ServerProcess, NodeLoad]) -> None:
    node, load = loaded
    await warm(load)
    held = await holders(node, load)
    writers_on = load.writers.held_by()
    frozen = node.worker_pids()[VICTIM]
    load.listings.watching.discard(VICTIM)
    stopped_at = time.monotonic()
    os.kill(frozen, signal.SIGSTOP)
    try:
        await asyncio.sleep(PAUSE_S)  # the pause is the fault: the load runs through it
        during = await asyncio.to_thread(worker_connections, node, SURVIVOR)
    finally:
        os.kill(frozen, signal.SIGCONT)
    thawed_at = time.monotonic()
    load.listings.watching.add(VICTIM)
    await load.stop_writes()
    pause = load.writes(since=stopped_at, until=thawed_at)
    on_survivor = [(tag, a) for _, tag, a in pause if a.held_by == SURVIVOR]
    owned_by_victim = [a for tag, a in on_survivor if worker_owner(node, tag) == VICTIM]
    fresh = [a for _, _, a in pause if a.held_by is None]
    failed = [a for _, _, a in pause if not a.ok]
    sdk_ids = [sdk_connection_id(c) for c in load.sdk.clients]
    agreed_s = await agree(node, load, thawed_at)
    text = node.log()
    print(f"worker fault SIGSTOP {PAUSE_S:.0f} s: {len(pause)} writes during the pause; on worker {SURVIVOR}'s "
          f"connections {len(on_survivor)}, failed {sum(not a.ok for _, a in on_survivor)}, "
          f"p99 {p99([a.took for _, a in on_survivor]) * 1000:.0f} ms, max "
          f"{max((a.took for _, a in on_survivor), default=0) * 1000:.0f} ms; of them for ip:ports the stopped "
          f"worker is responsible for {len(owned_by_victim)}, p99 {p99([a.took for a in owned_by_victim]) * 1000:.0f}"
          f" ms; writers on the stopped worker at the pause {sum(by == VICTIM for by in writers_on.values())}/"
          f"{len(writers_on)}; new connections during the pause {len(fresh)}: answered {sum(a.ok for a in fresh)}, "
          f"hung until the client's timeout (given to the stopped worker) {sum(a.error == 'timeout' for a in fresh)}"
          f"; failed writes {len(failed)} ({sorted({a.error or str(a.status) for a in failed})}); SDK clients "
          f"on the stopped worker {held.count(VICTIM)}, on worker {SURVIVOR} {held.count(SURVIVOR)} before and "
          f"{sum(cid in during for cid in sdk_ids)} at SIGCONT; agreed {agreed_s:.1f} s after SIGCONT; "
          f"tracebacks {tracebacks(text)}; load {loadavg()}")
    assert on_survivor and owned_by_victim
    assert [a for _, a in on_survivor if not a.ok] == []
    assert p99([a.took for _, a in on_survivor]) <= WRITE_P99_S
    assert all(a.held_by != SURVIVOR for a in failed)
    wrong = check_live_listings(load.listings, load, stopped_at,
                                {load.sdk.ip(n) for n, w in enumerate(held) if w == SURVIVOR}, VICTIM)
    assert not [w for w in wrong if "did not answer" in w], wrong[:10]
    assert tracebacks(text) == 0


async def agree(node: ServerProcess, load: NodeLoad, since: float, within: float = 10.0) -> float:
    """Wait until both workers list the same instances of every service the load writes and no
    worker holds a connection client but those of the SDK clients' current connections (no ghost:
    the load's SDK clients are the node's only gRPC clients); seconds since ``since``."""
    services = (load.beaters.service, load.sdk.service, load.writers.service)

    def same() -> bool:
        for service in services:
            if len({frozenset(worker_listed_ips(node, w, service)) for w in range(node.workers)}) != 1:
                return False
        current = {sdk_connection_id(c) for c in load.sdk.clients}
        return all({c for c in worker_client_ids(node, w) if CONNECTION_ID.match(c)} <= current
                   for w in range(node.workers))

    await wait_until(lambda: asyncio.to_thread(same), within, what="the workers to agree, no ghost left",
                     interval=0.2)
    return time.monotonic() - since


# --- SIGTERM ----------------------------------------------------------------------------------
async def test_sigterm_under_load_exits_zero_within_five_seconds(loaded: tuple[ServerProcess, NodeLoad]) -> None:
    node, load = loaded
    await warm(load)
    pids = node.worker_pids()
    ports = node_ports(node)
    started = time.monotonic()
    node.signal(signal.SIGTERM)
    code = await asyncio.to_thread(node.proc.wait, 10)
    took = time.monotonic() - started
    left = [pid for pid in pids if pid_alive(pid)]
    taken = [port for port in ports if not bindable(node.host, port)]
    text = node.log()
    print(f"worker fault SIGTERM: exit {code} after {took:.2f} s with {len(load.sdk.clients)} SDK clients, "
          f"{load.beaters.count} beating instances and {load.writers.count} writers on; workers left {left}, "
          f"ports taken {taken}; tracebacks {tracebacks(text)}; load {loadavg()}")
    assert code == 0 and took <= 5.0
    assert left == [] and taken == []
    assert tracebacks(text) == 0


# --- kill -9 of the supervisor ----------------------------------------------------------------
async def test_kill9_of_the_supervisor_under_load(loaded: tuple[ServerProcess, NodeLoad]) -> None:
    node, load = loaded
    await warm(load)
    pids = node.worker_pids()
    ports = node_ports(node)
    killed_at = time.monotonic()
    await asyncio.to_thread(node.kill)
    await wait_until(lambda: not any(pid_alive(p) for p in pids), 3, what="every worker to die with the supervisor")
    orphans_s = time.monotonic() - killed_at
    await wait_until(lambda: all(bindable(node.host, p) for p in ports), 3, what="every port to be free")
    free_s = time.monotonic() - killed_at

    def connected(client: Any) -> bool:
        return bool(client.grpc_client_proxy.rpc_client.is_running())
    await wait_until(lambda: not any(connected(c) for c in load.sdk.clients), 5,
                     what="every SDK client to see its connection gone")
    lost_s = time.monotonic() - killed_at
    await wait_until(lambda: all(any(a.at >= killed_at + 0.5 for w2, _, a in load.writers.answers if w2 == w)
                                 for w in range(load.writers.count)), 5, what="every writer to try again")
    await load.stop_writes()
    after = [a for _, _, a in load.writes(since=killed_at)]
    text = node.log()
    print(f"worker fault kill -9 supervisor: workers gone {orphans_s:.2f} s, ports free {free_s:.2f} s, every SDK "
          f"client disconnected {lost_s:.2f} s after the kill; writes after it {len(after)}, answered "
          f"{sum(a.ok for a in after)}, errors {sorted({a.error for a in after if not a.ok})}, slowest "
          f"{max((a.took for a in after), default=0):.2f} s; tracebacks {tracebacks(text)}; load {loadavg()}")
    assert not [a for a in after if a.error == "timeout"], "a client waited for its timeout instead of a reset"
    assert tracebacks(text) == 0
