"""`python -m build` makes a wheel that carries the compiled kernels: users who
install it need neither Cython nor a compiler. The wheel is built as users build it, through the
sdist, from a copy of the source tree (the tree under test is left untouched)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("build") is None and os.environ.get("CI") != "true",
                    reason="the 'build' package (dev extra) is not installed")
@pytest.mark.timeout(900)
def test_python_m_build_makes_a_wheel_with_compiled_kernels(tmp_path: Path) -> None:
    tree = tmp_path / "src-tree"
    build_artefacts = shutil.ignore_patterns("*.so", "*.c", "__pycache__", "*.egg-info", ".venv", "build", "dist")

    def ignore(directory: str, names: list[str]) -> set[str]:
        # Cython's annotate pages are artefacts of ext/; the console's index.html is package data.
        skipped = set(build_artefacts(directory, names))
        return skipped | {n for n in names if n.endswith(".html")} if Path(directory).name == "ext" else skipped

    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    for name in ("src", "ext"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    out = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "-o", str(out), str(tree)], capture_output=True,
                           text=True, timeout=900, env={k: v for k, v in os.environ.items()
                                                        if k != "SHOAL_NO_EXTENSIONS"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1 and "none-any" not in wheels[0].name  # a platform wheel: compiled code inside
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert {"shoal/py.typed", "shoal/deploy/shoal.service", "shoal/console/static/index.html",
            "shoal/console/static/console.js", "shoal/console/static/console.css"} <= set(names)
    assert not [n for n in names if n.endswith((".pyx", ".c"))]
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheels[0])], check=True, timeout=300)
    probe = subprocess.run(
        [sys.executable, "-c", "import json, shoal, shoal.kernels as k, shoal._ext.h2grpc; "
                               "print(json.dumps([shoal.__file__, k.implementation()]))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "SHOAL_NO_EXTENSIONS"}, "PYTHONPATH": str(site)},
    )
    assert probe.returncode == 0, probe.stderr
    location, kernels = json.loads(probe.stdout)
    assert location.startswith(str(site))
    assert kernels and set(kernels.values()) == {"cython"}
