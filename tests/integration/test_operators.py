"""A Nacos operator's deployment moved over: their application.properties, the Docker
image's environment, JSON and rotated logs, the access log, and ``shoal status`` on real nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from shoal.testing import OPEN, ServerSet, call, free_port_block, http_get, poll_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STOCK = FIXTURES / "nacos-2.5.1-application.properties"
DOCKER = FIXTURES / "nacos-docker-application.properties"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def register(base: str, service: str, ip: str, port: int, **extra: str) -> None:
    status, text = call("POST", f"{base}/nacos/v1/ns/instance", data={"serviceName": service, "ip": ip, "port": port,
                                                                     **extra})
    assert status == 200, text


def hosts(base: str, service: str) -> list[dict[str, Any]]:
    status, text = http_get(f"{base}/nacos/v1/ns/instance/list?serviceName={service}")
    return list(json.loads(text)["hosts"]) if status == 200 else []


def status_json(addr: str, *extra: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("status", "--addr", addr, "--json", *extra)
    return result.returncode, (json.loads(result.stdout) if result.stdout.strip() else {})


def json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_stock_nacos_properties_start_a_node_with_json_logs_and_the_access_log(tmp_path: Path) -> None:
    with ServerSet(tmp_path, auth=OPEN) as nodes:
        node = nodes.start(args=["--config", str(STOCK), "--log-format", "json"], wait=True)
        base = f"http://{node.addr}"
        register(base, "stock", "10.1.0.1", 8080)
        assert [h["ip"] for h in hosts(base, "stock")] == ["10.1.0.1"]
        access = node.data_dir / "logs" / "access_log.log"  # the stock file turns the access log on
        entries = poll_until(lambda: [e for e in json_lines(access) if e.get("path") == "/nacos/v1/ns/instance"]
                             if access.exists() else None, 10, what="the register call in the access log")
        assert entries[0]["method"] == "POST" and entries[0]["status"] == 200
        assert entries[0]["remote"] == "127.0.0.1" and isinstance(entries[0]["duration_ms"], int)
        # SDKs send their login password in the query string: the access log never shows it
        secret = "not-in-any-log-7f3a"
        call("POST", f"{base}/nacos/v1/auth/login?username=nacos&password={secret}")
        logins = poll_until(lambda: [e for e in json_lines(access) if e.get("path") == "/nacos/v1/auth/login"],
                            10, what="the login call in the access log")
        assert "password=%2A%2A%2A" in logins[0]["msg"] and secret not in access.read_text()
        assert node.stop() == 0
    lines = json_lines(node.log_path)  # every line of the node's output is one JSON object
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert not [line for line in lines if line["level"] in ("ERROR", "CRITICAL")]


def test_the_docker_environment_starts_a_three_node_cluster(tmp_path: Path) -> None:
    ports: list[int] = []
    for _ in range(3):
        ports.append(free_port_block(avoid=ports))
    servers = " ".join(f"127.0.0.1:{p}" + ("?raft_port=7848" if i == 1 else "") for i, p in enumerate(ports))
    env = {"MODE": "cluster", "NACOS_SERVERS": servers, "PREFER_HOST_MODE": "ip", "JVM_XMS": "1g",
           "NACOS_AUTH_IDENTITY_KEY": "serverIdentity", "NACOS_AUTH_IDENTITY_VALUE": "op-secret"}
    with ServerSet(tmp_path, auth=OPEN) as nodes:
        started = [nodes.start(port=p, args=["--config", str(DOCKER)], env=env) for p in ports]
        for node in started:
            node.wait_ready(timeout=60)

        def all_up() -> dict[str, Any] | None:
            code, info = status_json(started[0].addr)
            return info if code == 0 and len(info.get("members") or []) == 3 else None

        info = poll_until(all_up, 60, interval=0.5, what="three members UP in shoal status")
        assert info["server"]["standalone_mode"] == "cluster" and info["ready"]
        assert {m["address"] for m in info["members"]} == {f"127.0.0.1:{p}" for p in ports}
        register(f"http://{started[0].addr}", "docker", "10.2.0.1", 9090)
        poll_until(lambda: hosts(f"http://{started[2].addr}", "docker"), 30, what="the instance on the third node")


def test_every_configuration_problem_is_reported_in_one_start(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text("server.port=${NACOS_APPLICATION_PORT:8848}\nspring.sql.init.platform=mysql\n"
                     "nacos.naming.push.pushTaskDelya=5\nserver.adress=127.0.0.1\nshoal.log.formt=json\n")
    result = run_cli("server", "--config", str(props), "--data-dir", str(tmp_path),
                     env={"SHOAL_LOG_LEVLE": "debug", "NACOS_APPLICATION_PORT": str(free_port_block())})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    for name in ("nacos.naming.push.pushTaskDelay", "server.address", "shoal.log.format", "SHOAL_LOG_LEVEL"):
        assert name in result.stderr, name
    assert "spring.sql.init.platform" not in result.stderr


def test_the_log_file_rotates_and_the_access_log_can_join_it(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "shoal.log"
    args = ["--log-file", str(log_file), "-D", "shoal.log.file.max-bytes=4096", "-D", "shoal.log.file.count=2",
            "-D", "server.tomcat.accesslog.enabled=true", "-D", "shoal.log.access-file=-"]
    with ServerSet(tmp_path / "nodes", auth=OPEN) as nodes:
        node = nodes.start(args=args, wait=True)

        def rotated_twice() -> bool:
            for _ in range(20):
                http_get(node.url("/nacos/v1/ns/instance/list?serviceName=rotation"))
            return (log_file.parent / "shoal.log.2").exists()

        poll_until(rotated_twice, 60, interval=0.01, what="the log file to rotate twice")
        for _ in range(100):
            http_get(node.url("/nacos/v1/ns/instance/list?serviceName=rotation"))
        assert node.stop() == 0
    files = sorted(p.name for p in log_file.parent.iterdir())
    assert files == ["shoal.log", "shoal.log.1", "shoal.log.2"]  # count=2 old files, no more
    assert all(p.stat().st_size <= 4096 for p in log_file.parent.iterdir())
    assert "instance/list?serviceName=rotation" in (log_file.parent / "shoal.log.1").read_text()
    assert "HTTP listening" not in node.log()  # the log went to the file, not to standard error


def test_status_with_auth_needs_an_admin_for_the_members(tmp_path: Path) -> None:
    identity = ["-D", "nacos.core.auth.server.identity.key=serverIdentity",
                "-D", "nacos.core.auth.server.identity.value=op-secret"]
    with ServerSet(tmp_path, auth=OPEN) as nodes:
        node = nodes.start(args=["--auth", *identity], wait=True)
        code, anonymous = status_json(node.addr)
        assert code == 0 and anonymous["members"] is None and anonymous["server"]["auth_enabled"] == "true"
        code, wrong = status_json(node.addr, "--identity-key", "serverIdentity", "--identity-value", "guess")
        assert wrong["members"] is None
        code, admin = status_json(node.addr, "--identity-key", "serverIdentity", "--identity-value", "op-secret")
        assert code == 0 and [m["state"] for m in admin["members"]] == ["UP"]
        assert admin["server"]["shoal_transport"] in ("native", "grpcio") and "payload=" in admin["server"][
            "shoal_kernels"]
        text = run_cli("status", "--addr", node.addr, "--identity-key", "serverIdentity",
                       "--identity-value", "op-secret")
        assert text.returncode == 0 and node.addr in text.stdout
    gone = run_cli("status", "--addr", node.addr, "--timeout", "2")
    assert gone.returncode == 1 and "cannot reach" in gone.stderr and "Traceback" not in gone.stderr


def test_help_names_the_flags_that_exist() -> None:
    export = run_cli("export", "--help")
    assert export.returncode == 0 and "--password-file" in export.stdout and "--password)" not in export.stdout
    status = run_cli("status", "--help")
    assert status.returncode == 0 and "--addr" in status.stdout and "--identity-key" in status.stdout
    server = run_cli("server", "--help")
    assert "--log-format" in server.stdout and "--log-file" in server.stdout and "NACOS_SERVERS" in server.stdout
