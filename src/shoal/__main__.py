"""The ``shoal`` command. The only place that installs uvloop and configures logging."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Sequence

from shoal import __version__
from shoal.config import Config, TestHooks
from shoal.errors import ConfigError

log = logging.getLogger("shoal")


def _settings_epilog() -> str:
    lines = ["settings (set with -D property=value, a --config file, or SHOAL_<FIELD> env vars):"]
    for prop, value, doc in Config().describe():
        lines.append(f"  {prop} = {value}\n      {doc}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
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
    server.add_argument("--config", help="properties file with settings (key=value lines, Nacos names)")
    server.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log level (default info)")
    server.add_argument("--members", metavar="H1:P1,H2:P2,...",
                        help="cluster members (main ports, this node included); omit for a standalone node")
    server.add_argument("--cluster-conf", metavar="FILE",
                        help="Nacos cluster.conf with the members, one ip[:port] per line; reloaded on change")
    server.add_argument("--cp-endpoints", metavar="H1:P1,...", help="etcd endpoints of the CP store (mode etcd)")
    server.add_argument("--cp-tls-ca", metavar="FILE", help="CA file for the etcd endpoints (https)")
    server.add_argument("--cp-tls-cert", metavar="FILE", help="client certificate for the etcd endpoints")
    server.add_argument("--cp-tls-key", metavar="FILE", help="client key for the etcd endpoints")
    server.add_argument("--auth", action="store_true",
                        help="require tokens on the naming APIs (nacos.core.auth.enabled=true)")
    server.add_argument("-D", dest="overrides", action="append", default=[], metavar="PROPERTY=VALUE",
                        help="set any setting listed below; repeatable")
    server.set_defaults(func=_cmd_server)

    from shoal.auth import cli as users_cli

    users_cli.register(sub)

    from shoal.export import client as export_client

    export_client.register(sub)

    try:  # analytics needs the optional PySpark extra; the server must not require it
        from shoal.analytics import cli as analytics_cli
    except ImportError:
        pass
    else:
        analytics_cli.register(sub)
    return parser


def _server_config(args: argparse.Namespace) -> Config:
    overrides: dict[str, str] = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-D expects PROPERTY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    for flag, field_name in (("host", "host"), ("port", "port"), ("data_dir", "data_dir"),
                             ("log_level", "log_level"), ("members", "members"), ("cluster_conf", "cluster_conf"),
                             ("cp_endpoints", "cp_endpoints"), ("cp_tls_ca", "cp_tls_ca"),
                             ("cp_tls_cert", "cp_tls_cert"), ("cp_tls_key", "cp_tls_key")):
        value = getattr(args, flag)
        if value is not None:
            overrides[field_name] = str(value)
    if args.auth:
        overrides["auth_enabled"] = "true"
    return Config.load(args.config, overrides=overrides)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _cmd_server(args: argparse.Namespace) -> int:
    try:
        config = _server_config(args)
    except ConfigError as exc:
        print(f"shoal: invalid configuration: {exc}", file=sys.stderr)
        return 2
    _configure_logging(config.log_level)
    # A registry allocates many small, long-lived objects (connections, clients, instances);
    # with CPython's default threshold (700) the collector ran so often that it took ~40% of
    # a 10,000-connection keep-alive scan. Collections stay frequent enough for cycles.
    gc.set_threshold(50_000, 50, 1000)
    import uvloop

    return uvloop.run(_serve(config))


async def _serve(config: Config) -> int:
    from shoal import kernels
    from shoal.app import Node

    try:
        hooks = TestHooks.from_env()
        node = Node(config, hooks=hooks)  # finds this node in the member list, reads cluster.conf
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
    gc.collect()
    gc.freeze()  # startup objects (modules, config, handler tables) never need scanning again
    try:
        await node.start()
    except OSError as exc:
        log.error("cannot start: %s", exc)
        await node.stop()
        return 1
    await stop.wait()
    log.info("stop requested; shutting down")
    try:
        async with asyncio.timeout(5):
            await node.stop()
    except TimeoutError:
        log.error("graceful stop took longer than 5 s; exiting anyway")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
