"""The cost of the instance history log (issue 23 item 5): server CPU per op with
``shoal.history.enabled`` true and false, at the native generator's register/deregister rate,
and the push latency with and without it.

For each round and each mode (interleaved: off, on, off, on, ...) a fresh node is started with
the mode's setting; ``bench/load/run.py --addr`` drives it: the native generator's register and
deregister phases, then (round 1 only) the Python generator's push phase. The history log
writes its rows off the loop every ``shoal.history.flush-interval-ms`` (500 ms), so part of
its cost lands after a phase ends: next to run.py's per-phase figures this script reports an
*inclusive* figure, register + deregister ops over the server CPU from before the run to one
second after it (two flush intervals: the queue is written by then). Medians over the rounds,
with the load average before and after; one JSON document on stdout (and ``--out``).

Run it alone on the box: ``flock /tmp/shoal-heavy.lock python bench/load/history_cost.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shoal.export.history_files import directory_bytes
from shoal.testing import OPEN, ServerProcess, kill, start_server

HERE = Path(__file__).resolve().parent
MODES = ("off", "on")
#: After run.py returns: two flush intervals, so the queued rows are written and counted.
DRAIN_S = 1.0


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def run_py(server: ServerProcess, out: Path, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "run.py"), "--addr", f"127.0.0.1:{server.grpc_port}",
           "--server-pid", str(server.pid), "--out", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"run.py failed ({done.returncode}): {done.stderr[-2000:]}")
    phases: dict[str, Any] = json.loads(out.read_text())["phases"]
    return phases


def one_round(root: Path, mode: str, a: argparse.Namespace, push: bool) -> dict[str, Any]:
    server = start_server(root, ["--log-level", "warning", "-D", f"shoal.history.enabled={mode == 'on'}"],
                          auth=OPEN)
    try:
        cpu_before = server.cpu_s() or 0.0
        rates = run_py(server, root / f"rates-{mode}.json", "--generator", "native", "--phases",
                       "register,deregister", "--ops", str(a.ops), "--workers", str(a.workers))["rates"]
        time.sleep(DRAIN_S)
        cpu_after = server.cpu_s() or 0.0
        ops = rates["register"]["ops"] + rates["deregister"]["ops"]
        row: dict[str, Any] = {
            "mode": mode,
            "register_ops_per_server_cpu_s": rates["register"]["ops_per_server_cpu_s"],
            "deregister_ops_per_server_cpu_s": rates["deregister"]["ops_per_server_cpu_s"],
            "register_ops_per_s": rates["register"]["ops_per_s"],
            "inclusive_ops_per_server_cpu_s": round(ops / max(cpu_after - cpu_before, 1e-9), 1),
            "history_bytes": directory_bytes(server.data_dir / "history"),
        }
        if push:
            got = run_py(server, root / f"push-{mode}.json", "--phases", "push", "--push-changes",
                         str(a.push_changes), "--push-rate", str(a.push_rate))["push"]
            row["push_latency_ms"] = got.get("push_latency_ms")
            row["pushes_per_s"] = got.get("pushes_per_s")
            row["server_cpu_s_per_1000_pushes"] = got.get("server_cpu_s_per_1000_pushes")
        return row
    finally:
        kill(server)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds per mode (default 3)")
    p.add_argument("--ops", type=int, default=100_000, help="register ops per round (default 100000)")
    p.add_argument("--workers", type=int, default=1, help="native generator processes (default 1)")
    p.add_argument("--push-changes", type=int, default=1000, help="push phase changes (default 1000)")
    p.add_argument("--push-rate", type=float, default=200.0, help="push phase changes per second (default 200)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    a = p.parse_args()
    started = loadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shoal-history-bench-") as tmp:
        for rnd in range(a.rounds):
            for mode in MODES:
                print(f"round {rnd + 1}/{a.rounds}: history {mode}", file=sys.stderr)
                rows.append(one_round(Path(tmp) / f"r{rnd}-{mode}", mode, a, push=rnd == 0))
    medians: dict[str, dict[str, float]] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        medians[mode] = {k: statistics.median(r[k] for r in mine) for k in (
            "register_ops_per_server_cpu_s", "deregister_ops_per_server_cpu_s", "register_ops_per_s",
            "inclusive_ops_per_server_cpu_s")}
    ratio = {k: round(medians["on"][k] / medians["off"][k], 3) for k in medians["on"]}
    doc = {"tool": "bench/load/history_cost.py", "cpus": os.cpu_count(), "loadavg_at_start": started,
           "loadavg_at_end": loadavg(), "ops": a.ops, "rounds": rows, "medians": medians,
           "on_over_off": ratio}
    text = json.dumps(doc, indent=2)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
