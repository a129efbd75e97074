"""The operator write API against real processes: switches set on one node
change another node's behaviour and survive a restart; the v2 health route, the metadata batch
routes, PATCH v2 instance and the ``/ops`` aliases, with their bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shoal.testing import OPEN, ServerProcess, poll_until, start_server
from shoal.testing.etcd import ExternalEtcdCluster
from shoal.testing.http import call, call_json
from shoal.testing.nodes import CpCluster
from shoal.testing.openapi import hosts as listed

SWITCHES = "/nacos/v1/ns/operator/switches"


def beat_interval(node: ServerProcess, ip: str) -> int:
    """What a node answers a light beat of an ip:port instance (re-registering it if needed)."""
    call("POST", node.url("/nacos/v1/ns/instance"), {"serviceName": "beats", "ip": ip, "port": "80"})
    answer = call_json("PUT", node.url("/nacos/v1/ns/instance/beat"), {"serviceName": "beats", "ip": ip,
                                                                         "port": "80"})
    return int(answer["clientBeatInterval"])


def switches(node: ServerProcess, path: str = SWITCHES) -> dict[str, Any]:
    return dict(call_json("GET", node.url(path)))


def test_a_switch_set_on_one_node_changes_the_other_and_survives_a_restart(tmp_path: Path) -> None:
    etcd = ExternalEtcdCluster(tmp_path, 1).start()
    cluster = CpCluster(tmp_path, 2, ["--cp-endpoints", etcd.endpoints], auth=OPEN)
    try:
        cluster.start_all()
        a, b = cluster.node(0), cluster.node(1)
        assert beat_interval(b, "10.9.0.1") == 5000
        assert call("PUT", a.url(SWITCHES), {"entry": "clientBeatInterval", "value": "7000"}) == (200, "ok")
        # B answers beats with the interval set on A, and shows it
        poll_until(lambda: beat_interval(b, "10.9.0.1") == 7000, 20, 0.1, "B answering the new beat interval")
        assert switches(b)["clientBeatInterval"] == 7000
        v2 = call_json("PUT", b.url("/nacos/v2/ns/operator/switches"), data={"entry": "pushEnabled",
                                                                              "value": "false"})
        assert v2["data"] == "ok"
        poll_until(lambda: switches(a)["pushEnabled"] is False, 20, 0.1, "A seeing pushEnabled=false")
        # debug=true: this node only, nothing written to the cluster
        assert call("PUT", a.url(SWITCHES), {"entry": "checkTimes", "value": "9", "debug": "true"})[0] == 200
        assert switches(a)["checkTimes"] == 9 and switches(b)["checkTimes"] == 3
        # an ephemeral metadata batch on A reaches the instances B is responsible for too
        ips = [f"10.9.1.{i}" for i in range(1, 7)]
        for ip in ips:
            assert call("POST", a.url("/nacos/v1/ns/instance"), {"serviceName": "many", "ip": ip, "port": "80"})[0] \
                == 200
        poll_until(lambda: all(len(listed(n, "many")) == len(ips) for n in (a, b)), 20, 0.1, "both nodes list all")
        batch = call_json("PUT", a.url("/nacos/v1/ns/instance/metadata/batch"),
                          data={"serviceName": "many", "metadata": '{"zone":"b"}'})
        assert sorted(batch["updated"]) == [f"{ip}:80:DEFAULT" for ip in ips]
        poll_until(lambda: all(h["metadata"] == {"zone": "b"} for n in (a, b) for h in listed(n, "many")), 20, 0.1,
                   "every instance's metadata changed on both nodes")
        # B restarts: the cluster's switches are still in force there
        b.stop()
        b = cluster.start(1)
        restarted = switches(b)
        assert (restarted["clientBeatInterval"], restarted["pushEnabled"]) == (7000, False)
        assert beat_interval(b, "10.9.0.2") == 7000
    finally:
        cluster.stop_all()
        etcd.stop()


def test_switch_updates_refuse_bad_input(tmp_path: Path) -> None:
    node = start_server(tmp_path, auth=OPEN)
    try:
        status, body = call("PUT", node.url(SWITCHES), {"entry": "noSuchSwitch", "value": "1"})
        assert status == 400 and "update entry not found: noSuchSwitch" in body
        assert call("PUT", node.url(SWITCHES), {"entry": "clientBeatInterval", "value": "soon"})[0] == 400
        assert call("PUT", node.url(SWITCHES), {"entry": "clientBeatInterval", "value": "-5"})[0] == 400
        assert call("PUT", node.url(SWITCHES), {"entry": "pushEnabled", "value": "maybe"})[0] == 400
        assert call("PUT", node.url(SWITCHES), {"value": "true"})[0] == 400
        v2 = call_json("PUT", node.url("/nacos/v2/ns/operator/switches"), {"entry": "x", "value": "1"}, status=400)
        assert v2["code"] != 0
        # an entry that would change nothing here is refused by name, on v1 and v2, and never stored
        status, body = call("PUT", node.url(SWITCHES), {"entry": "distroThreshold", "value": "0.5"})
        assert status == 400 and "switch distroThreshold is not supported" in body
        v2 = call_json("PUT", node.url("/nacos/v2/ns/operator/switches"),
                       {"entry": "pushJavaVersion", "value": "2.0.0"}, status=400)
        assert "pushJavaVersion" in str(v2["data"])
        assert switches(node)["distroThreshold"] == 0.7
        # the /ops alias reads and writes the same switches
        assert call("PUT", node.url("/nacos/v1/ns/ops/switches"), {"entry": "autoChangeHealthCheckEnabled",
                                                                   "value": "false"}) == (200, "ok")
        assert switches(node, "/nacos/v1/ns/ops/switches")["autoChangeHealthCheckEnabled"] is False
        assert call_json("GET", node.url("/nacos/v2/ns/operator/switches"))["data"][
            "autoChangeHealthCheckEnabled"] is False
        # log levels
        assert call("PUT", node.url("/nacos/v1/ns/ops/log"), {"logName": "naming-push", "logLevel": "DEBUG"}) \
            == (200, "ok")
        assert call("PUT", node.url("/nacos/v1/ns/operator/log"), {"logName": "nope", "logLevel": "INFO"})[0] == 400
        assert call("PUT", node.url("/nacos/v2/ns/operator/log"), {"logName": "naming-push",
                                                                    "logLevel": "LOUD"})[0] == 400
    finally:
        node.kill()


def instance(node: ServerProcess, service: str, ip: str, port: int = 80) -> dict[str, Any]:
    return dict(call_json("GET", node.url("/nacos/v1/ns/instance"), {"serviceName": service, "ip": ip,
                                                                     "port": str(port)}))


def test_health_metadata_batch_and_patch_routes(tmp_path: Path) -> None:
    node = start_server(tmp_path, auth=OPEN)
    try:
        # persistent instance, manual health through v2
        assert call("POST", node.url("/nacos/v2/ns/instance"), {"serviceName": "db", "ip": "10.8.0.1", "port": "80",
                                                                "ephemeral": "false"})[0] == 200
        assert call("PUT", node.url("/nacos/v1/ns/cluster"), {"serviceName": "db", "clusterName": "DEFAULT",
                                                              "healthChecker": '{"type":"NONE"}'})[0] == 200
        health = "/nacos/v2/ns/health/instance"
        assert call_json("PUT", node.url(health), data={"serviceName": "db", "ip": "10.8.0.1", "port": "80",
                                                        "healthy": "false"})["data"] == "ok"
        assert instance(node, "db", "10.8.0.1")["healthy"] is False
        assert call("PUT", node.url(health), {"serviceName": "db", "ip": "10.8.0.1", "port": "80"})[0] == 400
        assert call("PUT", node.url(health), {"serviceName": "db", "ip": "10.8.0.9", "port": "80",
                                              "healthy": "true"})[0] == 404
        assert call("PUT", node.url("/nacos/v1/ns/health/instance"), {"serviceName": "db", "ip": "10.8.0.1",
                                                                      "port": "80", "healthy": "true"})[0] == 200
        assert instance(node, "db", "10.8.0.1")["healthy"] is True

        # ephemeral instances: metadata batch PUT on all, DELETE on one named
        for ip in ("10.8.1.1", "10.8.1.2"):
            assert call("POST", node.url("/nacos/v1/ns/instance"), {"serviceName": "web", "ip": ip, "port": "80",
                                                                    "metadata": '{"keep":"1"}'})[0] == 200
        batch = "/nacos/v1/ns/instance/metadata/batch"
        put = call_json("PUT", node.url(batch), data={"serviceName": "web", "metadata": '{"zone":"a"}'})
        assert sorted(put["updated"]) == ["10.8.1.1:80:DEFAULT", "10.8.1.2:80:DEFAULT"]
        assert instance(node, "web", "10.8.1.2")["metadata"] == {"keep": "1", "zone": "a"}
        named = json.dumps([{"ip": "10.8.1.1", "port": 80, "clusterName": "DEFAULT"}])
        gone = call_json("DELETE", node.url(batch), data={"serviceName": "web", "instances": named,
                                                          "metadata": '{"zone":""}'})
        assert gone["updated"] == ["10.8.1.1:80:DEFAULT"]
        assert instance(node, "web", "10.8.1.1")["metadata"] == {"keep": "1"}
        assert instance(node, "web", "10.8.1.2")["metadata"] == {"keep": "1", "zone": "a"}
        # persistent consistency, through v2
        v2 = call_json("PUT", node.url("/nacos/v2/ns/instance/metadata/batch"),
                       data={"serviceName": "db", "consistencyType": "persistent", "metadata": "role=primary"})
        assert v2["data"]["updated"] == ["10.8.0.1:80:DEFAULT"]
        assert instance(node, "db", "10.8.0.1")["metadata"] == {"role": "primary"}
        # bad input
        assert call("PUT", node.url(batch), data={"serviceName": "web", "metadata": "a=b",
                                                  "consistencyType": "raft"})[0] == 400
        assert call("PUT", node.url(batch), data={"serviceName": "web", "metadata": "a=b",
                                                  "instances": "not json"})[0] == 400
        assert call("PUT", node.url(batch), data={"serviceName": "web"})[0] == 400

        # PATCH v2: only the given fields change, ephemeral and persistent alike
        patch = "/nacos/v2/ns/instance"
        assert call_json("PATCH", node.url(patch), data={"serviceName": "web", "ip": "10.8.1.2", "port": "80",
                                                         "weight": "3"})["data"] == "ok"
        patched = instance(node, "web", "10.8.1.2")
        assert (patched["weight"], patched["metadata"]) == (3.0, {"keep": "1", "zone": "a"})
        assert call("PATCH", node.url(patch), data={"serviceName": "db", "ip": "10.8.0.1", "port": "80",
                                                    "enabled": "false"})[0] == 200
        assert instance(node, "db", "10.8.0.1")["metadata"] == {"role": "primary"}
        assert call("PATCH", node.url(patch), data={"serviceName": "web", "ip": "10.8.1.2", "port": "80",
                                                    "weight": "heavy"})[0] == 400
        assert call("PATCH", node.url(patch), data={"serviceName": "web", "ip": "10.8.9.9", "port": "80"})[0] == 404
    finally:
        node.kill()
