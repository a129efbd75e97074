"""Builds the Cython kernels in ext/ as shoal._ext.<name>; metadata lives in pyproject.toml.

SHOAL_NO_EXTENSIONS=1 skips the build (the pure-Python twins in shoal.kernels are then used);
SHOAL_CYTHON_ANNOTATE=1 writes Cython's HTML annotation next to each .pyx.
"""

import os
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
_NGHTTP2_USERS = ("h2grpc", "h2client")


def _ext_modules() -> list:
    if os.environ.get("SHOAL_NO_EXTENSIONS", "") not in ("", "0"):
        print("shoal: SHOAL_NO_EXTENSIONS is set, building pure Python only")
        return []
    from setuptools import Extension

    sources = sorted((ROOT / "ext").glob("*.pyx"))
    # An sdist carries the generated C (ext/*.c) but not the .pyx: the wheel built from it (what
    # `python -m build` does) compiles that C, so it needs neither Cython nor the Cython sources.
    from_c = not sources
    if from_c:
        sources = sorted((ROOT / "ext").glob("*.c"))
    # h2grpc and h2client (the native gRPC transport, server and client sessions) alone link libnghttp2.
    modules = [
        Extension(f"shoal._ext.{src.stem}", [str(src.relative_to(ROOT))], extra_compile_args=["-O3"],
                  libraries=["nghttp2"] if src.stem in _NGHTTP2_USERS else [])
        for src in sources
    ]
    print(f"shoal: building {len(modules)} kernels from {'C' if from_c else 'Cython'}: "
          f"{', '.join(s.stem for s in sources)}")
    if from_c:
        return modules
    from Cython.Build import cythonize

    return cythonize(
        modules,
        include_path=["ext"],
        language_level=3,
        annotate=os.environ.get("SHOAL_CYTHON_ANNOTATE") == "1",
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )


setup(ext_modules=_ext_modules())
