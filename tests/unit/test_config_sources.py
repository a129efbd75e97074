"""Operators' configuration sources: a Nacos application.properties in full Java
syntax with Spring placeholders, the Nacos Docker image's environment, typos reported all at once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shoal.config import Config
from shoal.config_sources import PlaceholderResolver, relaxed_env_name
from shoal.distro.members import parse_member, parse_member_list
from shoal.errors import ConfigError
from shoal.testing import OPEN_SETTINGS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STOCK = FIXTURES / "nacos-2.5.1-application.properties"
DOCKER = FIXTURES / "nacos-docker-application.properties"


def test_the_stock_nacos_file_loads_unchanged() -> None:
    assert STOCK.read_text().startswith("#\n# Copyright 1999-2021 Alibaba Group Holding Ltd.")
    config, report = Config.load_with_report(STOCK, env={})
    assert config.port == 8848 and not config.auth_enabled
    assert config.access_log_enabled  # server.tomcat.accesslog.enabled=true, as Nacos ships it
    assert "spring.sql.init.platform" not in report.unused  # commented out in the stock file
    assert {"db.pool.config.maximumPoolSize", "management.metrics.export.elastic.enabled",
            "nacos.core.auth.caching.enabled", "server.servlet.contextPath"} <= set(report.unused)
    assert not report.errors and not report.warnings


def test_unused_keys_are_listed_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    _config, report = Config.load_with_report(STOCK, env={})
    with caplog.at_level(logging.INFO, logger="shoal.config"):
        report.log()
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert all(key in infos[0].getMessage() for key in report.unused)


def test_java_properties_syntax_in_full(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text(
        "! a bang comment\n"
        "server.port 9100\n"                                  # key value
        "nacos.naming.push.pushTaskDelay:25\n"                # key:value
        "nacos.member.list = 127.0.0.1:9100,\\\n"              # a continuation line
        "    127.0.0.2:9100?raft_port=8100\n"
        "nacos.inetutils.ip-address=127.0.0.\\u0031\n",      # a unicode escape
        encoding="utf-8",
    )
    c = Config.load(props, env={}, overrides=dict.fromkeys(OPEN_SETTINGS, "false"))  # a cluster without identity
    assert c.port == 9100 and c.push_task_delay_ms == 25 and c.self_address == "127.0.0.1"
    assert c.members == "127.0.0.1:9100,127.0.0.2:9100?raft_port=8100"
    assert parse_member_list(c.members) == [("127.0.0.1", 9100), ("127.0.0.2", 9100)]


def test_raft_port_member_entries_are_accepted() -> None:
    assert parse_member("192.168.16.101:8847?raft_port=8807") == ("192.168.16.101", 8847)
    assert parse_member("192.168.16.101?raft_port=8808") == ("192.168.16.101", 8848)
    with pytest.raises(ConfigError, match="raft_port"):
        parse_member("host:notaport")


def test_placeholders_from_environment_properties_and_defaults(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text(
        "server.port=${NACOS_APPLICATION_PORT:8848}\n"
        "nacos.naming.push.pushTaskDelay=${push.delay}\n"
        "push.delay=${PUSH_DELAY:${FALLBACK_DELAY:40}}\n"
        "nacos.core.auth.server.identity.key=${NACOS_AUTH_IDENTITY_KEY:}\n"
        "nacos.core.auth.server.identity.value=${NACOS_AUTH_IDENTITY_VALUE:}\n"
        "db.user.0=${MYSQL_SERVICE_USER}\n"  # unresolvable, but not a key Shoal uses: left alone
    )
    assert Config.load(props, env={}).port == 8848
    c = Config.load(props, env={"NACOS_APPLICATION_PORT": "9300"})
    assert (c.port, c.push_task_delay_ms, c.cluster_identity_key) == (9300, 40, "")
    assert Config.load(props, env={"FALLBACK_DELAY": "7"}).push_task_delay_ms == 7
    assert Config.load(props, env={"PUSH_DELAY": "8"}).push_task_delay_ms == 8
    assert Config.load(props, env={}, overrides={"push.delay": "9"}).push_task_delay_ms == 9


def test_placeholder_resolver_edge_cases() -> None:
    r = PlaceholderResolver({"a": "${b}", "b": "${a}", "x": "1"}, {"SERVER_PORT": "7"}, {})
    assert r.resolve("${server.port}") == "7"  # Spring's relaxed environment name
    assert r.resolve("p${x}q${x}") == "p1q1" and r.resolve("${unclosed") == "${unclosed"
    assert r.resolve("${missing:a:b}") == "a:b"  # the first colon separates the default
    with pytest.raises(ConfigError, match="circular"):
        r.resolve("${a}")
    with pytest.raises(ConfigError, match="cannot resolve placeholder"):
        r.resolve("${missing}")
    assert relaxed_env_name("nacos.core.param.check-enabled") == "NACOS_CORE_PARAM_CHECKENABLED"


def test_an_unresolvable_placeholder_in_a_used_key_is_named(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text("server.port=${NO_SUCH_VARIABLE}\n")
    with pytest.raises(ConfigError, match=r"server\.port .*NO_SUCH_VARIABLE"):
        Config.load(props, env={})


def test_every_problem_is_reported_in_one_start(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text(
        "nacos.naming.push.pushTaskDelya=5\n"        # typo of a Nacos key Shoal implements
        "nacos.naming.expireinstance=false\n"         # wrong case
        "server.prot=9000\n"                           # typo of server.port
        "shoal.export.interval-msec=5\n"               # unknown shoal.* key
        "nacos.remote.server.connection.keep-alive-ms=abc\n"  # not an int
        "spring.sql.init.platform=mysql\n"             # Spring: accepted, unused
    )
    with pytest.raises(ConfigError) as caught:
        Config.load(props, env={"SHOAL_PUSH_TASK_DELAY": "5"})
    text = str(caught.value)
    assert text.startswith("6 problems")
    for expected in ("nacos.naming.push.pushTaskDelay", "nacos.naming.expireInstance", "typo of server.port",
                     "did you mean shoal.export.interval-ms", "not a valid int",
                     "SHOAL_PUSH_TASK_DELAY: probably a typo of SHOAL_PUSH_TASK_DELAY_MS"):
        assert expected in text, expected
    assert "spring" not in text


def test_unknown_keys_far_from_ours_are_accepted_and_listed(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text("spring.sql.init.platform=mysql\nnacos.some.future.module.knob=1\nmanagement.x=1\n")
    _config, report = Config.load_with_report(props, env={"SHOAL_SOMETHING_ELSE_ENTIRELY": "1"})
    assert set(report.unused) == {"spring.sql.init.platform", "nacos.some.future.module.knob", "management.x"}
    assert any("SHOAL_SOMETHING_ELSE_ENTIRELY" in w for w in report.warnings)


def test_the_docker_image_file_and_environment() -> None:
    env = {"MODE": "cluster", "NACOS_SERVERS": "127.0.0.1:8848 127.0.0.2:8848?raft_port=7848 127.0.0.3",
           "NACOS_APPLICATION_PORT": "8848", "NACOS_AUTH_ENABLE": "true",
           "NACOS_AUTH_TOKEN": "U2hvYWxTaG9hbFNob2FsU2hvYWxTaG9hbFNob2FsU2hvYWw=",
           "NACOS_AUTH_IDENTITY_KEY": "serverIdentity", "NACOS_AUTH_IDENTITY_VALUE": "security",
           "NACOS_SERVER_IP": "127.0.0.2", "PREFER_HOST_MODE": "ip", "JVM_XMS": "1g", "MYSQL_SERVICE_HOST": "db"}
    config, report = Config.load_with_report(DOCKER, env=env)
    assert config.members == "127.0.0.1:8848,127.0.0.2:8848?raft_port=7848,127.0.0.3"
    assert config.auth_enabled and config.self_address == "127.0.0.2"
    assert config.auth_token_secret_key == env["NACOS_AUTH_TOKEN"]
    assert (config.cluster_identity_key, config.cluster_identity_value) == ("serverIdentity", "security")
    assert {"JVM_XMS", "MYSQL_SERVICE_HOST", "PREFER_HOST_MODE", "db.url.0"} <= set(report.unused)
    assert Config.load(DOCKER, env={**env, "NACOS_APPLICATION_PORT": "9000"}).port == 9000


def test_docker_mode() -> None:
    assert Config.load(env={"MODE": "standalone", "NACOS_SERVERS": "10.0.0.1:8848"}).members == ""
    with pytest.raises(ConfigError, match="NACOS_SERVERS"):
        Config.load(env={"MODE": "cluster"})
    _config, report = Config.load_with_report(env={"MODE": "production"})  # not Nacos's MODE: a warning
    assert _config.members == "" and any("MODE" in w for w in report.warnings)
    # the flags still win over the Docker environment
    assert Config.load(env={"MODE": "cluster", "NACOS_SERVERS": "10.0.0.1"},
                       overrides={"members": "10.0.0.2:8848", **dict.fromkeys(OPEN_SETTINGS, "false")}
                       ).members == "10.0.0.2:8848"
