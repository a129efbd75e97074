"""Auth on real nodes: a ``shoal server --auth`` whose data dir already holds an admin ``nacos``
(made by ``shoal users create``, as an operator would), and the v3 auth administration's
user-role-permission steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from shoal.testing.http import call_json
from shoal.testing.procs import SECURE, ServerProcess, free_port_block, start_server

#: The password of the admin ``nacos`` that :func:`start_with_admin` creates.
PASSWORD = "correct horse battery"


def start_with_admin(root: Path, *args: str) -> ServerProcess:
    """``shoal server --auth *args`` under ``root``, with the admin ``nacos`` / :data:`PASSWORD`."""
    port = free_port_block()
    data_dir = root / f"node-{port}"
    data_dir.mkdir(parents=True)
    (root / "pw").write_text(PASSWORD + "\n")
    done = subprocess.run([sys.executable, "-m", "shoal", "users", "create", "nacos", "--password-file",
                           str(root / "pw"), "--data-dir", str(data_dir), "--admin"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return start_server(root, ["--auth", *args], port=port, auth=SECURE)


def ok(body: Any) -> Any:
    """The ``data`` of a 3.x ``Result`` that says success."""
    assert body["code"] == 0 and body["message"] == "success", body
    return body["data"]


def add_user_with_grant(server: ServerProcess, token: dict[str, str], username: str, password: str, role: str,
                        resource: str = "public:*:*", action: str = "rw") -> None:
    """Through the v3 auth administration (as the admin ``token``): a user, a role for it and the
    role's permission on ``resource``, each answered in the Result envelope."""
    assert ok(call_json("POST", server.url("/nacos/v3/auth/user"), token,
                        {"username": username, "password": password})) == "create user ok!"
    assert ok(call_json("POST", server.url("/nacos/v3/auth/role"), token,
                        {"role": role, "username": username})) == "add role ok!"
    assert ok(call_json("POST", server.url("/nacos/v3/auth/permission"), token,
                        {"role": role, "resource": resource, "action": action})) == "add permission ok!"
