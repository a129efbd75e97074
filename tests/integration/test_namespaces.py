"""Namespaces on real servers: the v1 console and v2 APIs with Nacos's shapes and codes on a
standalone node (embedded store), and a namespace created on one node of a cluster on an external
etcd listed, edited and deleted through the others."""

from __future__ import annotations

import json
import re
from pathlib import Path

from shoal.testing import OPEN, ServerProcess, kill, poll_until, start_server
from shoal.testing.etcd import ExternalEtcdCluster
from shoal.testing.http import call, call_json
from shoal.testing.nodes import CpCluster

from . import admin

node = admin.node  # one standalone server for the module
V1 = "/nacos/v1/console/namespaces"
V2 = "/nacos/v2/console/namespace"
PUBLIC_LISTED = {"namespace": "", "namespaceShowName": "public", "namespaceDesc": None, "quota": 200,
                 "configCount": 0, "type": 0}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_v1_create_list_detail_edit_delete(node: ServerProcess) -> None:
    assert call("POST", node.url(V1), data={"customNamespaceId": "dev", "namespaceName": "Dev team",
                                            "namespaceDesc": "for developers"}) == (200, "true")
    listed = call_json("GET", node.url(V1))
    assert listed["code"] == 200 and listed["data"][0] == PUBLIC_LISTED
    assert {"namespace": "dev", "namespaceShowName": "Dev team", "namespaceDesc": "for developers", "quota": 200,
            "configCount": 0, "type": 2} in listed["data"]
    assert call_json("GET", node.url(V1), {"show": "all", "namespaceId": "dev"}) == {
        "namespace": "dev", "namespaceShowName": "Dev team", "namespaceDesc": "for developers", "quota": 200,
        "configCount": 0, "type": 2}
    assert call_json("GET", node.url(V1), {"show": "all", "namespaceId": ""})["namespaceDesc"] == "Public Namespace"
    assert call("GET", node.url(V1), {"checkNamespaceIdExist": "true", "customNamespaceId": "dev"}) == (200, "true")
    assert call("GET", node.url(V1), {"checkNamespaceIdExist": "true", "customNamespaceId": "nope"}) == (200, "false")
    assert call("PUT", node.url(V1), data={"namespace": "dev", "namespaceShowName": "Developers",
                                           "namespaceDesc": "renamed"}) == (200, "true")
    assert call_json("GET", node.url(V1), {"show": "all", "namespaceId": "dev"})["namespaceShowName"] == "Developers"
    assert call("DELETE", node.url(V1), {"namespaceId": "dev"}) == (200, "true")
    assert [n["namespace"] for n in call_json("GET", node.url(V1))["data"]] == [""]


def test_v1_refusals_are_false_as_in_nacos(node: ServerProcess) -> None:
    # a blank id gets a UUID
    assert call("POST", node.url(V1), data={"customNamespaceId": "", "namespaceName": "generated"}) == (200, "true")
    generated = [n for n in call_json("GET", node.url(V1))["data"] if n["namespaceShowName"] == "generated"]
    assert len(generated) == 1 and UUID.fullmatch(generated[0]["namespace"])
    for bad in ({"customNamespaceId": "a b", "namespaceName": "x"},       # id pattern
                {"customNamespaceId": "x" * 129, "namespaceName": "x"},   # id length
                {"customNamespaceId": "ok1", "namespaceName": "a@b"},     # reserved characters
                {"customNamespaceId": "ok2", "namespaceName": "n" * 129},
                {"customNamespaceId": "public", "namespaceName": "x"},    # always there
                {"customNamespaceId": generated[0]["namespace"], "namespaceName": "again"}):
        assert call("POST", node.url(V1), data=bad) == (200, "false"), bad
    assert call("POST", node.url(V1), data={"customNamespaceId": "x"})[0] == 400  # name is required
    assert call("PUT", node.url(V1), data={"namespace": "", "namespaceShowName": "mine"}) == (
        400, "Param 'namespace' is required.")
    assert call("PUT", node.url(V1), data={"namespace": "public", "namespaceShowName": "mine"}) == (200, "false")
    assert call("PUT", node.url(V1), data={"namespace": "absent", "namespaceShowName": "x"}) == (200, "false")
    assert call("DELETE", node.url(V1), {"namespaceId": "public"}) == (200, "false")
    assert call_json("GET", node.url(V1), {"show": "all", "namespaceId": "absent"}, status=404)["code"] == 404


