"""The pure parts of a multi-worker node: placement, the worker count, port picking, back-off,
what a worker changes in its settings, and the log label."""

from __future__ import annotations

import itertools
import logging
import random
from pathlib import Path

import pytest

from shoal.config import AUTO_WORKERS_CAP, Config, usable_cores
from shoal.config_sources import OTHER_SHOAL_VARIABLES
from shoal.errors import ConfigError
from shoal.logconfig import WORKER_TEXT_FORMAT, _formatter, _WorkerLabel
from shoal.workers import placement as placement_module
from shoal.workers.placement import WorkerPlacement
from shoal.workers.supervisor import (
    BACKOFF_MAX_S,
    BACKOFF_RESET_S,
    BACKOFF_START_S,
    Backoff,
    WorkerSlot,
    describe_exit,
    pick_private_ports,
    public_ports,
    state_json,
)
from shoal.workers.worker import worker_config, worker_ip


# --- placement -----------------------------------------------------------------------------------
def test_placement_round_trips_through_the_environment() -> None:
    placement = WorkerPlacement(1, (20001, 20011, 20021), 4242)
    assert WorkerPlacement.from_env(placement.to_env()) == placement
    assert placement.private_port == 20011 and placement.siblings() == (20001, 20021) and placement.count == 3
    assert WorkerPlacement.from_env({}) is None


@pytest.mark.parametrize("env", [{placement_module.INDEX_ENV: "x", placement_module.PORTS_ENV: "1"},
                                 {placement_module.INDEX_ENV: "2", placement_module.PORTS_ENV: "1,2"},
                                 {placement_module.INDEX_ENV: "0", placement_module.PORTS_ENV: "5,5"},
                                 {placement_module.INDEX_ENV: "0", placement_module.PORTS_ENV: "70000"}])
def test_a_bad_placement_is_a_config_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        WorkerPlacement.from_env(env)


def test_the_placement_variables_are_not_taken_for_settings_or_typos() -> None:
    for var in (placement_module.INDEX_ENV, placement_module.PORTS_ENV, placement_module.SUPERVISOR_ENV):
        assert var in OTHER_SHOAL_VARIABLES
    env = {**WorkerPlacement(0, (20001,), 1).to_env(), "SHOAL_SERVER_WORKERS": "3"}
    assert Config.load(env=env).server_workers == 3


# --- the worker count ----------------------------------------------------------------------------
def test_auto_is_the_usable_cores_capped() -> None:
    import os

    cores = usable_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert Config().workers == Config(server_workers=0).workers == max(1, min(cores, AUTO_WORKERS_CAP))
    assert Config(server_workers=1).workers == 1 and Config(server_workers=12).workers == 12


def test_a_containers_cpu_quota_bounds_the_usable_cores(tmp_path: Path) -> None:
    import os

    affinity = len(os.sched_getaffinity(0))
    cpu_max, quota, period = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    none = (tmp_path / "absent-quota", tmp_path / "absent-period")
    cpu_max.write_text("100000 100000\n")  # --cpus 1
    assert usable_cores(cpu_max, none) == 1
    cpu_max.write_text("150000 100000\n")  # --cpus 1.5: rounded up
    assert usable_cores(cpu_max, none) == min(2, affinity)
    cpu_max.write_text("max 100000\n")  # no quota: the affinity decides
    assert usable_cores(cpu_max, none) == affinity
    quota.write_text("50000\n")  # cgroup v1, read when v2 has no file
    period.write_text("100000\n")
    assert usable_cores(tmp_path / "absent", (quota, period)) == 1
    quota.write_text("-1\n")  # v1's "no quota"
    assert usable_cores(tmp_path / "absent", (quota, period)) == affinity


@pytest.mark.parametrize("value", ["-1", "257", "two"])
def test_a_bad_worker_count_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"shoal\.server\.workers"):
        Config.load(overrides={"shoal.server.workers": value})


# --- port picking ----------------------------------------------------------------------------------
def test_picked_ports_and_their_cluster_ports_are_free_distinct_and_not_the_nodes() -> None:
    busy = {2000 + i for i in range(0, 3000, 3)}
    reserved = {8848, 9848, 9849, 7848, 7849}
    ports = pick_private_ports(6, 1001, reserved, lambda p: p not in busy, random.Random(7), low=1024, high=9000)
    pairs = [p for port in ports for p in (port, port + 1001)]
    assert len(ports) == 6 and len(set(pairs)) == 12
    assert not set(pairs) & (busy | reserved)
    assert all(1024 <= p <= 9000 for p in pairs)


