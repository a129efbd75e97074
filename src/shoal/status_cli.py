"""``shoal status``: what a running node says about itself, for operators.

Reads the node's HTTP endpoints only (so it works from any machine that reaches the main port):
``/nacos/v1/console/health/readiness``, ``/nacos/v1/console/server/state`` (version, mode,
gRPC transport, kernels), ``/nacos/v1/ns/operator/metrics`` (counts, and Shoal's push lag: p99
and the slowest subscribers) and
``/nacos/v1/core/cluster/nodes`` (members and their states; admin-only when auth is on: give
a token, a user and password file, or the cluster identity): one per node, with the states of a
node's workers when it runs several. With ``--data-dir`` on the node's machine, a multi-worker
node's ``workers.json`` too (its workers, their pids, ports, restarts). Exit codes: 0 the node
serves and every member (every worker) is UP and every local worker runs, 1 the node cannot be
asked, 3 it answers but is not ready, a member or worker is not UP or a worker is not running.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_DEGRADED = 3


class StatusError(Exception):
    """The node could not be asked (unreachable, refused, or an answer that is not JSON)."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``status`` to the ``shoal`` command."""
    parser = sub.add_parser(
        "status",
        help="members, states, counts, transport and kernels of a running node",
        description="Ask a running node (its main HTTP port) for its readiness, version and mode, gRPC "
                    "transport and kernels, registry counts, and the cluster members with their states. "
                    "With auth on, the member list needs an admin: --token, --username with "
                    "--password-file, or the cluster identity (--identity-key/--identity-value). "
                    "Exit status: 0 serving and every member UP, 1 unreachable, 3 not ready or a member not UP.",
    )
    parser.add_argument("--addr", default="127.0.0.1:8848", metavar="HOST:PORT",
                        help="the node's main (HTTP) address (default 127.0.0.1:8848)")
    add_credentials(parser)
    parser.add_argument("--data-dir", metavar="DIR",
                        help="the node's data dir (on its machine): also show a multi-worker node's workers "
                             "(workers.json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each answer (default 5)")
    parser.set_defaults(func=_cmd_status)


