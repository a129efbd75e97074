"""``shoal check``'s text talks about nodes, with a node's workers as detail (issue 21)."""

from __future__ import annotations

from shoal.check_cli import render
from shoal.service_layer.digests import ABSENT, compare

A, B = "10.0.0.1:8848", "10.0.0.2:8848"
A0, A1, B0, B1 = "10.0.0.1:21001", "10.0.0.1:21002", "10.0.0.2:21001", "10.0.0.2:21002"
SERVICE = "public/DEFAULT_GROUP@@s"


def test_one_node_of_one_process_has_nothing_to_compare() -> None:
    result = compare({A: {SERVICE: ("d", 1)}})
    assert render(result, {A: [A]}) == "1 node, no other member to compare it with; it holds 1 service"
    assert render(result) == render(result, {A: [A]})


def test_one_node_of_workers_compares_its_workers() -> None:
    result = compare({A0: {SERVICE: ("d", 1)}, A1: {SERVICE: ("d", 1)}})
    assert render(result, {A: [A0, A1]}) == "the node's 2 workers agree on 1 service"


def test_nodes_and_their_workers() -> None:
    assert render(compare({A: {}, B: {}}), {A: [A], B: [B]}) == "all 2 nodes agree on 0 services"
    agreeing = compare({m: {SERVICE: ("d", 1)} for m in (A0, A1, B0, B1)})
    assert render(agreeing, {A: [A0, A1], B: [B0, B1]}) == "all 2 nodes (4 workers) agree on 1 service"


def test_a_stale_worker_is_named_with_its_node() -> None:
    result = compare({A0: {SERVICE: ("d", 1)}, A1: {}, B0: {SERVICE: ("d", 1)}, B1: None})
    text = render(result, {A: [A0, A1], B: [B0, B1]}).splitlines()
    assert text[0] == f"{B} (worker {B1}) does not answer"
    assert text[1] == f"{SERVICE}: {A} (worker {A0}), {B} (worker {B0}) hold 1 instance(s), digest d; " \
                      f"{A} (worker {A1}) do not have it"
    assert ABSENT in result.disagree[SERVICE]
    assert text[2] == "3 of 4 members of 2 nodes answered; they disagree on 1 of 1 services"
    single = compare({A: {SERVICE: ("d", 1)}, B: {}})
    last = render(single, {A: [A], B: [B]}).splitlines()[-1]
    assert last == "2 of 2 nodes answered; they disagree on 1 of 1 services"