def test_no_room_for_ports_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="worker port"):
        pick_private_ports(2, 1001, (), lambda p: False, random.Random(1), low=1024, high=4000)
    with pytest.raises(ConfigError, match="no room"):
        pick_private_ports(2, 1001, (), lambda p: True, random.Random(1), low=1024, high=2030)


def test_public_ports_are_the_nodes_shared_and_etcd_ports() -> None:
    assert set(public_ports(Config(port=8848))) == {8848, 9848, 9849, 7848, 7849}


# --- back-off ----------------------------------------------------------------------------------------
def test_backoff_doubles_to_its_cap_and_resets_after_a_long_life() -> None:
    backoff = Backoff()
    delays = [backoff.delay(1.0) for _ in range(8)]
    assert delays[0] == BACKOFF_START_S and delays[1] == 2 * BACKOFF_START_S
    assert max(delays) == BACKOFF_MAX_S and delays[-1] == BACKOFF_MAX_S
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert backoff.delay(BACKOFF_RESET_S) == BACKOFF_START_S
    assert backoff.delay(0.1) == 2 * BACKOFF_START_S


def test_state_and_exit_descriptions() -> None:
    slots = [WorkerSlot(0, 20001, restarts=2, pid=11), WorkerSlot(1, 20011)]
    state = state_json(10, Config(port=8848), slots)
    assert state["supervisor"] == 10 and state["port"] == 8848
    assert [(w["index"], w["pid"], w["port"], w["restarts"]) for w in state["workers"]] == [
        (0, 11, 20001, 2), (1, 0, 20011, 0)]
    assert describe_exit(-9) == "signal SIGKILL" and describe_exit(3) == "exit code 3"


# --- a worker's own settings ---------------------------------------------------------------------------
def test_a_worker_writes_its_own_files_and_mints_its_own_ids() -> None:
    config = Config(data_dir="/d", log_file="/l/shoal.log", export_dir="/e", snowflake_worker_id=1023)
    first, second = (worker_config(config, WorkerPlacement(i, (20001, 20011))) for i in (0, 1))
    assert first.log_file == "/l/shoal.worker0.log" and second.log_file == "/l/shoal.worker1.log"
    assert first.export_dir == "/e/worker-0" and second.export_dir == "/e/worker-1"
    assert first.access_log_file == "/d/workers/0/logs/access_log.log"
    assert (first.snowflake_worker_id, second.snowflake_worker_id) == (1023, 0)
    assert worker_config(Config(access_log_file="-"), WorkerPlacement(0, (1,))).access_log_file == "-"
    assert first.data_dir == "/d"  # the CP store's file stays the node's


def test_workers_reach_each_other_on_the_bound_address_or_loopback() -> None:
    assert worker_ip(Config(host="0.0.0.0")) == "127.0.0.1"
    assert worker_ip(Config(host="10.1.2.3")) == "10.1.2.3"


# --- logs ----------------------------------------------------------------------------------------------
def test_every_line_names_its_worker_in_text_and_json() -> None:
    record = logging.LogRecord("shoal.x", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    _WorkerLabel("1").filter(record)
    text = _formatter(Config(), "1").format(record)
    assert "[1] shoal.x: hello there" in text and WORKER_TEXT_FORMAT.startswith("%(asctime)s")
    assert '"worker":"1"' in _formatter(Config(log_format="json"), "1").format(record)
    unlabelled = logging.LogRecord("shoal.log", logging.WARNING, __file__, 1, "note", (), None)
    assert "[supervisor]" in _formatter(Config(), "supervisor").format(unlabelled)


# --- the CP store of a managed-etcd node with workers -----------------------------------------------
def test_workers_of_a_managed_etcd_node_are_clients_of_the_supervisors_member() -> None:
    from shoal.cp.factory import managed_member, worker_cp_overrides

    members = [("127.0.0.1", 8848), ("127.0.0.2", 8848)]
    etcd, tls = managed_member(Config(data_dir="/d"), members, "127.0.0.2:8848")
    args = worker_cp_overrides(etcd, tls)
    overrides = dict(item.split("=", 1) for item in args[1::2])
    assert args[::2] == ["-D"] * len(overrides)
    assert overrides["shoal.cp.mode"] == "etcd"
    assert overrides["shoal.cp.endpoints"].split(",") == ["http://127.0.0.2:7848", "http://127.0.0.1:7848"]
    assert Config.load(overrides=overrides).cp_endpoints == overrides["shoal.cp.endpoints"]
