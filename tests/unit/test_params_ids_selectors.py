"""Parameter bounds and page leniency (params.py), Nacos's snowflake instance ids
(service_layer.instance_ids) and label-selector parsing (service_layer.selectors)."""

from __future__ import annotations

import itertools

import pytest

from shoal.config import Config
from shoal.errors import ConfigError, InvalidParam
from shoal.model.instance import InstanceInfo
from shoal.service_layer.instance_ids import EPOCH_MS, Snowflake, local_worker_id, new_instance_id
from shoal.service_layer.selectors import PARSE_FAILED, label_names, normalise_selector
from shoal.transport.http.params import Params, bounds_text


@pytest.mark.parametrize(("low", "high"), list(itertools.product((None, 0, 1), (None, 10))))
def test_a_numeric_error_never_names_an_open_bound(low: int | None, high: int | None) -> None:
    """Every bound combination and every refused value: the message names the parameter and the
    bounds that exist, never a Python ``None``."""
    for value in ("-5", "11", "x", "1.5", ""):
        try:
            Params({"n": value}).integer("n", None, low, high)
        except InvalidParam as exc:
            assert "None" not in exc.message and "'n'" in exc.message, exc.message
    for low_, high_ in ((None, None), (1, None), (None, 5), (1, 5)):
        assert "None" not in bounds_text(low_, high_)
    with pytest.raises(InvalidParam, match="must be at least 1, got 0"):
        Params({"n": "0"}).integer("n", None, 1)


def test_page_parameters_clamp_as_nacos_does() -> None:
    assert Params({"pageNo": "0"}).page_no() == 1
    assert Params({"pageNo": "-7"}).page_no() == 1
    assert Params({}).page_no() == 1
    assert Params({"pageNo": "3"}).page_no() == 3
    assert Params({"pageSize": "-1"}).page_size() == 0
    assert Params({"pageSize": "900"}).page_size(high=500) == 500
    assert Params({}).page_size(default=20) == 20
    with pytest.raises(InvalidParam, match="pageNo"):
        Params({"pageNo": "one"}).page_no()
    with pytest.raises(InvalidParam, match="pageNo"):
        Params({}).page_no(default=None)  # v1's pageNo is required


def test_snowflake_ids_are_nacos_shaped_unique_and_increasing() -> None:
    flake = Snowflake(0b1100000101)
    ids = [flake.next_id() for _ in range(10_000)]  # more than one millisecond's 4096
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    first = ids[0]
    assert (first >> 12) & 0x3FF == 0b1100000101
    assert abs((first >> 22) + EPOCH_MS - flake._now_ms()) < 60_000  # the time part is now, since Nacos's epoch
    assert first.bit_length() <= 63
    with pytest.raises(ValueError, match="worker id"):
        Snowflake(1024)
    assert 0 <= local_worker_id() <= 1023


def test_the_metadata_picks_the_instance_id_generator() -> None:
    plain = InstanceInfo("10.0.0.1", 80, metadata={})
    assert new_instance_id(plain, "DEFAULT", "G@@s") == "10.0.0.1#80#DEFAULT#G@@s"
    unknown = InstanceInfo("10.0.0.1", 80, metadata={"preserved.instance.id.generator": "simple"})
    assert new_instance_id(unknown, "DEFAULT", "G@@s") == "10.0.0.1#80#DEFAULT#G@@s"
    flake = InstanceInfo("10.0.0.1", 80, metadata={"preserved.instance.id.generator": "snowflake"})
    one, two = new_instance_id(flake, "c1", "G@@s"), new_instance_id(flake, "c1", "G@@s")
    number, cluster, service = one.split("#")
    assert number.isdigit() and int(number) > 0 and (cluster, service) == ("c1", "G@@s")
    assert one != two  # each registration without an id gets a new one, as in Nacos


@pytest.mark.parametrize(("expression", "labels"), [
    ("", []), (None, []), ("  ", []),
    ("CONSUMER.label.az=PROVIDER.label.az", ["az"]),
    (" CONSUMER.label.az = PROVIDER.label.az & CONSUMER.label.env=PROVIDER.label.env ", ["az", "env"]),
    ("CONSUMER.label.a=PROVIDER.label.a&CONSUMER.label.a=PROVIDER.label.a", ["a"]),
])
def test_label_expressions_that_parse(expression: str | None, labels: list[str]) -> None:
    assert label_names(expression) == labels


@pytest.mark.parametrize("expression", [
    "az", "CONSUMER.label.az", "CONSUMER.label.az=PROVIDER.label.env", "PROVIDER.label.a=CONSUMER.label.a",
    "CONSUMER.label.a=PROVIDER.label.a&", "CONSUMER.label.a=PROVIDER.label.a&&CONSUMER.label.b=PROVIDER.label.b",
    "CONSUMER.label.=PROVIDER.label.", "CONSUMER.label.a==PROVIDER.label.a", "CONSUMER.label.a|PROVIDER.label.a",
])
def test_label_expressions_nacos_refuses(expression: str) -> None:
    with pytest.raises(InvalidParam, match="parse expression failed"):
        label_names(expression)


def test_selectors_are_kept_in_nacos_shape() -> None:
    assert normalise_selector({"type": "NONE"}) == {"type": "none", "contextType": "NONE"}
    assert normalise_selector({"type": "label", "expression": "CONSUMER.label.az=PROVIDER.label.az"}) == {
        "labels": ["az"], "expression": "CONSUMER.label.az=PROVIDER.label.az", "type": "label",
        "contextType": "CMDB"}
    with pytest.raises(InvalidParam, match=PARSE_FAILED.split(":")[0]):
        normalise_selector({"type": "label", "expression": 5})
    with pytest.raises(InvalidParam, match="type 'none' or 'label'"):
        normalise_selector({"type": "cmdb"})


def test_the_worker_id_setting_is_range_checked() -> None:
    assert Config(snowflake_worker_id=1023).validate().snowflake_worker_id == 1023
    for bad in (-2, 1024):
        with pytest.raises(ConfigError, match=r"nacos\.core\.snowflake\.worker-id"):
            Config(snowflake_worker_id=bad).validate()
