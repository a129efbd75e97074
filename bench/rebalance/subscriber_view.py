"""What a subscriber on another node sees while rebalancing moves a client, with and without the
grace period (``shoal.rebalance.grace-ms``; 0 is Nacos's behaviour: released at once).

Per run: three real `shoal server` processes on free 127.0.0.1 ports; a publisher on A registers
one instance; a raw gRPC subscriber on C records every NotifySubscriberRequest and a poller reads
C's ``/nacos/v1/ns/instance/list`` every 50 ms; then the loader API moves the publisher
(``reloadClient`` towards B). The publisher is

* ``java``: a raw gRPC client that follows ConnectResetRequest to B and registers again
  ``--redo-delay`` seconds after reconnecting (the Java SDK's redo task runs every 3 s), or
* ``python-sdk``: the real nacos-sdk-python 3.x, whose stream the server closes (it cannot
  parse the reset); it reconnects to a server of its list and registers again on its redo tick.

The run ends when the publisher has registered again, its old client is gone from every node
and C lists the instance, bounded by ``--timeout``. Reported per grace setting and client:
pushes received after the move, pushes without the instance, the time the subscriber's pushed
list lacked it (from the first push without it to the next push with it), and the same from
the poller (polls without it, and the time between the first such poll and the next with it).

    PYTHONPATH=src .venv/bin/python -m bench.rebalance.subscriber_view
    PYTHONPATH=src .venv/bin/python -m bench.rebalance.subscriber_view --client java --grace-ms 0,45000 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.distro._common import emit, host_info, install_signal_handlers, log, run_main, server_options
from shoal.testing import OPEN, ServerSet, free_port_block, wait_until
from shoal.testing.moving import (
    JAVA,
    MovingClient,
    PushRecorder,
    aloader,
    client_ids,
    instance_body,
    listed,
)

SERVICE = "bench-moved"
IP, PORT = "10.70.0.1", 8080
INSTANCE = f"{IP}:{PORT}"


def gap_seconds(samples: list[tuple[float, bool]], end: float) -> float:
    """Total time the samples (time, has the instance) say it was missing, up to ``end``."""
    total, missing_since = 0.0, None
    for at, present in samples:
        if not present and missing_since is None:
            missing_since = at
        elif present and missing_since is not None:
            total += at - missing_since
            missing_since = None
    if missing_since is not None:
        total += end - missing_since
    return total


async def one_run(root: Path, grace_ms: int, client: str, redo_delay: float, timeout: float) -> dict[str, Any]:
    with ServerSet(root, auth=OPEN) as servers:
        ports = [free_port_block() for _ in range(3)]
        members = ",".join(f"127.0.0.1:{p}" for p in ports)
        for port in ports:
            servers.start(port, ["--members", members, "-D", "shoal.member.report-interval-ms=300",
                                 "-D", f"shoal.rebalance.grace-ms={grace_ms}"], wait=False, **server_options())
        for server in servers.servers:
            await asyncio.to_thread(server.wait_ready, 60)
        a, b, c = ports
        sdk: Any = None
        mover: MovingClient | None = None
        if client == "java":
            mover = MovingClient(ports, a, JAVA, instance_body(SERVICE, IP, PORT), redo_delay=redo_delay)
            await mover.start()
            old_id, home = mover.connection_id, a
        else:
            from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService, RegisterInstanceParam

            config = (ClientConfigBuilder().server_address(f"127.0.0.1:{a}").log_level("WARNING")
                      .log_dir(str(root / "sdk-logs")).cache_dir(str(root / "sdk-cache"))
                      .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
            sdk = await NacosNamingService.create_naming_service(config)
            await sdk.register_instance(RegisterInstanceParam(service_name=SERVICE, ip=IP, port=PORT))
            current = await wait_until(lambda: aloader(a, "current"), timeout=15)
            old_id, home = next(iter(current)), a
        recorder = PushRecorder(c, SERVICE)
        polls: list[tuple[float, bool]] = []
        stop = asyncio.Event()

        async def poll() -> None:
            while not stop.is_set():
                polls.append((time.monotonic(), INSTANCE in await asyncio.to_thread(listed, c, SERVICE)))
                await asyncio.sleep(0.05)

        try:
            await wait_until(lambda: asyncio.to_thread(lambda: INSTANCE in listed(c, SERVICE)), timeout=15)
            await recorder.start()
            await wait_until(lambda: INSTANCE in recorder.latest(), timeout=15)
            poller = asyncio.get_running_loop().create_task(poll())
            moved_at = time.monotonic()
            pushes_before = len(recorder.pushes)
            await aloader(home, f"reloadClient?connectionId={old_id}&redirectAddress=127.0.0.1:{b}")

            async def back() -> bool:
                ids = [i for p in ports for i in await asyncio.to_thread(client_ids, p)]
                if old_id in ids or INSTANCE not in await asyncio.to_thread(listed, c, SERVICE):
                    return False
                return (mover is not None and len(mover.registered_at) >= 2) or (mover is None and bool(ids))

            await wait_until(back, timeout=timeout, interval=0.2, what="the client to be back and settled")
            settled_at = time.monotonic()
            await asyncio.sleep(1.0)  # a last second of pushes and polls after the end (a measurement window)
            stop.set()
            await poller
            end = time.monotonic()
            after = recorder.pushes[pushes_before:]
            push_samples = [(at, INSTANCE in hosts) for at, hosts in after]
            return {
                "grace_ms": grace_ms, "client": client,
                "settled_after_s": round(settled_at - moved_at, 2),
                "pushes_after_move": len(after),
                "pushes_without_instance": sum(1 for _, ok in push_samples if not ok),
                "pushed_gap_s": round(gap_seconds(push_samples, end), 3),
                "polls": len(polls),
                "polls_without_instance": sum(1 for _, ok in polls if not ok),
                "polled_gap_s": round(gap_seconds(polls, end), 3),
            }
        finally:
            stop.set()
            await recorder.stop()
            if mover is not None:
                await mover.stop()
            if sdk is not None:
                with contextlib.suppress(Exception):
                    await sdk.shutdown()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    host = host_info()
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as tmp:
        for client in args.client.split(","):
            for grace in (int(g) for g in args.grace_ms.split(",")):
                for i in range(args.repeats):
                    log(f"{client}, grace {grace} ms, run {i + 1}/{args.repeats}")
                    results.append(await one_run(Path(tmp) / f"{client}-{grace}-{i}", grace, client,
                                                 args.redo_delay, args.timeout))
    return {"benchmark": "rebalance.subscriber_view", "host": host,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "redo_delay_s": args.redo_delay, "runs": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", default="java,python-sdk", help="java, python-sdk or both (comma-separated)")
    parser.add_argument("--grace-ms", default="0,45000", help="grace periods to compare (comma-separated)")
    parser.add_argument("--redo-delay", type=float, default=3.0,
                        help="seconds the java-like client waits before registering again (Java SDK: up to 3)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=90.0, help="bound of one run's wait, seconds")
    args = parser.parse_args()
    install_signal_handlers()
    emit(asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    run_main(main)
