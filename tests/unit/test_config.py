"""Config precedence, property names, validation and the -D flag path."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from shoal.config import Config, TestHooks, _setting, positive
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
    ({"nacos.naming.push.pushTaskDelya": "1"}, "typo of nacos.naming.push.pushTaskDelay"),
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
    bad.write_bytes(b"server.port=\xff\xfe\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        Config.load(bad, env={})


@pytest.mark.parametrize("prop", [
    "shoal.member.report-timeout-ms", "shoal.member.conf-reload-interval-ms",
    "shoal.distro.expire-check-interval-ms", "shoal.distro.snapshot.session-ttl-ms",
    "shoal.distro.sync.initial-backoff-ms", "shoal.distro.snapshot.request-timeout-ms",
    "shoal.http.forward-timeout-ms",
])
def test_distro_timings_must_be_positive(prop: str) -> None:
    assert Config.load(env={}, overrides={prop: "1"})
    with pytest.raises(ConfigError, match=f"{prop} must be positive"):
        Config.load(env={}, overrides={prop: "0"})


# --- constraints declared next to the fields ---------------------------------------------------
BAD_CANDIDATES: tuple[object, ...] = (0, -1, 70_000, 0.0, -1.0, "", "nohost", "no-such-choice")


def _constrained_fields() -> list[dataclasses.Field[object]]:
    return [f for f in dataclasses.fields(Config) if f.metadata.get("check") is not None]


def test_most_numeric_settings_declare_a_constraint() -> None:
    constrained = {f.name for f in _constrained_fields()}
    numeric = {f.name for f in dataclasses.fields(Config) if f.type == "int"}
    offsets = {"grpc_port_offset", "cluster_port_offset"}  # checked through the derived ports
    assert numeric - offsets <= constrained


@pytest.mark.parametrize("f", _constrained_fields(), ids=lambda f: f.name)
def test_every_declared_constraint_is_enforced(f: dataclasses.Field[object]) -> None:
    """Driven by the field metadata alone: a constraint added to a field is tested here too."""
    default = getattr(Config(), f.name)
    check = f.metadata["check"]
    assert check(default) is None, "the default must satisfy its own constraint"
    bad = [v for v in BAD_CANDIDATES if type(v) is type(default) and check(v) is not None]
    assert bad, f"no candidate value violates {f.name}'s constraint"
    for value in bad:
        with pytest.raises(ConfigError, match=re.escape(f.metadata["prop"])):
            dataclasses.replace(Config(), **{f.name: value}).validate()
        with pytest.raises(ConfigError, match=re.escape(f.metadata["prop"])):  # and through load()
            Config.load(env={}, overrides={f.metadata["prop"]: str(value)})


def test_a_new_field_is_validated_by_its_declaration_alone() -> None:
    @dataclasses.dataclass(frozen=True)
    class Extended(Config):
        new_knob_ms: int = _setting(5, "shoal.new.knob-ms", "A setting added later.", check=positive)
        free_text: str = _setting("", "shoal.new.free-text", "A setting without a constraint.")

    assert Extended().validate().new_knob_ms == 5
    assert Extended(free_text="anything").validate().free_text == "anything"
    with pytest.raises(ConfigError, match=r"shoal\.new\.knob-ms must be positive"):
        Extended(new_knob_ms=0).validate()


def test_cross_field_rules_still_apply() -> None:
    with pytest.raises(ConfigError, match="not a usable port"):
        Config(port=65000).validate()  # the SDK port would be 66000
    with pytest.raises(ConfigError, match="set together"):
        Config(cluster_identity_key="k").validate()


# --- test hooks are not settings -----------------------------------------------------------------
def test_test_hooks_are_not_settings() -> None:
    props = [prop for prop, _value, _doc in Config().describe()]
    assert not [p for p in props if ".test." in p]
    assert not {f.name for f in dataclasses.fields(TestHooks)} & {f.name for f in dataclasses.fields(Config)}
    with pytest.raises(ConfigError, match="unknown setting"):
        Config.load(env={}, overrides={"shoal.test.drop-incoming-sync": "1"})


def test_test_hooks_come_only_from_their_environment_variable() -> None:
    assert TestHooks.from_env({}) == TestHooks() and not TestHooks().active
    hooks = TestHooks(forward_all_to="127.0.0.1:8848", drop_incoming_sync=2)
    assert hooks.active
    assert TestHooks.from_env(hooks.to_env()) == hooks
    assert TestHooks.from_env({"SHOAL_TEST_HOOKS": '{"drop_incoming_sync": 1}'}).drop_incoming_sync == 1


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not valid JSON"),
    ("[1]", "JSON object"),
    ('{"drop_everything": 1}', "unknown hook"),
    ('{"drop_incoming_sync": "1"}', "JSON int"),
    ('{"drop_incoming_sync": -1}', "must not be negative"),
    ('{"forward_all_to": "nohost"}', "ip:port"),
])
def test_malformed_test_hooks_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TestHooks.from_env({"SHOAL_TEST_HOOKS": text})


def test_h2_abuse_limits_are_shoal_remote_h2_settings() -> None:
    c = Config.load(env={}, overrides={"shoal.remote.h2.max-concurrent-streams": "8",
                                       "shoal.remote.h2.max-continuations": "0",
                                       "shoal.remote.h2.preface-timeout-ms": "500"})
    assert (c.h2_max_concurrent_streams, c.h2_max_continuations, c.h2_preface_timeout_ms) == (8, 0, 500)
    assert (Config().h2_reset_burst, Config().h2_reset_rate) == (1000, 33)  # nghttp2's own defaults
    with pytest.raises(ConfigError, match=re.escape("shoal.remote.h2.max-continuations must not be negative")):
        Config.load(env={}, overrides={"shoal.remote.h2.max-continuations": "-1"})


def test_persistent_health_checks_default_to_nacos_timings() -> None:
    c = Config()
    # HealthCheckTask: checkRtNormalized = 2000 + random(0, random(0, TcpHealthParams.max=5000));
    # probes time out after 500 ms; SwitchDomain.checkTimes = 3.
    assert (c.health_check_interval_ms, c.health_check_jitter_ms) == (2000, 5000)
    assert (c.health_check_timeout_ms, c.health_check_times) == (500, 3)
    with pytest.raises(ConfigError, match=r"shoal\.health\.check-times"):
        dataclasses.replace(Config(), health_check_times=0).validate()


def test_moved_client_grace_outlasts_the_python_sdk_redo_tick_and_is_checked() -> None:
    assert Config().rebalance_grace_ms > 30_000  # nacos-sdk-python re-registers on a 30 s redo tick
    assert Config.load(env={}, overrides={"shoal.rebalance.grace-ms": "0"}).rebalance_grace_ms == 0
    with pytest.raises(ConfigError, match=r"shoal\.rebalance\.grace-ms"):
        Config.load(env={}, overrides={"shoal.rebalance.grace-ms": "-1"})


def test_every_setting_is_read_by_some_code() -> None:
    """A setting that nothing reads would be accepted and do nothing: each field of Config is read
    (as an attribute, or by name) somewhere in the package."""
    import ast

    import shoal

    names: set[str] = set()
    for path in Path(shoal.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    assert [f.name for f in dataclasses.fields(Config) if f.name not in names] == []


# --- auth: Nacos 3.3's three switches, each on by default, and LDAP ---------------------------------
def test_every_auth_switch_is_on_by_default_and_each_turns_off_alone() -> None:
    c = Config()
    assert (c.auth_enabled, c.auth_admin_enabled, c.auth_console_enabled) == (True, True, True)
    off = Config.load(env={"NACOS_AUTH_ADMIN_ENABLE": "false"}, overrides={"nacos.core.auth.console.enabled": "false"})
    assert (off.auth_enabled, off.auth_admin_enabled, off.auth_console_enabled) == (True, False, False)
    assert Config.load(env={"NACOS_AUTH_ENABLE": "false"}).any_auth  # admin and console stay on
    members = {"members": "127.0.0.1:8848,127.0.0.1:8858"}
    with pytest.raises(ConfigError, match="shared identity"):
        Config.load(overrides={**members, "nacos.core.auth.enabled": "false"})  # admin APIs still on
    open_cluster = {**members, **{k: "false" for k in ("auth_enabled", "auth_admin_enabled", "auth_console_enabled")}}
    assert not Config.load(overrides=open_cluster).any_auth


def test_ldap_login_needs_a_server_url() -> None:
    with pytest.raises(ConfigError, match=r"ldap\.url"):
        Config.load(overrides={"nacos.core.auth.system.type": "ldap"})
    with pytest.raises(ConfigError, match=r"system\.type"):
        Config.load(overrides={"nacos.core.auth.system.type": "oidc"})
    c = Config.load(overrides={"nacos.core.auth.system.type": "ldap", "nacos.core.auth.ldap.url": "ldap://h:389",
                               "nacos.core.auth.ldap.userDn": "cn=admin,dc=x", "nacos.core.auth.ldap.case.sensitive":
                               "false"})
    assert (c.ldap_url, c.ldap_user_dn, c.ldap_case_sensitive, c.ldap_filter_prefix) == (
        "ldap://h:389", "cn=admin,dc=x", False, "uid")
