"""``shoal export``: fetch a snapshot from a running node's admin endpoint and unpack it."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "export",
        help="download an Arrow snapshot from a running node",
        description="Ask a running node for a fresh Arrow snapshot (instances, clients, services, "
                    "events) and unpack it into --out as <node>-<taken_at_ms>/. Needs an admin "
                    "token (or --username with --password-file) when the node runs with auth.",
    )
    parser.add_argument("--addr", required=True, metavar="HOST:PORT",
                        help="the node's main (HTTP) address; https://HOST:PORT for a node serving HTTPS")
    parser.add_argument("--ca-file", metavar="PEM", help="CA certificates to verify an HTTPS node with "
                        "(default: the system's)")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to unpack the snapshot into")
    parser.add_argument("--token", help="accessToken of an admin user")
    parser.add_argument("--username", help="admin user (logs in to get a token)")
    parser.add_argument("--password-file", metavar="FILE", help="file holding the admin user's password")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the node (default 300)")
    parser.set_defaults(func=_cmd_export)


def _login(base: str, username: str, password: str, timeout: float, context: ssl.SSLContext | None) -> str:
    data = urllib.parse.urlencode({"username": username, "password": password}).encode()
    with urllib.request.urlopen(f"{base}/nacos/v1/auth/login", data=data, timeout=timeout, context=context) as resp:
        return str(json.loads(resp.read())["accessToken"])


def _cmd_export(args: argparse.Namespace) -> int:
    base = args.addr if args.addr.startswith(("http://", "https://")) else f"http://{args.addr}"
    base = base.rstrip("/")
    token = args.token or ""
    try:
        context = ssl.create_default_context(cafile=args.ca_file) if base.startswith("https://") else None
        if not token and args.username:
            if not args.password_file:
                print("shoal export: --username needs --password-file", file=sys.stderr)
                return 2
            password = Path(args.password_file).read_text(encoding="utf-8").strip()
            token = _login(base, args.username, password, args.timeout, context)
        url = f"{base}/nacos/v1/shoal/export"
        if token:
            url += "?" + urllib.parse.urlencode({"accessToken": token})
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as spool:
            with urllib.request.urlopen(url, timeout=args.timeout, context=context) as resp:
                while chunk := resp.read(1024 * 1024):
                    spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r") as tar:
                names = {m.name.split("/", 1)[0] for m in tar.getmembers()}
                tar.extractall(out, filter="data")
    except urllib.error.HTTPError as exc:
        print(f"shoal export: {args.addr} answered {exc.code}: {exc.read().decode(errors='replace')[:300]}",
              file=sys.stderr)
        return 1
    except (OSError, tarfile.TarError, ValueError, KeyError) as exc:
        print(f"shoal export: {exc}", file=sys.stderr)
        return 1
    from shoal.export.reader import read_manifest

    for name in sorted(names):
        manifest = read_manifest(out / name)
        print(f"{out / name}: {json.dumps(manifest.rows)}")
    return 0
