"""The selector modules bind the compiled kernels, or the twins under SHOAL_NO_EXTENSIONS=1."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shoal
from shoal import kernels
from shoal.kernels import KERNELS, NO_EXTENSIONS

API: dict[str, tuple[str, ...]] = {
    "expiry": ("idle_slots", "beat_deadlines"),
    "ownership": ("java_hash", "distro_hash", "owner_indices", "moved_keys"),
    "verify": ("fnv1a64", "splitmix64", "bucket_of", "bucket_digests", "diff_sorted", "salted32", "sub_keys"),
    "syncser": ("encode_batch", "decode_batch", "split_batch"),
    "payload": ("decode", "encode"),
}


def test_api_table_covers_every_kernel() -> None:
    assert set(API) == set(KERNELS)


@pytest.mark.parametrize("name", sorted(API))
def test_selector_exports_the_twins_api(name: str) -> None:
    twin = importlib.import_module(f"shoal.kernels.{name}_py")
    selector = importlib.import_module(f"shoal.kernels.{name}")
    functions = {n for n in twin.__all__ if callable(getattr(twin, n)) and not isinstance(getattr(twin, n), type)}
    functions -= {"ClientRecord", "InstanceRecord", "ServiceTuple", "SplitRecord"}
    assert functions == set(API[name])
    assert set(selector.__all__) == set(twin.__all__)
    for function in API[name]:
        assert callable(getattr(selector, function))


@pytest.mark.parametrize("name", sorted(API))
def test_stub_declares_the_api(name: str) -> None:
    stub = Path(shoal.__file__).parent / "_ext" / f"{name}.pyi"
    tree = ast.parse(stub.read_text())
    declared = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert declared == set(API[name])


@pytest.mark.c_extension
@pytest.mark.skipif(NO_EXTENSIONS, reason="compiled kernels disabled by SHOAL_NO_EXTENSIONS")
@pytest.mark.parametrize("name", sorted(API))
def test_selector_binds_compiled_functions(name: str) -> None:
    compiled = importlib.import_module(f"shoal._ext.{name}")
    selector = importlib.import_module(f"shoal.kernels.{name}")
    assert compiled.__file__ is not None and not compiled.__file__.endswith(".py")
    for function in API[name]:
        assert getattr(selector, function) is getattr(compiled, function)
    assert kernels.implementation()[name] == "cython"


@pytest.mark.skipif(not NO_EXTENSIONS, reason="only meaningful with SHOAL_NO_EXTENSIONS set")
@pytest.mark.parametrize("name", sorted(API))
def test_selector_binds_twins_in_this_process(name: str) -> None:
    twin = importlib.import_module(f"shoal.kernels.{name}_py")
    selector = importlib.import_module(f"shoal.kernels.{name}")
    for function in API[name]:
        assert getattr(selector, function) is getattr(twin, function)
    assert kernels.implementation()[name] == "python"


_CHILD = """
import importlib, json, sys
import shoal.kernels as kernels
api = json.loads(sys.argv[1])
bound = {}
for name, functions in api.items():
    selector = importlib.import_module(f"shoal.kernels.{name}")
    twin = importlib.import_module(f"shoal.kernels.{name}_py")
    bound[name] = all(getattr(selector, f) is getattr(twin, f) for f in functions)
print(json.dumps({"bound_to_twin": bound, "implementation": kernels.implementation(),
                  "no_extensions": kernels.NO_EXTENSIONS}))
"""


def test_env_var_binds_the_twins() -> None:
    env = dict(os.environ, SHOAL_NO_EXTENSIONS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(API)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["no_extensions"] is True
    assert result["bound_to_twin"] == dict.fromkeys(API, True)
    assert result["implementation"] == dict.fromkeys(KERNELS, "python")
