"""The composition root builds the node in phases without changing a component after it is built,
and HTTP routes are declared one way (each route module's ``routes()``, installed by the node)."""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from pathlib import Path

import shoal
from shoal.app import Node
from shoal.config import Config
from shoal.transport.http.routes import Route

ROOT = Path(shoal.__file__).parent


def _app_functions() -> list[ast.FunctionDef]:
    tree = ast.parse((ROOT / "app.py").read_text(encoding="utf-8"))
    builders = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("build_")]
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Node")
    init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return [*builders, init]


def test_the_node_assigns_only_its_own_names_while_building() -> None:
    """``x.y = …`` on anything but ``self`` (``http.forwarder.fallback = …``, ``fuzzy.notify = …``)
    would change a component after it was built: every part gets what it needs at construction."""
    patched = []
    for function in _app_functions():
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign | ast.AnnAssign) else []
            for target in targets:
                for part in ast.walk(target):
                    if (isinstance(part, ast.Attribute) and not (isinstance(part.value, ast.Name)
                                                                 and part.value.id == "self")):
                        patched.append(f"{function.name}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and (node.func.attr.startswith("set_") or node.func.attr in ("update", "append"))
                    and isinstance(node.func.value, ast.Attribute)):
                patched.append(f"{function.name}:{node.lineno} {node.func.attr}")
    assert patched == []


def test_routes_are_added_only_through_the_http_server_install() -> None:
    adders = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_route":
                adders.add(path.relative_to(ROOT).as_posix())
    assert adders == {"transport/http/server.py"}  # HttpServer._route, behind install()
    for path in (ROOT / "transport" / "http").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Routes"):
                methods = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
                assert "routes" in methods, f"{path.name}: {node.name} has no routes()"
                assert not methods & {"register", "install"}, f"{path.name}: {node.name} registers itself"


def test_a_built_node_serves_each_method_and_path_once(tmp_path: Path) -> None:
    config = dataclasses.replace(Config(), data_dir=str(tmp_path), prometheus_sd_enabled=True).validate()
    node = Node(config)
    table: list[Route] = node._routes()
    counts = Counter((r.method, r.path) for r in table)
    assert [key for key, n in counts.items() if n > 1] == []
    served = [(r.method, r.resource.canonical) for r in node.http.app.router.routes() if r.resource is not None]
    assert len(served) == len(table)  # everything the router serves came from the node's one table
    assert ("GET", "/nacos/v1/ns/operator/switches") in served and ("GET", "/nacos/prometheus") in served
