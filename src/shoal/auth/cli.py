"""``shoal users ...``: scripted administration of the auth users in the CP store a node uses.

    shoal users create NAME --password-file FILE [--admin] [--role ROLE ...] [STORE]
    shoal users passwd NAME --password-file FILE [STORE]
    shoal users delete NAME [STORE]
    shoal users list [STORE]

STORE is ``--data-dir DIR`` (a standalone node's embedded store, ``DIR/cp/store.sqlite3``; the
default) or ``--cp-endpoints host:port,...`` (the etcd cluster of a cluster: its endpoints, or the
managed members on each node's port - 1000). The password is the file's first line (``-`` reads
standard input), so it never appears in a process list or shell history. Nodes on etcd see a
change at once; a standalone node running on the same data dir within about a second (its store
polls the file's revision).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from shoal.auth.cpdata import AuthData
from shoal.auth.store import hash_password, validate_password, validate_role, validate_username
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.etcd import EtcdStore
from shoal.cp.store import CpStore
from shoal.errors import ConfigError, InvalidParam, NacosError

_READY_TIMEOUT_S = 15.0


def register(sub: Any) -> None:
    users = sub.add_parser("users", help="manage the auth users in the node's CP store",
                           description="Manage the auth users in the CP store a node uses (no server needed).")
    actions = users.add_subparsers(dest="users_command", metavar="ACTION")
    actions.required = True

    def store_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data-dir", default="./.data",
                            help="a standalone node's data dir: its embedded store (default ./.data)")
        parser.add_argument("--cp-endpoints", default="", metavar="HOST:PORT,...",
                            help="the cluster's etcd endpoints instead of a data dir")
        parser.add_argument("--cp-tls-ca", default="", metavar="FILE", help="CA file for etcd's TLS (https)")
        parser.add_argument("--cp-tls-cert", default="", metavar="FILE", help="client certificate for etcd")
        parser.add_argument("--cp-tls-key", default="", metavar="FILE", help="client key for etcd")
        parser.add_argument("--cp-user", default="", help="etcd user, when etcd has auth enabled")
        parser.add_argument("--cp-password-file", default="", metavar="FILE",
                            help="file whose first line is the etcd user's password")

    create = actions.add_parser("create", help="create a user (bcrypt-hashed password)",
                                description="Create a user in the CP store.")
    create.add_argument("name", help="user name")
    create.add_argument("--password-file", required=True, metavar="FILE",
                        help="file whose first line is the password ('-' = standard input)")
    create.add_argument("--admin", action="store_true", help="grant the global admin role (ROLE_ADMIN)")
    create.add_argument("--role", action="append", default=[], help="bind a role to the user; repeatable")
    store_options(create)
    create.set_defaults(func=_create)

    passwd = actions.add_parser("passwd", help="set a user's password", description="Set a user's password.")
    passwd.add_argument("name", help="user name")
    passwd.add_argument("--password-file", required=True, metavar="FILE",
                        help="file whose first line is the new password ('-' = standard input)")
    store_options(passwd)
    passwd.set_defaults(func=_passwd)

    delete = actions.add_parser("delete", help="delete a user and its role bindings",
                                description="Delete a user (not a global admin) and its role bindings.")
    delete.add_argument("name", help="user name")
    store_options(delete)
    delete.set_defaults(func=_delete)

    listing = actions.add_parser("list", help="list users and their roles",
                                 description="List the users, one a line: name, then its roles.")
    store_options(listing)
    listing.set_defaults(func=_list)


def _read_password(source: str) -> str:
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    return text.splitlines()[0] if text.splitlines() else ""


def _store(args: argparse.Namespace) -> CpStore:
    endpoints = [e.strip() for e in str(args.cp_endpoints).split(",") if e.strip()]
    if endpoints:
        password = _read_password(args.cp_password_file) if args.cp_password_file else ""
        return EtcdStore(endpoints, ca_file=args.cp_tls_ca, cert_file=args.cp_tls_cert, key_file=args.cp_tls_key,
                         user=args.cp_user, password=password)
    return EmbeddedStore.in_data_dir(args.data_dir)


def _where(args: argparse.Namespace) -> str:
    return f"etcd {args.cp_endpoints}" if args.cp_endpoints.strip() else \
        str(Path(args.data_dir) / "cp" / "store.sqlite3")


def _run(args: argparse.Namespace, action: Callable[[AuthData], Awaitable[str]]) -> int:
    """Open the store, fill the views, run ``action``, print its result; exit codes 0/1/2."""
    command = f"shoal users {args.users_command}"

    async def main() -> str:
        store = _store(args)
        await store.start()
        data = AuthData(store)
        try:
            data.start()
            try:
                await data.wait_ready(_READY_TIMEOUT_S)
            except TimeoutError:
                raise OSError(f"the CP store ({_where(args)}) did not answer within {_READY_TIMEOUT_S:.0f} s") \
                    from None
            return await action(data)
        finally:
            await data.stop()
            await store.close()

    try:
        message = asyncio.run(main())
    except (InvalidParam, ConfigError) as exc:
        print(f"{command}: {exc.message if isinstance(exc, NacosError) else exc}", file=sys.stderr)
        return 2
    except (NacosError, OSError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    if message:
        print(message)
    return 0


def _create(args: argparse.Namespace) -> int:
    try:
        password = _read_password(args.password_file)
    except OSError as exc:
        print(f"shoal users create: {exc}", file=sys.stderr)
        return 1
    try:
        validate_username(args.name, "NAME")
        validate_password(password)
        for role in args.role:
            validate_role(role)
    except InvalidParam as exc:
        print(f"shoal users create: {exc.message}", file=sys.stderr)
        return 2

    async def create(data: AuthData) -> str:
        if data.has_user(args.name):
            raise InvalidParam(f"user '{args.name}' already exist!")
        await data.add_user(args.name, await asyncio.to_thread(hash_password, password))
        if args.admin:
            await data.grant_admin(args.name)
        for role in args.role:
            await data.add_role(role, args.name)
        roles = (["ROLE_ADMIN"] if args.admin else []) + list(args.role)
        return f"created user {args.name!r}{' with roles ' + ', '.join(roles) if roles else ''} in {_where(args)}"

    return _run(args, create)


def _passwd(args: argparse.Namespace) -> int:
    try:
        password = _read_password(args.password_file)
        validate_password(password)
    except OSError as exc:
        print(f"shoal users passwd: {exc}", file=sys.stderr)
        return 1
    except InvalidParam as exc:
        print(f"shoal users passwd: {exc.message}", file=sys.stderr)
        return 2

    async def passwd(data: AuthData) -> str:
        await data.set_password(args.name, await asyncio.to_thread(hash_password, password))
        return f"changed the password of {args.name!r} in {_where(args)}"

    return _run(args, passwd)


def _delete(args: argparse.Namespace) -> int:
    async def delete(data: AuthData) -> str:
        await data.delete_user(args.name)
        return f"deleted user {args.name!r} from {_where(args)}"

    return _run(args, delete)


def _list(args: argparse.Namespace) -> int:
    async def listing(data: AuthData) -> str:
        return "\n".join("\t".join([name, *data.roles_of(name)]) for name in data.usernames())

    return _run(args, listing)
