"""Every path docs/architecture.md names exists, so the map of the code cannot drift from the tree.

What counts as a path: a token in backticks or a link target that names a file or folder of the
repository (``src/shoal/...``, ``ext/...``, ``tests/...``, ``bench/...``, ``docs/...``), one under
the package (``model/events.py``, ``transport/grpc/``, ``shoal/console/static``: the page says
its paths are under ``src/shoal/``), or a bare module or document name (``app.py``,
``protocol.md``), which must exist somewhere in the tree. Templates (``ext/<name>.pyx``,
``transport/{grpc,http}``), URLs and routes (``/nacos/...``) are not paths.
"""

from __future__ import annotations

import re
from pathlib import Path

import shoal

REPO = Path(shoal.__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "shoal"
DOC = REPO / "docs" / "architecture.md"
ROOTS = ("src/", "ext/", "tests/", "bench/", "docs/", "ci/")
SEARCHED = ("src", "ext", "tests", "bench", "docs", "ci")

_BACKTICKED = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_FILE_SUFFIXES = (".py", ".pyx", ".pxd", ".pyi", ".md", ".sh", ".json", ".service")


def _candidate(token: str) -> str | None:
    """The path ``token`` names, or None when it is not one."""
    token = token.strip().rstrip(".,;:")
    token = re.sub(r"\s*\(.*$", "", token)  # ``Node`` and ``app.py (Node)`` forms: keep the path
    if not token or " " in token or token.startswith(("/", "-", "http:", "https:", "$")):
        return None
    if token.startswith(".") and not token.startswith(("./", "../")):  # ``.pyi``: a suffix, not a file
        return None
    if any(c in token for c in "<>{}*?=|"):
        return None
    if token.startswith(ROOTS) or token.startswith("shoal/"):
        return token
    if "/" in token and re.fullmatch(r"[\w./-]+", token):
        return token if token.endswith("/") or token.endswith(_FILE_SUFFIXES) else None
    return token if re.fullmatch(r"[\w.-]+", token) and token.endswith(_FILE_SUFFIXES) else None


def named_paths(text: str) -> set[str]:
    """Every path ``text`` (a Markdown page) names, as written."""
    found = {c for m in _BACKTICKED.finditer(text) if (c := _candidate(m.group(1)))}
    found |= {c for m in _LINK.finditer(text) if (c := _candidate(m.group(1)))}
    return found


def exists(path: str, doc: Path = DOC, repo: Path = REPO) -> bool:
    """Whether ``path``, as named in ``doc``, exists in the tree at ``repo``."""
    package = repo / "src" / "shoal"
    if path.startswith(ROOTS):
        return (repo / path).exists()
    if path.startswith("shoal/"):
        return (repo / "src" / path).exists()
    if (package / path).exists() or (doc.parent / path).exists() or (repo / path).exists():
        return True  # under the package (the page's convention), beside the page (a link), at the top
    name = path.rstrip("/")
    if "/" in name:
        return False
    # a bare name (``app.py``, ``clients/``, said in the row of its package): somewhere in the tree
    return any(found.is_dir() or not path.endswith("/") for top in SEARCHED if (repo / top).is_dir()
               for found in (repo / top).rglob(name))


def test_every_path_architecture_md_names_exists() -> None:
    paths = named_paths(DOC.read_text(encoding="utf-8"))
    assert len(paths) > 50, sorted(paths)  # the page is a map: it names many paths, and they are found
    missing = sorted(p for p in paths if not exists(p))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_path_finder_reads_paths_and_skips_what_is_not_one(tmp_path: Path) -> None:
    text = ("`src/shoal/app.py`, `model/events.py` (`EventBus`), `transport/grpc/`, `ext/<name>.pyx`, "
            "`kernels/<name>_py.py`, `/nacos/v1/ns/instance`, `make test`, `shoal.remote.transport`, "
            "`app.py`, [protocol](protocol.md), [README](../README.md#tls), `tests/unit/gone.py`, "
            "`transport/{grpc,http}`, `SHOAL_NO_EXTENSIONS=1`, `Node`, `x.py (Node)`, `.pyi`, `clients/`")
    assert named_paths(text) == {"src/shoal/app.py", "model/events.py", "transport/grpc/", "app.py",
                                 "protocol.md", "../README.md", "tests/unit/gone.py", "x.py", "clients/"}
    repo = tmp_path
    (repo / "src" / "shoal" / "model").mkdir(parents=True)
    (repo / "src" / "shoal" / "model" / "events.py").write_text("")
    (repo / "docs").mkdir()
    (repo / "docs" / "protocol.md").write_text("")
    (repo / "tests" / "unit").mkdir(parents=True)
    (repo / "tests" / "unit" / "test_x.py").write_text("")
    doc = repo / "docs" / "architecture.md"
    assert exists("model/events.py", doc, repo) and exists("protocol.md", doc, repo)
    assert exists("test_x.py", doc, repo) and exists("unit/", doc, repo)  # bare names found anywhere
    assert not exists("tests/unit/gone.py", doc, repo) and not exists("model/gone.py", doc, repo)
    assert not exists("gone.py", doc, repo) and not exists("test_x.py/", doc, repo)
