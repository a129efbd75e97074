"""bench/load's multi-worker runs with tiny counts against real one-worker nodes: the scaling run
(scaling.py, with --memory) and the push fan-out (push_fanout.py) complete and write JSON whose
figures match the load they were given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, out: Path, *args: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "load" / script), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert report == json.loads(proc.stdout)  # the same document on stdout and in --out
    assert "error" not in report
    return report


def test_scaling_run_with_memory(tmp_path: Path) -> None:
    report = run_bench("scaling.py", tmp_path / "workers.json", "--workers", "1", "--repeat", "1",
                       "--services", "10", "--instances", "5", "--connections", "5", "--query-ops", "500",
                       "--memory", "--memory-services", "20", "--memory-instances", "5")
    (node,) = report["rounds"]
    assert node["workers"] == 1
    rates = node["rates"]
    assert rates["verify_before_query"]["hosts"] == 50
    assert rates["register"]["replicated"]["all_hold"]  # the node's ipCount gauge reads every instance
    assert [p["worker"] for p in node["processes_idle"]] == [None]  # one process, no supervisor and workers
    row = report["summary"]["table"]["1"]
    assert (row["register"]["ops"], row["query"]["ops"], row["deregister"]["ops"]) == (50, 500, 50)
    assert all(row[p]["errors"] == {} and row[p]["ops_per_s"] > 0 for p in row)
    assert len(row["query"]["rss_bytes_per_process"]) == 1  # one process: the node itself
    assert report["summary"]["ratios"] == {}  # nothing to compare one worker count with
    (memory,) = report["memory"]
    assert memory["instances"] == 100 and memory["register"]["ops"] == 100
    assert memory["rss_bytes_loaded_total"] >= memory["rss_bytes_idle_total"] > 0
    assert report["host"]["loadavg_at_start"] and report["host"]["loadavg_at_end"]


def test_push_fanout(tmp_path: Path) -> None:
    report = run_bench("push_fanout.py", tmp_path / "fanout.json", "--workers", "1", "--subscribers", "20",
                       "--procs", "2", "--changes", "5", "--warmup", "1", "--gap-ms", "0")
    (node,) = report["rounds"]
    assert node["connections"]["subscribed"] == node["subscribers"] == 20
    assert node["missed_acks"] == 0
    assert node["change_to_last_ack_ms"]["samples"] == 5 and node["change_to_each_ack_ms"]["samples"] == 100
    assert node["change_to_last_ack_ms"]["max"] >= node["change_to_each_ack_ms"]["p50"] > 0
    assert node["pushes_read"] >= 100
    (server_side,) = node["server_push_ack_by_http_port"].values()  # one process: the node's own port
    assert server_side["acks"] >= 100 and server_side["mean_ms"] > 0
