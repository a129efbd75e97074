"""Print cython-vs-py speed-ups per benchmark group from a pytest-benchmark JSON file.

    python bench/report_ratios.py bench/results/kernels.json [--stat median] [--fail-below 5]

Each group in bench/kernels holds one "cython" and one "py" run of the same workload; the ratio
is py time / cython time for the chosen statistic. Items/s uses ``extra_info["items"]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _impl(bench: dict[str, Any]) -> str | None:
    params = bench.get("params") or {}
    impl = params.get("impl")
    return impl if impl in ("cython", "py") else None


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _fmt_rate(per_second: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if per_second >= scale:
            return f"{per_second / scale:.1f}{unit}/s"
    return f"{per_second:.0f}/s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", type=Path, help="output of pytest --benchmark-json")
    parser.add_argument("--stat", choices=("min", "median", "mean"), default="median")
    parser.add_argument(
        "--fail-below",
        type=float,
        default=None,
        metavar="RATIO",
        help="exit 1 if any group's speed-up is below RATIO",
    )
    args = parser.parse_args(argv)

    data = json.loads(args.json_file.read_text())
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for bench in data.get("benchmarks", []):
        impl = _impl(bench)
        if impl is not None:
            groups.setdefault(bench.get("group") or bench["name"], {})[impl] = bench

    header = ("group", "cython", "py", "speed-up", "cython items/s")
    rows: list[tuple[str, ...]] = []
    too_slow: list[str] = []
    for group in sorted(groups):
        runs = groups[group]
        ext, py = runs.get("cython"), runs.get("py")
        ext_t = ext["stats"][args.stat] if ext else None
        py_t = py["stats"][args.stat] if py else None
        ratio = py_t / ext_t if ext_t and py_t else None
        items = (ext or py or {}).get("extra_info", {}).get("items")
        rows.append(
            (
                group,
                _fmt_time(ext_t) if ext_t else "-",
                _fmt_time(py_t) if py_t else "-",
                f"{ratio:.1f}x" if ratio else "-",
                _fmt_rate(items / ext_t) if items and ext_t else "-",
            )
        )
        if args.fail_below is not None and (ratio is None or ratio < args.fail_below):
            too_slow.append(group)

    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    print(f"speed-up = py / cython ({args.stat} time per call)")
    for row in (header, tuple("-" * w for w in widths), *rows):
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if too_slow:
        print(f"below {args.fail_below}x: {', '.join(too_slow)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
