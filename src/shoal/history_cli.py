"""``shoal history``: an instance's lifecycle, or what a subscriber held (issue 23 item 5).

Asks the node at ``--addr`` for its history log (``/nacos/v1/shoal/history``, admin only, so the
auth options are ``shoal status``'s) and prints one paragraph per instance: registered by which
client on which node, edits, health flips, and how it went (deregistered, expired with the beat
reason, connection closed, Distro removal, moved). ``--subscriber CLIENT --at T`` prints instead
the list the subscriber held at T: its last push acknowledged at or before T, per service.

A node's log holds what that node decided or saw; for every node of a cluster over a long span
use ``shoal analytics history`` on the nodes' history directories.

Exit status: 0 answered, 1 the node cannot be reached or refused, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from shoal.export.history_rows import parse_service, parse_time, render, render_held
from shoal.status_cli import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    StatusError,
    UsageError,
    _Node,
    add_credentials,
    authenticate,
    identity_headers,
)

HISTORY_PATH = "/nacos/v1/shoal/history"
SUBSCRIBER_PATH = "/nacos/v1/shoal/history/subscriber"
EXIT_USAGE = 2


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``history`` to the ``shoal`` command."""
    parser = sub.add_parser(
        "history",
        help="an instance's lifecycle, or the list a subscriber held at a time",
        description="Print what the node's history log holds of a service's instances (register, edits, "
                    "health flips, deregister / expiry / connection closed / Distro removal, with their "
                    "reasons, clients and owner nodes), or with --subscriber and --at the list a subscriber "
                    "held then. Times: epoch ms, ISO 8601 (UTC unless it says otherwise) or a span back "
                    "from now (90s, 15m, 2h, 1d). Auth as for `shoal status`.",
    )
    parser.add_argument("--addr", default="127.0.0.1:8848", metavar="HOST:PORT",
                        help="main (HTTP) address of the node (default 127.0.0.1:8848)")
    parser.add_argument("--service", default="", metavar="NAME",
                        help="the service (name, group@@name or namespace/group@@name)")
    parser.add_argument("--ip", default="", help="only instances with this IP")
    parser.add_argument("--since", default="", metavar="T", help="only events at or after T")
    parser.add_argument("--limit", type=int, default=10_000, help="newest rows at most (default 10000)")
    parser.add_argument("--subscriber", default="", metavar="CLIENT",
                        help="a subscriber's client (connection) id: print what it held at --at")
    parser.add_argument("--at", default="", metavar="T", help="the time for --subscriber")
    add_credentials(parser)
    parser.add_argument("--json", action="store_true", help="print the node's JSON answer instead of text")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)")
    parser.set_defaults(func=_cmd_history)


def _query(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The path and query of the request the options ask for; UsageError when they do not go together."""
    now = int(time.time() * 1000)
    try:
        if args.subscriber:
            if not args.at:
                raise UsageError("--subscriber needs --at")
            query = {"clientId": args.subscriber, "at": str(parse_time(args.at, now))}
            if args.service:
                parse_service(args.service)
                query["service"] = args.service
            return SUBSCRIBER_PATH, query
        if args.at:
            raise UsageError("--at goes with --subscriber")
        if not args.service:
            raise UsageError("give --service (or --subscriber with --at)")
        parse_service(args.service)
        query = {"service": args.service, "limit": str(args.limit)}
        if args.ip:
            query["ip"] = args.ip
        if args.since:
            query["since"] = str(parse_time(args.since, now))
        return HISTORY_PATH, query
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _cmd_history(args: argparse.Namespace) -> int:
    try:
        if args.limit < 1 or args.timeout <= 0:
            raise UsageError("--limit must be >= 1 and --timeout > 0")
        path, query = _query(args)
        node = _Node(args.addr, identity_headers(args), args.timeout)
        authenticate(node, args)
    except UsageError as exc:
        print(f"shoal history: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StatusError as exc:
        print(f"shoal history: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        answer = node.get_json(path, **query)
    except StatusError as exc:
        print(f"shoal history: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(answer, indent=2))
    elif path == SUBSCRIBER_PATH:
        print(render_held(answer))
    else:
        print(render(answer.get("rows") or []))
    return EXIT_OK
