"""The transports never choose between the AP and the CP path: the service layer's instance and
service façades (``service_layer/instances.py``, ``services.py``) do, on ``ephemeral``, as Nacos's
ClientOperationServiceProxy. Checked by an ast walk over ``shoal/transport`` (nothing is imported):
no transport module names ``PersistentNaming`` or reaches an attribute called ``persistent``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import shoal

TRANSPORT = Path(shoal.__file__).resolve().parent / "transport"


def _references(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "persistent":
            found.append(f"{path.name}:{node.lineno} .persistent")
        elif isinstance(node, ast.Name) and node.id == "PersistentNaming":
            found.append(f"{path.name}:{node.lineno} PersistentNaming")
        elif isinstance(node, ast.ImportFrom) and any(a.name == "PersistentNaming" for a in node.names):
            found.append(f"{path.name}:{node.lineno} import PersistentNaming")
    return found


def test_the_transports_reach_the_cp_use_cases_only_through_the_facades() -> None:
    modules = sorted(TRANSPORT.rglob("*.py"))
    assert len(modules) > 10  # the walk sees the transports
    offenders = [ref for path in modules for ref in _references(path)]
    assert offenders == []


def test_the_rule_sees_a_transport_that_picks_the_path_itself(tmp_path: Path) -> None:
    picked = tmp_path / "picks.py"
    picked.write_text("from shoal.service_layer.persistent import PersistentNaming\n"
                      "async def handler(self, p):\n"
                      "    await self.persistent.register(p.service, p.instance)\n", encoding="utf-8")
    assert _references(picked) == ["picks.py:1 import PersistentNaming", "picks.py:3 .persistent"]
