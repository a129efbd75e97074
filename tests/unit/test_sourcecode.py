"""Layering rules of the source tree, checked as a test (an ast walk, nothing is imported).

* The domain packages (model, service_layer, distro, health, push, kernels, export, cp) never import
  a transport (``shoal.transport``, ``grpc``, ``aiohttp``, the generated protobuf code) nor the
  composition root: transports depend on the domain, never the other way round.
* The transports do not import the push service or the composition root either: push owns its
  sender protocol, and app.py wires the SDK server in as that sender.
* The offline analytics import nothing of the server but the leaf kernels and the snapshot
  reader, so they run on any machine that has the snapshots.

Every import counts, including those inside functions and ``TYPE_CHECKING`` blocks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import shoal

SRC = Path(shoal.__file__).resolve().parent

DOMAIN = ("model", "service_layer", "distro", "health", "push", "kernels", "export", "cp")
#: What a domain module must not import (a name or any module below it).
DOMAIN_FORBIDDEN = ("shoal.transport", "shoal.app", "shoal.__main__", "grpc", "aiohttp", "multidict",
                    "google.protobuf")
#: Narrow, named exceptions: the Payload codec kernel's pure-Python twin *is* protobuf's own parser
#: (the spec the Cython kernel is tested against), so it may import protobuf — still no transport.
#: The etcd client of the CP store speaks etcd's JSON gateway over aiohttp: an outbound client of an
#: external store, not a Shoal transport — it may import aiohttp, still no transport.
DOMAIN_ALLOWED = {"kernels.payload_py": ("google.protobuf",), "cp.etcd": ("aiohttp",)}
#: What a transport module must not import.
TRANSPORT_FORBIDDEN = ("shoal.push", "shoal.app", "shoal.__main__")
#: The only parts of ``shoal`` the analytics may import.
ANALYTICS_ALLOWED = ("shoal.analytics", "shoal.kernels", "shoal.export.reader", "shoal.export.schema")


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


def layering_violations(root: Path) -> list[Violation]:
    """Walk the package at ``root`` (a directory named like the top package) and list every
    import that breaks the rules above."""
    top = root.name
    domain = tuple(f"{top}.{d}" for d in DOMAIN)
    forbidden = tuple(f"{top}{f[len('shoal'):]}" if f.startswith("shoal.") else f for f in DOMAIN_FORBIDDEN)
    transport = f"{top}.transport"
    transport_forbidden = tuple(f"{top}{f[len('shoal'):]}" for f in TRANSPORT_FORBIDDEN)
    analytics = f"{top}.analytics"
    allowed = tuple(f"{top}{a[len('shoal'):]}" for a in ANALYTICS_ALLOWED)
    found: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_domain, is_analytics = _under(module, domain), _under(module, (analytics,))
        is_transport = _under(module, (transport,))
        if not (is_domain or is_analytics or is_transport):
            continue
        seen: set[tuple[int, str]] = set()
        exempt = DOMAIN_ALLOWED.get(module.partition(".")[2], ())
        for line, name in _imports(module, path.name == "__init__.py", tree):
            if (line, name) in seen:
                continue
            seen.add((line, name))
            domain_breach = is_domain and _under(name, forbidden) and not _under(name, exempt)
            if domain_breach or (is_transport and _under(name, transport_forbidden)):
                found.append(Violation(module, line, name))
            elif is_analytics and _under(name, (top,)) and name != top and not _under(name, allowed):
                # ``from shoal import x`` yields both "shoal" and "shoal.x": judge the latter
                found.append(Violation(module, line, name))
    return found


def test_layers_point_one_way() -> None:
    violations = layering_violations(SRC)
    assert not violations, "layering broken:\n" + "\n".join(map(str, violations))


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
    }
