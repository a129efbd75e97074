"""``shoal check``: which node is stale (issue 23 item 4).

Asks the node at ``--addr`` for the member list (``/nacos/v1/core/cluster/nodes``), then every
member for its digest of each service (``/nacos/v1/shoal/digests``): each node, or each worker of
a node of workers on its private port (each holds a replica), and compares them
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


def members_of(node: _Node) -> dict[str, list[str]]:
    """The nodes the node knows (itself when standalone), each with the members to ask: the
    private addresses of its workers (``extendInfo.workerStates``) for a node of several, else
    the node itself."""
    status, text = node.get("/nacos/v1/core/cluster/nodes")
    if status != 200:
        raise StatusError(f"the member list answered {status} (with auth on it needs an admin token or identity)")
    try:
        data = json.loads(text)
        items = data.get("data", data) if isinstance(data, dict) else data
        nodes = {str(m["address"]): _workers(m) or [str(m["address"])] for m in items}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StatusError(f"the member list is not one: {exc}") from None
    return nodes or {node.base.removeprefix("http://"): [node.base.removeprefix("http://")]}


def _workers(member: dict[str, object]) -> list[str]:
    """A node's workers' addresses from its Member JSON (``ip:port=STATE,...``); [] for one process."""
    extend = member.get("extendInfo")
    states = extend.get("workerStates", "") if isinstance(extend, dict) else ""
    return sorted(item.partition("=")[0] for item in str(states).split(",") if item.partition("=")[0])


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


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def render(result: Comparison, nodes: dict[str, list[str]] | None = None) -> str:
    """The text form: who differs from whom, or that all agree. ``nodes`` (node → the members
    asked, :func:`members_of`) says which were workers of which node: the text talks about nodes,
    with the workers as detail."""
    nodes = nodes if nodes is not None else {m: [m] for m in result.members}
    node_of = {member: node for node, members in nodes.items() for member in members}
    workers = sum(len(members) for node, members in nodes.items() if members != [node])

    def name(member: str) -> str:
        node = node_of.get(member, member)
        return member if node == member else f"{node} (worker {member})"

    count, services = len(nodes), _plural(result.services, "service")
    of_workers = f" ({_plural(workers, 'worker')})" if workers else ""
    if result.agree:
        if count == 1 and not workers:
            return f"1 node, no other member to compare it with; it holds {services}"
        if count == 1:
            return f"the node's {_plural(workers, 'worker')} agree on {services}"
        return f"all {count} nodes{of_workers} agree on {services}"
    lines = [f"{name(member)} does not answer" for member in result.unanswered]
    for service, groups in sorted(result.disagree.items()):
        parts = []
        for digest, holders in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            what = "do not have it" if digest == ABSENT else f"hold {digest[1]} instance(s), digest {digest[0]}"
            parts.append(f"{', '.join(map(name, holders))} {what}")
        lines.append(f"{service}: " + "; ".join(parts))
    answered = len(result.members) - len(result.unanswered)
    asked = f"{answered} of {len(result.members)} members of {_plural(count, 'node')}" if workers \
        else f"{answered} of {_plural(count, 'node')}"
    lines.append(f"{asked} answered; they disagree on {len(result.disagree)} of {result.services} services")
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
    for member in (m for node_members in members.values() for m in node_members):
        nodes[member] = _Node(member, headers, args.timeout)
        nodes[member].token = node.token
    result = check(nodes, args.service, args.recheck)
    print(json.dumps({**result.to_json(), "nodes": members}, indent=2) if args.json else render(result, members))
    return EXIT_OK if result.agree else EXIT_DEGRADED