class _Node:
    def __init__(self, addr: str, headers: dict[str, str], timeout: float) -> None:
        self.base = f"http://{addr}"
        self.headers = headers
        self.timeout = timeout
        self.token = ""

    def get(self, path: str, **query: str) -> tuple[int, str]:
        if self.token:
            query["accessToken"] = self.token
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")
        except (OSError, ValueError) as exc:
            raise StatusError(f"cannot reach {self.base}: {getattr(exc, 'reason', exc)}") from None

    def get_json(self, path: str, **query: str) -> Any:
        status, text = self.get(path, **query)
        if status != 200:
            raise StatusError(f"{path} answered {status}: {text[:200]}")
        try:
            return json.loads(text)
        except ValueError:
            raise StatusError(f"{path} did not answer JSON: {text[:200]!r}") from None

    def login(self, username: str, password: str) -> None:
        data = urllib.parse.urlencode({"username": username, "password": password}).encode()
        request = urllib.request.Request(self.base + "/nacos/v1/auth/login", data=data, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                self.token = str(json.loads(resp.read())["accessToken"])
        except urllib.error.HTTPError as exc:
            raise StatusError(f"login as {username} refused ({exc.code})") from None
        except (OSError, ValueError, KeyError) as exc:
            raise StatusError(f"login as {username} failed: {exc}") from None


def collect(node: _Node) -> dict[str, Any]:
    """Everything ``shoal status`` shows, as one dict (also the ``--json`` output)."""
    status, text = node.get("/nacos/v1/console/health/readiness")
    out: dict[str, Any] = {"addr": node.base.removeprefix("http://"), "ready": status == 200,
                           "readiness": text.strip() or str(status)}
    out["server"] = node.get_json("/nacos/v1/console/server/state")
    metrics = node.get_json("/nacos/v1/ns/operator/metrics", onlyStatus="false")
    out["counts"] = {k: v for k, v in metrics.items() if k.endswith("Count")}
    out["status"] = metrics.get("status", "")
    out["push_lag"] = metrics.get("pushLag")
    code, body = node.get("/nacos/v1/core/cluster/nodes")
    if code == 200:
        members = json.loads(body).get("data", [])
        out["members"] = [member_row(m) for m in members]
    else:
        out["members"] = None
        out["members_problem"] = f"member list answered {code} (with auth on it needs an admin token or identity)"
    return out


def read_workers(data_dir: Path) -> dict[str, Any] | None:
    """A multi-worker node's ``workers.json`` with whether each process is alive (None: no such file)."""
    try:
        state = json.loads((data_dir / "workers.json").read_text())
    except (OSError, ValueError):
        return None
    for row in [state, *state.get("workers", [])]:
        pid = int(row.get("pid", row.get("supervisor", 0)) or 0)
        row["alive"] = pid > 0 and Path(f"/proc/{pid}").exists()
    return dict(state)


def render(info: dict[str, Any]) -> str:
    """The text form of :func:`collect`'s dict."""
    server = info["server"]
    counts = info["counts"]
    lines = [
        f"node {info['addr']}: {info['status']}, {'ready' if info['ready'] else 'NOT READY: ' + info['readiness']}",
        f"  version {server.get('version')}, {server.get('standalone_mode')} mode, "
        f"auth {'on' if server.get('auth_enabled') == 'true' else 'off'}",
        f"  gRPC transport {server.get('shoal_transport')}; kernels {server.get('shoal_kernels')}",
        "  " + ", ".join(f"{k.removesuffix('Count')} {v}" for k, v in counts.items()),
    ]
    lines.extend(_render_push_lag(info.get("push_lag")))
    members = info["members"]
    if members is None:
        lines.append(f"  members: {info['members_problem']}")
    else:
        states: dict[str, int] = {}
        for m in members:
            states[str(m["state"])] = states.get(str(m["state"]), 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        lines.append(f"  members ({len(members)}: {summary}):")
        lines.extend(f"    {m['address']:<24} {m['state']}"
                     + (f" (failed reports {m['failAccessCnt']})" if m["failAccessCnt"] else "")
                     + (f" ({len(m['workers'])} workers: "
                        + ", ".join(f"{a} {st}" for a, st in m["workers"].items()) + ")" if m.get("workers") else "")
                     for m in members)
    workers = info.get("workers")
    if workers:
        lines.append(f"  workers ({len(workers['workers'])}, supervisor pid {workers['supervisor']}"
                     f"{'' if workers['alive'] else ' GONE'}):")
        lines.extend(f"    #{w['index']} pid {w['pid'] or '-':<8} private port {w['port']:<6} restarts {w['restarts']}"
                     + ("" if w["alive"] else " NOT RUNNING") for w in workers["workers"])
    return "\n".join(lines)


def member_row(member: dict[str, Any]) -> dict[str, Any]:
    """What status keeps of one node's Member JSON (``/v1/core/cluster/nodes``)."""
    return {"address": member.get("address"), "state": member.get("state"),
            "failAccessCnt": member.get("failAccessCnt", 0), "workers": _worker_states(member.get("extendInfo") or {})}


def _worker_states(extend: dict[str, Any]) -> dict[str, str]:
    """A node of workers' ``workerStates`` (``ip:port=STATE,...``) as {worker: state}; {} otherwise."""
    text = extend.get("workerStates")
    if not isinstance(text, str):
        return {}
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value} ms"


def _render_push_lag(lag: dict[str, Any] | None) -> list[str]:
    """Push lag lines: the node's p99 over its recent acks, the slowest subscribers, and the
    services whose empty push is withheld."""
    if not lag:
        return []
    minutes = int(lag.get("windowMs", 0)) // 60_000
    lines = [f"  push lag p99 {_ms(lag.get('p99Ms'))} over {lag.get('acks', 0)} acks (last {minutes} min)"]
    for row in lag.get("slowest") or []:
        lines.append(f"    {row['clientId']:<40} p99 {_ms(row.get('p99Ms'))}, last {_ms(row.get('lastMs'))}, "
                     f"pending {row.get('pending', 0)} (oldest {_ms(row.get('oldestPendingMs'))})")
    protected = lag.get("protectedServices") or []
    if protected:
        lines.append(f"  empty push withheld for {len(protected)} service(s): {', '.join(protected[:10])}")
    return lines


def healthy(info: dict[str, Any]) -> bool:
    """Ready, and every member (when the list could be read) UP, each worker of a node of workers too."""
    members = info["members"] or []
    states = [m["state"] for m in members] + [st for m in members for st in (m.get("workers") or {}).values()]
    workers = info.get("workers") or {"alive": True, "workers": []}
    return (bool(info["ready"]) and all(state == "UP" for state in states)
            and bool(workers["alive"]) and all(w["alive"] for w in workers["workers"]))


class UsageError(ValueError):
    """Command-line options that do not go together (exit status 2)."""


def add_credentials(parser: argparse.ArgumentParser) -> None:
    """The options an admin command authenticates with (``shoal status``, ``shoal check``)."""
    parser.add_argument("--token", help="accessToken of an admin user")
    parser.add_argument("--username", help="admin user (logs in to get a token)")
    parser.add_argument("--password-file", metavar="FILE", help="file whose first line is --username's password")
    parser.add_argument("--identity-key", metavar="NAME", help="nacos.core.auth.server.identity.key of the cluster")
    parser.add_argument("--identity-value", metavar="VALUE", help="nacos.core.auth.server.identity.value")


def identity_headers(args: argparse.Namespace) -> dict[str, str]:
    """The cluster identity header of :func:`add_credentials`' options; UsageError for half a pair."""
    if bool(args.identity_key) != bool(args.identity_value):
        raise UsageError("--identity-key and --identity-value go together")
    return {args.identity_key: args.identity_value} if args.identity_key else {}


def authenticate(node: _Node, args: argparse.Namespace) -> None:
    """Give ``node`` the token of :func:`add_credentials`' options (logging in with a username);
    UsageError for a bad option, StatusError when the node refuses or does not answer."""
    if args.token:
        node.token = args.token
    elif args.username:
        if not args.password_file:
            raise UsageError("--username needs --password-file")
        try:
            password = Path(args.password_file).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError) as exc:
            raise UsageError(f"cannot read the password file: {exc}") from None
        node.login(args.username, password)


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        node = _Node(args.addr, identity_headers(args), args.timeout)
        authenticate(node, args)
        info = collect(node)
        if args.data_dir:
            info["workers"] = read_workers(Path(args.data_dir))
    except UsageError as exc:
        print(f"shoal status: {exc}", file=sys.stderr)
        return 2
    except StatusError as exc:
        print(f"shoal status: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(json.dumps(info, indent=2) if args.json else render(info))
    return EXIT_OK if healthy(info) else EXIT_DEGRADED