def test_v2_envelope_and_error_codes(node: ServerProcess) -> None:
    assert call_json("POST", node.url(V2), data={"namespaceId": "qa", "namespaceName": "QA"}) == {
        "code": 0, "message": "success", "data": True}
    listed = call_json("GET", node.url(V2 + "/list"))
    assert listed["code"] == 0 and listed["data"][0] == PUBLIC_LISTED
    assert call_json("GET", node.url(V2), {"namespaceId": "qa"})["data"] == {
        "namespace": "qa", "namespaceShowName": "QA", "namespaceDesc": None, "quota": 200, "configCount": 0,
        "type": 2}
    assert call_json("PUT", node.url(V2), data={"namespaceId": "qa", "namespaceName": "Q&A"}, status=400) == {
        "code": 22000, "message": "illegal namespace", "data": "namespaceName [Q&A] contains illegal char"}
    assert call_json("PUT", node.url(V2), data={"namespaceId": "qa", "namespaceName": "Quality",
                                                "namespaceDesc": "d"})["data"] is True
    assert call_json("GET", node.url(V2), {"namespaceId": "qa"})["data"]["namespaceDesc"] == "d"
    assert call_json("POST", node.url(V2), data={"namespaceId": "qa", "namespaceName": "QA"}, status=500) == {
        "code": 22002, "message": "namespace already exist", "data": "namespaceId [qa] already exist"}
    assert call_json("POST", node.url(V2), data={"namespaceId": "q a", "namespaceName": "x"}, status=400) == {
        "code": 22000, "message": "illegal namespace", "data": "namespaceId [q a] mismatch the pattern"}
    assert call_json("POST", node.url(V2), data={"namespaceId": "q" * 129, "namespaceName": "x"},
                     status=400)["data"] == "too long namespaceId, over 128"
    assert call_json("POST", node.url(V2), data={"namespaceId": "nn"}, status=400)["code"] == 10000
    assert call_json("GET", node.url(V2), {"namespaceId": "absent"}, status=404) == {
        "code": 22001, "message": "namespace not exist", "data": "namespaceId [ absent ] not exist"}
    assert call_json("GET", node.url(V2), status=400)["code"] == 10000
    assert call_json("DELETE", node.url(V2), {"namespaceId": "public"}, status=400)["code"] == 22000
    assert call_json("DELETE", node.url(V2), {"namespaceId": "qa"})["data"] is True
    assert "qa" not in [n["namespace"] for n in call_json("GET", node.url(V2 + "/list"))["data"]]


def test_namespaces_survive_a_restart(tmp_path: Path) -> None:
    server = start_server(tmp_path, auth=OPEN)
    try:
        assert call("POST", server.url(V1), data={"customNamespaceId": "kept", "namespaceName": "Kept"}) == (
            200, "true")
        kill(server)
        server.start().wait_ready()
        assert "kept" in [n["namespace"] for n in call_json("GET", server.url(V1))["data"]]
    finally:
        kill(server)


def test_created_on_one_node_is_seen_and_changed_on_the_others(tmp_path: Path) -> None:
    etcd = ExternalEtcdCluster(tmp_path, 1).start()
    cluster = CpCluster(tmp_path, 3, ["--cp-endpoints", etcd.endpoints], auth=OPEN)
    try:
        cluster.start_all()
        a, b, c = (cluster.node(i) for i in range(3))
        assert call_json("POST", a.url(V2), data={"namespaceId": "shared", "namespaceName": "Shared"})["data"]

        def listed(node: ServerProcess) -> dict[str, str]:
            return {n["namespace"]: n["namespaceShowName"] for n in call_json("GET", node.url(V1))["data"]}

        poll_until(lambda: listed(b).get("shared") == "Shared" and listed(c).get("shared") == "Shared",
                   timeout=10, what="the namespace on B and C")
        # one winner when two nodes create one id
        assert call_json("POST", b.url(V2), data={"namespaceId": "shared", "namespaceName": "x"},
                         status=500)["code"] == 22002
        assert call("PUT", b.url(V1), data={"namespace": "shared", "namespaceShowName": "Renamed"}) == (200, "true")
        poll_until(lambda: listed(a).get("shared") == "Renamed", timeout=10, what="the edit on A")
        assert call("DELETE", c.url(V1), {"namespaceId": "shared"}) == (200, "true")
        poll_until(lambda: "shared" not in listed(a) and "shared" not in listed(b), timeout=10,
                   what="the delete on A and B")
        assert json.loads(call("GET", a.url(V2), {"namespaceId": "shared"})[1])["code"] == 22001
        # without its store a node refuses namespace writes with a 503 and still lists from memory
        assert call_json("POST", a.url(V2), data={"namespaceId": "kept", "namespaceName": "Kept"})["data"]
        poll_until(lambda: "kept" in listed(c), timeout=10, what="kept on C")
        etcd.stop()
        status, text = call("POST", c.url(V2), data={"namespaceId": "lost", "namespaceName": "Lost"})
        assert status == 503 and json.loads(text)["code"] == 30000, text
        assert "kept" in listed(c) and "lost" not in listed(c)
    finally:
        cluster.stop_all()
        etcd.stop()
