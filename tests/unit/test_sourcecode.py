"""Layering rules of the source tree, checked as a test (an ast walk, nothing is imported).

* The domain packages (model, service_layer, distro, health, push, kernels, export, cp, auth) never
  import a transport (``shoal.transport``, ``grpc``, ``aiohttp``, the generated protobuf code) nor
  the composition root: transports depend on the domain, never the other way round.
* The domain has an order, ``kernels < model < cp < service_layer < health, push, distro, export``:
  a package imports only packages below it (its own included), never one above it nor one beside
  it (health, push, distro and export know nothing of each other).
* The cross-cutting modules (config, errors, logs, clock, tasks, metrics, TLS files, child
  processes, JSON, the collector policy) never import a transport: every layer may use them.
* The transports do not import the push service or the composition root either: push owns its
  sender protocol, and app.py wires the SDK server in as that sender. The HTTP transport does not
  import the gRPC one (what both need, such as the transport choice, lives in ``shoal.transport``).
* The offline analytics import nothing of the server but the leaf kernels, the snapshot
  reader and the history rows, so they run on any machine that has the snapshots or logs.
* Only ``shoal.testing`` imports ``shoal.testing``: the server never runs test support.
* ``bench/`` never imports ``tests/``: what both need lives in ``shoal.testing``.

Every import counts, including those inside functions and ``TYPE_CHECKING`` blocks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import shoal

SRC = Path(shoal.__file__).resolve().parent
REPO = SRC.parent.parent
BENCH = REPO / "bench"
TESTS = REPO / "tests"

DOMAIN = ("model", "service_layer", "distro", "health", "push", "kernels", "export", "cp", "auth")
#: The order of the domain: a package may import only packages of a lower rank (and itself).
RANK = {"kernels": 0, "model": 1, "cp": 2, "service_layer": 3, "health": 4, "push": 4, "distro": 4, "export": 4}
#: Modules every layer may use; they import no transport.
CROSS_CUTTING = ("config", "config_sources", "errors", "logconfig", "logutil", "clock", "tasks", "metrics",
                 "node_metrics", "jsonfast", "tls", "childproc", "gcpolicy")
#: What makes an import a transport's.
TRANSPORTS = ("shoal.transport", "grpc", "aiohttp", "multidict", "google.protobuf")
#: What a domain module must not import (a name or any module below it).
DOMAIN_FORBIDDEN = (*TRANSPORTS, "shoal.app", "shoal.__main__")
#: Narrow, named exceptions: the Payload codec kernel's pure-Python twin *is* protobuf's own parser
#: (the spec the Cython kernel is tested against), so it may import protobuf — still no transport.
#: The etcd client of the CP store speaks etcd's JSON gateway over aiohttp: an outbound client of an
#: external store, not a Shoal transport — it may import aiohttp, still no transport.
DOMAIN_ALLOWED = {"kernels.payload_py": ("google.protobuf",), "cp.etcd": ("aiohttp",)}
#: What a transport module must not import.
TRANSPORT_FORBIDDEN = ("shoal.push", "shoal.app", "shoal.__main__")
#: What a module of the HTTP transport must not import.
HTTP_FORBIDDEN = ("shoal.transport.grpc",)
#: The only parts of ``shoal`` the analytics may import.
ANALYTICS_ALLOWED = ("shoal.analytics", "shoal.kernels", "shoal.export.reader", "shoal.export.schema",
                     "shoal.export.history_rows")


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    imported: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported}"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(module: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # ``from shoal import transport`` imports shoal.transport
                yield node.lineno, f"{target}.{alias.name}"


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _rename(names: tuple[str, ...], top: str) -> tuple[str, ...]:
    """``names`` with the package ``shoal`` renamed ``top`` (the checker's own test uses a copy)."""
    return tuple(f"{top}{n[len('shoal'):]}" if n == "shoal" or n.startswith("shoal.") else n for n in names)


def _rank_of(name: str, top: str) -> str | None:
    """The ranked domain package ``name`` belongs to, if any."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == top and parts[1] in RANK else None


def layering_violations(root: Path) -> list[Violation]:
    """Walk the package at ``root`` (a directory named like the top package) and list every
    import that breaks the rules above."""
    top = root.name
    domain = tuple(f"{top}.{d}" for d in DOMAIN)
    forbidden = _rename(DOMAIN_FORBIDDEN, top)
    transports = _rename(TRANSPORTS, top)
    cross_cutting = tuple(f"{top}.{c}" for c in CROSS_CUTTING)
    transport, http = f"{top}.transport", f"{top}.transport.http"
    transport_forbidden = _rename(TRANSPORT_FORBIDDEN, top)
    http_forbidden = _rename(HTTP_FORBIDDEN, top)
    analytics = f"{top}.analytics"
    allowed = _rename(ANALYTICS_ALLOWED, top)
    testing = f"{top}.testing"
    found: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_domain, is_analytics = _under(module, domain), _under(module, (analytics,))
        is_transport, is_http = _under(module, (transport,)), _under(module, (http,))
        is_cross_cutting, is_testing = _under(module, cross_cutting), _under(module, (testing,))
        rank = _rank_of(module, top)
        seen: set[tuple[int, str]] = set()
        exempt = DOMAIN_ALLOWED.get(module.partition(".")[2], ())
        for line, name in _imports(module, path.name == "__init__.py", tree):
            if (line, name) in seen:
                continue
            seen.add((line, name))
            target = _rank_of(name, top)
            breach = (
                (is_domain and _under(name, forbidden) and not _under(name, exempt))
                or (rank is not None and target is not None and target != rank and RANK[target] >= RANK[rank])
                or (is_cross_cutting and _under(name, transports))
                or (is_transport and _under(name, transport_forbidden))
                or (is_http and _under(name, http_forbidden))
                or (not is_testing and _under(name, (testing,)))
                # ``from shoal import x`` yields both "shoal" and "shoal.x": judge the latter
                or (is_analytics and _under(name, (top,)) and name != top and not _under(name, allowed))
            )
            if breach:
                found.append(Violation(module, line, name))
    return found


def bench_imports_of_tests(bench: Path, tests: Path) -> list[Violation]:
    """Every import of the ``tests`` package by a file under ``bench``, also under the names its
    folders have when ``tests/`` is on the path (``from integration.rawclient import ...``)."""
    names = ("tests", *sorted(p.name for p in tests.iterdir() if p.is_dir() and any(p.rglob("*.py"))))
    found: list[Violation] = []
    for path in sorted(bench.rglob("*.py")):
        module = _module_name(bench, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [Violation(module, line, name) for line, name in _imports(module, path.name == "__init__.py", tree)
                  if _under(name, names)]
    return found


def test_layers_point_one_way() -> None:
    violations = layering_violations(SRC)
    assert not violations, "layering broken:\n" + "\n".join(map(str, violations))


def test_bench_never_imports_the_tests() -> None:
    violations = bench_imports_of_tests(BENCH, TESTS)
    assert not violations, "bench imports tests (move the helper into shoal.testing):\n" + "\n".join(
        map(str, violations))


def test_every_ranked_package_is_a_domain_package_of_the_tree() -> None:
    assert set(RANK) <= set(DOMAIN)
    assert all((SRC / name).is_dir() for name in DOMAIN)
    assert all((SRC / f"{name}.py").is_file() for name in CROSS_CUTTING)


def test_the_checker_catches_violations(tmp_path: Path) -> None:
    root = tmp_path / "shoal"
    files = {
        "__init__.py": "",
        "distro/__init__.py": "",
        "distro/bad.py": "import grpc\nfrom ..transport.grpc import peer_client\n",
        "health/__init__.py": "",
        "health/lazy.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from shoal.transport.http.forward import Forwarder\n"
                           "def f() -> None:\n    import aiohttp\n"),
        "push/__init__.py": "from shoal import transport\n",
        "model/__init__.py": "from shoal.transport.grpc._proto import Payload\n",
        "analytics/__init__.py": "",
        "analytics/job.py": "from shoal.model.client import Client\nfrom shoal.kernels import ownership\n",
        "transport/__init__.py": "from shoal.distro import bad\nimport grpc\n",  # transports may do this
        "transport/grpc/__init__.py": "",
        "transport/grpc/server.py": "from shoal.push.service import PushGone\n",
        "distro/good.py": "from shoal.model import client\nfrom . import good\nimport json\n",
        "model/up.py": "from shoal.service_layer import naming\n",  # below importing above
        "health/side.py": "from shoal.distro import good\n",  # beside: health and distro are one rank
        "health/down.py": "from shoal.service_layer import naming\nfrom shoal.cp import store\nimport shoal.kernels\n",
        "cp/up.py": "from shoal.health import down\n",
        "logconfig.py": "from shoal.transport.http.access_log import ACCESS_LOGGER\n",
        "clock.py": "from shoal.model import keys\n",  # cross-cutting may use the domain, not a transport
        "tasks.py": "def f() -> None:\n    import grpc\n",
        "transport/http/__init__.py": "",
        "transport/http/server.py": ("from shoal.transport.grpc.transports import transport_name\n"
                                     "from shoal.transport.selection import NATIVE\n"),
        "transport/grpc/native.py": "from shoal.transport.selection import NATIVE\n",
        "stack.py": "from shoal.testing import make_registry\n",
        "testing/__init__.py": "from shoal.testing.wait import poll_until\nfrom shoal.transport.grpc import x\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    found = {(v.module, v.line, v.imported) for v in layering_violations(root)}
    assert found == {
        ("shoal.distro.bad", 1, "grpc"),
        ("shoal.distro.bad", 2, "shoal.transport.grpc"),
        ("shoal.distro.bad", 2, "shoal.transport.grpc.peer_client"),
        ("shoal.health.lazy", 3, "shoal.transport.http.forward"),
        ("shoal.health.lazy", 3, "shoal.transport.http.forward.Forwarder"),
        ("shoal.health.lazy", 5, "aiohttp"),
        ("shoal.push", 1, "shoal.transport"),
        ("shoal.model", 1, "shoal.transport.grpc._proto"),
        ("shoal.model", 1, "shoal.transport.grpc._proto.Payload"),
        ("shoal.analytics.job", 1, "shoal.model.client"),
        ("shoal.analytics.job", 1, "shoal.model.client.Client"),
        ("shoal.transport.grpc.server", 1, "shoal.push.service"),
        ("shoal.transport.grpc.server", 1, "shoal.push.service.PushGone"),
        ("shoal.model.up", 1, "shoal.service_layer"),
        ("shoal.model.up", 1, "shoal.service_layer.naming"),
        ("shoal.health.side", 1, "shoal.distro"),
        ("shoal.health.side", 1, "shoal.distro.good"),
        ("shoal.cp.up", 1, "shoal.health"),
        ("shoal.cp.up", 1, "shoal.health.down"),
        ("shoal.logconfig", 1, "shoal.transport.http.access_log"),
        ("shoal.logconfig", 1, "shoal.transport.http.access_log.ACCESS_LOGGER"),
        ("shoal.tasks", 2, "grpc"),
        ("shoal.transport.http.server", 1, "shoal.transport.grpc.transports"),
        ("shoal.transport.http.server", 1, "shoal.transport.grpc.transports.transport_name"),
        ("shoal.stack", 1, "shoal.testing"),
        ("shoal.stack", 1, "shoal.testing.make_registry"),
    }


def test_the_bench_checker_catches_imports_of_tests(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    files = {
        "__init__.py": "",
        "rebalance/__init__.py": "",
        "rebalance/view.py": "from tests.integration.moving import MovingClient\nfrom shoal.testing import moving\n",
        "load/run.py": "def f() -> None:\n    import tests.faults.harness\n",
        "load/raw.py": "from integration.rawclient import RawClient\nimport integrations\n",
    }
    for name, text in files.items():
        path = bench / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    tests = tmp_path / "tests"
    (tests / "integration").mkdir(parents=True)
    (tests / "integration" / "test_x.py").write_text("", encoding="utf-8")
    (tests / "fixtures").mkdir()  # no Python in it: not a name to refuse
    found = {(v.module, v.line, v.imported) for v in bench_imports_of_tests(bench, tests)}
    assert found == {
        ("bench.rebalance.view", 1, "tests.integration.moving"),
        ("bench.rebalance.view", 1, "tests.integration.moving.MovingClient"),
        ("bench.load.run", 2, "tests.faults.harness"),
        ("bench.load.raw", 1, "integration.rawclient"),
        ("bench.load.raw", 1, "integration.rawclient.RawClient"),
    }
