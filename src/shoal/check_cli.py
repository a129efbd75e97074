"""``shoal check``: which node is stale (issue 23 item 4).

Asks the node at ``--addr`` for the member list (``/nacos/v1/core/cluster/nodes``), then every
member for its digest of each service (``/nacos/v1/shoal/digests``), and compares them
(:mod:`shoal.service_layer.digests`). Replication is eventual, so when the members differ they
are asked again ``--recheck`` seconds later, and only what both rounds show is reported. The
auth options are ``shoal status``'s (an admin token, user, or the cluster identity).

Exit status: 0 every member answers and all agree, 3 members disagree on a service or a member
does not answer, 1 the node asked cannot be reached, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from shoal.service_layer.digests import ABSENT, Comparison, MemberDigests, compare, parse_digests, persistent
from shoal.status_cli import (
    EXIT_DEGRADED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    StatusError,
    UsageError,
    _Node,
    add_credentials,
    authenticate,
    identity_headers,
)

DIGESTS_PATH = "/nacos/v1/shoal/digests"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``check`` to the ``shoal`` command."""
    parser = sub.add_parser(
        "check",
        help="which member serves a different list of a service",
        description="Ask every member of the cluster (the node at --addr gives the member list) for its "
                    "digest of each service and print the services on which members disagree and who "
                    "differs from whom. A difference must show again --recheck seconds later to be "
                    "reported (a write being replicated is not one). Auth as for `shoal status`. "
                    "Exit status: 0 all agree, 3 a disagreement or a member that does not answer, "
                    "1 the node asked is unreachable.",
    )
    parser.add_argument("--addr", default="127.0.0.1:8848", metavar="HOST:PORT",
                        help="main (HTTP) address of any member (default 127.0.0.1:8848)")
    parser.add_argument("--service", default="", metavar="NAME",
                        help="only this service (name, group@@name or namespace/group@@name)")
    parser.add_argument("--recheck", type=float, default=1.0, metavar="SECONDS",
                        help="delay of the second round when members differ (default 1)")
    add_credentials(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each answer (default 3)")
    parser.set_defaults(func=_cmd_check)


def members_of(node: _Node) -> list[str]:
    """The member addresses the node knows (itself when standalone)."""
    status, text = node.get("/nacos/v1/core/cluster/nodes")
    if status != 200:
        raise StatusError(f"the member list answered {status} (with auth on it needs an admin token or identity)")
    try:
        data = json.loads(text)
        items = data.get("data", data) if isinstance(data, dict) else data
        return [str(m["address"]) for m in items] or [node.base.removeprefix("http://")]
    except (ValueError, TypeError, KeyError) as exc:
        raise StatusError(f"the member list is not one: {exc}") from None


def digests_of(node: _Node, service: str) -> MemberDigests:
    """One member's digests; None when it does not answer them."""
    try:
        data = node.get_json(DIGESTS_PATH, **({"service": service} if service else {}))
    except StatusError:
        return None
    return parse_digests(data.get("services")) if isinstance(data, dict) else None


def one_round(nodes: dict[str, _Node], service: str) -> Comparison:
    with ThreadPoolExecutor(max_workers=max(len(nodes), 1)) as pool:
        answers = list(pool.map(lambda n: digests_of(n, service), nodes.values()))
    return compare(dict(zip(nodes, answers, strict=True)))


def check(nodes: dict[str, _Node], service: str, recheck_s: float) -> Comparison:
    """Two rounds when the first shows a difference; what both show."""
    first = one_round(nodes, service)
    if first.agree:
        return first
    time.sleep(recheck_s)
    return persistent(first, one_round(nodes, service))


def render(result: Comparison) -> str:
    """The text form: who differs from whom, or that all agree."""
    n, m = len(result.members), result.services
    if result.agree:
        return f"all {n} members agree on {m} service{'s' if m != 1 else ''}"
    lines = [f"{member} does not answer" for member in result.unanswered]
    for name, groups in sorted(result.disagree.items()):
        parts = []
        for digest, holders in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            what = "do not have it" if digest == ABSENT else f"hold {digest[1]} instance(s), digest {digest[0]}"
            parts.append(f"{', '.join(holders)} {what}")
        lines.append(f"{name}: " + "; ".join(parts))
    answered = n - len(result.unanswered)
    lines.append(f"{answered} of {n} members answered; they disagree on {len(result.disagree)} of {m} services")
    return "\n".join(lines)


def _cmd_check(args: argparse.Namespace) -> int:
    if args.recheck < 0 or args.timeout <= 0:
        print("shoal check: --recheck must be >= 0 and --timeout > 0", file=sys.stderr)
        return 2
    try:
        headers = identity_headers(args)
        node = _Node(args.addr, headers, args.timeout)
        authenticate(node, args)
        members = members_of(node)
    except UsageError as exc:
        print(f"shoal check: {exc}", file=sys.stderr)
        return 2
    except StatusError as exc:
        print(f"shoal check: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    nodes: dict[str, _Node] = {}
    for member in members:
        nodes[member] = _Node(member, headers, args.timeout)
        nodes[member].token = node.token
    result = check(nodes, args.service, args.recheck)
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return EXIT_OK if result.agree else EXIT_DEGRADED
