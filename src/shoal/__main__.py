"""The ``shoal`` command. The only place that installs uvloop and configures logging."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shoal import __version__
from shoal.config import AUTO_WORKERS_CAP, Config, TestHooks, worker_count
from shoal.config_sources import Report
from shoal.errors import ConfigError
from shoal.gcpolicy import GcPolicy, HeapTrimmer
from shoal.workers.placement import WorkerPlacement

if TYPE_CHECKING:
    from shoal.app import Node

log = logging.getLogger("shoal")


def _settings_epilog() -> str:
    lines = ["settings (set with -D property=value, a --config file, or SHOAL_<FIELD> env vars; the Nacos",
             "Docker image's MODE, NACOS_SERVERS, NACOS_APPLICATION_PORT, NACOS_AUTH_* work too):"]
    for prop, value, doc in Config().describe():
        lines.append(f"  {prop} = {value}\n      {doc}")
    return "\n".join(lines)


#: Every subcommand but ``server``, with the one-line help ``shoal --help`` lists (its module's
#: ``register`` says the same: tests/unit/test_cli_parser.py compares them).
_COMMANDS: dict[str, str] = {
    "users": "manage the auth users in the node's CP store",
    "export": "download an Arrow snapshot from a running node",
    "status": "members, states, counts, transport and kernels of a running node",
    "check": "which member serves a different list of a service",
    "history": "an instance's lifecycle, or the list a subscriber held at a time",
    "analytics": "PySpark jobs over exported registry snapshots",
    "simulate": "model a Distro cluster at scale with Spark (ownership, verify, sync, movement; workers per node)",
}
#: The module whose ``register(sub)`` adds each subcommand's full parser, in ``--help`` order.
_COMMAND_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shoal.auth.cli", ("users",)),
    ("shoal.export.client", ("export",)),
    ("shoal.status_cli", ("status",)),
    ("shoal.check_cli", ("check",)),
    ("shoal.history_cli", ("history",)),
    ("shoal.analytics.cli", ("analytics", "simulate")),
)


def command_of(argv: Sequence[str]) -> str:
    """The subcommand ``argv`` names ("" when none: ``shoal --help``, ``shoal --version``)."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``shoal`` parser. Each subcommand's module is imported only for the ``command`` that
    runs (``shoal server`` — a node, a supervisor, each of its workers — imports none of them: no
    auth store, CP clients, HTTP client or analytics); the others are listed with their one-line
    help. ``None`` registers every subcommand in full."""
    parser = argparse.ArgumentParser(
        prog="shoal",
        description="Shoal: a service registry node that speaks the Nacos 2.x naming protocols.",
    )
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    server = sub.add_parser(
        "server",
        help="run a registry node",
        description="Run a registry node: HTTP on --port, the Nacos gRPC SDK port on --port + 1000.",
        epilog=_settings_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server.add_argument("--host", help="address to bind (default 0.0.0.0)")
    server.add_argument("--port", type=int, help="main HTTP port (default 8848; gRPC SDK port = port + 1000)")
    server.add_argument("--data-dir", help="directory for rule files, keys and exports (default ./.data)")
    server.add_argument("--config", metavar="FILE",
                        help="a Nacos application.properties (Java syntax, ${VAR:default} placeholders)")
    server.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log level (default info)")
    server.add_argument("--log-format", choices=["text", "json"],
                        help="log lines as text (default) or JSON objects (ts, level, logger, msg, extras)")
    server.add_argument("--log-file", metavar="FILE",
                        help="log to FILE instead of standard error, rotated by size (shoal.log.file.*)")
    server.add_argument("--members", metavar="H1:P1,H2:P2,...",
                        help="cluster members (main ports, this node included); omit for a standalone node")
    server.add_argument("--cluster-conf", metavar="FILE",
                        help="Nacos cluster.conf with the members, one ip[:port] per line; reloaded on change")
    server.add_argument("--cp-endpoints", metavar="H1:P1,...", help="etcd endpoints of the CP store (mode etcd)")
    server.add_argument("--cp-tls-ca", metavar="FILE", help="CA file for the etcd endpoints (https)")
    server.add_argument("--cp-tls-cert", metavar="FILE", help="client certificate for the etcd endpoints")
    server.add_argument("--cp-tls-key", metavar="FILE", help="client key for the etcd endpoints")
    server.add_argument("--workers", type=_worker_count, metavar="N",
                        help="worker processes serving this node's ports, one per core (shoal.server.workers): "
                             "0 = auto (default): the cores this process may use (affinity and cgroup quota), "
                             f"at most {AUTO_WORKERS_CAP}; 1 = one process. More than one: a supervisor process "
                             "starts and restarts the workers")
    server.add_argument("--auth", action="store_true",
                        help="require a login on every API family (nacos.core.auth.enabled, .admin.enabled and "
                             ".console.enabled = true, the defaults), whatever the properties file says")
    server.add_argument("-D", dest="overrides", action="append", default=[], metavar="PROPERTY=VALUE",
                        help="set any setting listed below; repeatable")
    server.set_defaults(func=_cmd_server)

    for module, names in _COMMAND_MODULES:
        if command is None or command in names:
            try:  # analytics needs the optional PySpark extra only when a job runs; guarded all the same
                registrar = importlib.import_module(module)
            except ImportError:
                continue
            registrar.register(sub)
        else:  # listed with its one-line help; its module and full options only when it runs
            for name in names:
                sub.add_parser(name, help=_COMMANDS[name], add_help=False)
    return parser


def _worker_count(text: str) -> int:
    """``--workers``: 0 (auto) or 1..256 (argparse exits 2 with this message otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of worker processes, got {text!r}") from None
    problem = worker_count(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}, got {value}")
    return value


def _server_config(args: argparse.Namespace) -> tuple[Config, Report]:
    overrides: dict[str, str] = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-D expects PROPERTY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    for flag, field_name in (("host", "host"), ("port", "port"), ("data_dir", "data_dir"),
                             ("log_level", "log_level"), ("log_format", "log_format"), ("log_file", "log_file"),
                             ("members", "members"), ("cluster_conf", "cluster_conf"),
                             ("cp_endpoints", "cp_endpoints"), ("cp_tls_ca", "cp_tls_ca"),
                             ("cp_tls_cert", "cp_tls_cert"), ("cp_tls_key", "cp_tls_key"),
                             ("workers", "server_workers")):
        value = getattr(args, flag)
        if value is not None:
            overrides[field_name] = str(value)
    if args.auth:
        overrides.update(auth_enabled="true", auth_admin_enabled="true", auth_console_enabled="true")
    return Config.load_with_report(args.config, overrides=overrides)


def _cmd_server(args: argparse.Namespace) -> int:
    # A worker of a multi-worker node (its supervisor set the placement): tied to the supervisor
    # first of all, so that no worker outlives it (shoal/workers/worker.py).
    try:
        placement = WorkerPlacement.from_env()
        if placement is not None:
            from shoal.workers.worker import die_with_supervisor

            die_with_supervisor(placement)
        config, report = _server_config(args)
        if placement is not None:
            from shoal.workers.worker import worker_config

            config = worker_config(config, placement)
    except ConfigError as exc:
        print(f"shoal: invalid configuration: {exc}", file=sys.stderr)
        return 2
    supervising = placement is None and config.workers > 1
    from shoal.logconfig import configure_logging

    try:
        stop_logging = configure_logging(config, "supervisor" if supervising else
                                         str(placement.index) if placement is not None else "")
    except OSError as exc:
        print(f"shoal: cannot open the log file: {exc}", file=sys.stderr)
        return 2
    report.log()
    import uvloop

    if supervising:  # this process only starts, restarts and stops the workers
        from shoal.workers.supervisor import supervise

        # auto resolved once, here, before the loop: it reads the CPU affinity and cgroup files
        config = dataclasses.replace(config, server_workers=config.workers)

        try:
            return uvloop.run(supervise(config, args.argv))
        finally:
            stop_logging()
    policy = GcPolicy()
    policy.install()
    try:
        return uvloop.run(_serve(config, policy, placement))
    finally:
        stop_logging()


async def _serve(config: Config, policy: GcPolicy, placement: WorkerPlacement | None = None) -> int:
    from shoal import kernels
    from shoal.app import Node

    try:
        hooks = TestHooks.from_env()
        node = Node(config, hooks=hooks, placement=placement)  # finds this node in the member list
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    if hooks.active:
        log.warning("TEST HOOKS active (from %s): %s", TestHooks.ENV, hooks)
    kernels.log_implementations()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("shoal %s starting: HTTP %s:%d, gRPC SDK %d, data dir %s", __version__, config.host, config.port,
             config.grpc_port, config.data_dir)
    policy.freeze_startup()  # modules, config, handler tables never need scanning again
    # from here on, what the registry grows by is frozen once it settles (shoal/gcpolicy.py)
    gc_periodic = policy.periodic()
    gc_periodic.start()
    # and the heaps' free pages go back to the system after a burst (shoal/gcpolicy.py)
    trimmer = HeapTrimmer.load()
    trim_periodic = trimmer.periodic() if trimmer is not None else None
    if trim_periodic is not None:
        trim_periodic.start()
    try:
        return await _run_node(node, stop, policy)
    finally:
        if trim_periodic is not None:
            await trim_periodic.stop()
        await gc_periodic.stop()


async def _run_node(node: Node, stop: asyncio.Event, policy: GcPolicy) -> int:
    # A stop requested while starting (e.g. while waiting for a snapshot from an unreachable
    # peer) must not wait for the start to finish: the start is cancelled, then stopped as usual.
    starting = asyncio.ensure_future(node.start())
    stopping = asyncio.ensure_future(stop.wait())
    # What the start builds (a loaded snapshot can be millions of objects) lives as long as the
    # node: the collector is paused meanwhile (collections would only scan the growing registry)
    # and what was built is frozen once the start ends, so no collection ever scans it.
    with policy.paused("started"):
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        started = starting.done()
        if not started:
            log.info("stop requested while starting; shutting down")
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
    if started:
        try:
            starting.result()
        except OSError as exc:
            stopping.cancel()
            log.error("cannot start: %s", exc)
            await node.stop()
            return 1
        await stopping
        log.info("stop requested; shutting down")
    try:
        async with asyncio.timeout(5):
            await node.stop()
    except TimeoutError:
        log.error("graceful stop took longer than 5 s; exiting anyway")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_of(arguments))
    args = parser.parse_args(arguments)
    args.argv = arguments  # a supervisor starts its workers with the same
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
