"""``shoal users ...``: scripted set-up of the auth user store in a data dir (no server needed).

    shoal users create NAME --password-file FILE --data-dir DIR [--admin] [--role ROLE ...]

The password is the file's first line (``-`` reads standard input), so it never appears in a
process list or shell history. A running node picks the change up at the next login.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from shoal.auth.store import UserStore, hash_password, validate_password, validate_role, validate_username
from shoal.errors import InvalidParam


def register(sub: Any) -> None:
    users = sub.add_parser("users", help="manage auth users of a data dir",
                           description="Manage the users of the auth store in a data dir (offline).")
    actions = users.add_subparsers(dest="users_command", metavar="ACTION")
    actions.required = True
    create = actions.add_parser("create", help="create a user (bcrypt-hashed password)",
                                description="Create a user in <data-dir>/auth/users.json.")
    create.add_argument("name", help="user name")
    create.add_argument("--password-file", required=True, metavar="FILE",
                        help="file whose first line is the password ('-' = standard input)")
    create.add_argument("--data-dir", default="./.data", help="the node's data dir (default ./.data)")
    create.add_argument("--admin", action="store_true", help="grant the global admin role (ROLE_ADMIN)")
    create.add_argument("--role", action="append", default=[], help="bind a role to the user; repeatable")
    create.set_defaults(func=_create)


def _read_password(source: str) -> str:
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    return text.splitlines()[0] if text.splitlines() else ""


def _create(args: argparse.Namespace) -> int:
    try:
        password = _read_password(args.password_file)
        validate_username(args.name, "NAME")
        validate_password(password)
        for role in args.role:
            validate_role(role)
        store = UserStore.in_dir(Path(args.data_dir) / "auth")
        store.load()
        store.add_user(args.name, hash_password(password))
        if args.admin:
            store.grant_admin(args.name)
        for role in args.role:
            store.add_role(role, args.name)
        store.save()
    except InvalidParam as exc:
        print(f"shoal users create: {exc.message}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"shoal users create: {exc}", file=sys.stderr)
        return 1
    roles = (["ROLE_ADMIN"] if args.admin else []) + list(args.role)
    print(f"created user {args.name!r}{' with roles ' + ', '.join(roles) if roles else ''} in {store.path}")
    return 0
