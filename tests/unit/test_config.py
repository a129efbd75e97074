"""Config precedence, property names, validation and the -D flag path."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.config import Config
from shoal.errors import ConfigError


def test_defaults_follow_nacos() -> None:
    c = Config()
    assert (c.port, c.grpc_port) == (8848, 9848)
    assert c.connection_check_interval_ms == 3000 and c.connection_keep_alive_ms == 20_000
    assert c.client_detection_timeout_ms == 1000 and c.push_task_timeout_ms == 5000
    assert c.client_expired_time_ms == 180_000 and c.push_task_delay_ms < 500


def test_file_env_and_overrides_in_precedence_order(tmp_path: Path) -> None:
    props = tmp_path / "application.properties"
    props.write_text("# a comment\nserver.port=9000\nnacos.naming.push.pushTaskDelay: 50\n"
                     "nacos.core.auth.enabled=false\n")  # an unimplemented Nacos key is ignored
    c = Config.load(props, env={"SHOAL_PUSH_TASK_DELAY_MS": "70", "SHOAL_PORT": "9100"},
                    overrides={"server.port": "9200"})
    assert c.port == 9200 and c.push_task_delay_ms == 70


@pytest.mark.parametrize(("overrides", "message"), [
    ({"server.port": "0"}, "server.port"),
    ({"server.port": "abc"}, "not a valid int"),
    ({"nacos.naming.push.enabled": "maybe"}, "not a valid bool"),
    ({"shoal.no.such.thing": "1"}, "unknown setting"),
    ({"nonsense": "1"}, "unknown setting"),
    ({"nacos.remote.server.connection.keep-alive-ms": "-1"}, "must be positive"),
    ({"nacos.remote.server.connection.redirect-address": "nohost"}, "ip:port"),
])
def test_invalid_settings_are_named(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.load(env={}, overrides=overrides)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Config.load(tmp_path / "missing.properties", env={})
    bad = tmp_path / "bad.properties"
    bad.write_text("just words\n")
    with pytest.raises(ConfigError, match="expected key=value"):
        Config.load(bad, env={})


@pytest.mark.parametrize("prop", [
    "shoal.member.report-timeout-ms", "shoal.member.conf-reload-interval-ms",
    "shoal.distro.expire-check-interval-ms", "shoal.distro.snapshot.session-ttl-ms",
    "shoal.distro.sync.initial-backoff-ms",
])
def test_distro_timings_must_be_positive(prop: str) -> None:
    assert Config.load(env={}, overrides={prop: "1"})
    with pytest.raises(ConfigError, match=f"{prop} must be positive"):
        Config.load(env={}, overrides={prop: "0"})
