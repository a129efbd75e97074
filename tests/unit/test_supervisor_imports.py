"""What a node's supervisor imports (issue 21): the ``shoal`` parser for ``server``, the supervisor,
and what its preflight and managed etcd member need, and nothing of the server its workers run."""

from __future__ import annotations

import json
import subprocess
import sys

#: Modules (and their packages) the supervisor must not import: the transports and their libraries,
#: the Arrow export, the registry model and service layer, the composition root, the other subcommands.
SERVER_ONLY = ("grpc", "google.protobuf", "aiohttp", "pyarrow", "pyspark", "bcrypt", "shoal.app", "shoal.model",
               "shoal.service_layer", "shoal.transport", "shoal.export", "shoal.auth", "shoal.analytics",
               "shoal.kernels", "shoal.cp.etcd", "shoal.push", "shoal.status_cli", "shoal.check_cli")

SUPERVISOR_PATH = """
import json, sys
from shoal.__main__ import build_parser
build_parser("server").parse_args(["server", "--workers", "2"])
import shoal.logconfig, uvloop
import shoal.workers.supervisor
from shoal.distro.members import build_members          # its preflight, for a node of a cluster
from shoal.cp.factory import cp_mode, managed_member, worker_cp_overrides  # its managed etcd member
from shoal.cp.embedded import EmbeddedStore              # its standalone store's file
print(json.dumps(sorted(sys.modules)))
"""


def test_the_supervisor_path_imports_nothing_of_the_server() -> None:
    out = subprocess.run([sys.executable, "-c", SUPERVISOR_PATH], check=True, capture_output=True, text=True)
    loaded = json.loads(out.stdout)
    assert "shoal.workers.supervisor" in loaded
    heavy = [m for m in loaded if any(m == name or m.startswith(f"{name}.") for name in SERVER_ONLY)]
    assert heavy == []
