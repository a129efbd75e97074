"""Issue 23 item 4: ``shoal check`` and ``/nacos/v1/shoal/consistency`` name the stale member of
3 real nodes: one SIGSTOPped (it does not answer) or one that drops the Distro syncs it receives
(it answers a stale list); they agree again once the paused node is resumed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from shoal.config import TestHooks
from shoal.testing.faults import freeze, thaw
from shoal.testing.http import call, http_get
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster, owner_index
from shoal.testing.wait import poll_until

pytestmark = pytest.mark.faults

#: Instances registered here never beat; keep them for the whole test.
KEEP = json.dumps({"preserved.heart.beat.timeout": "600000", "preserved.ip.delete.timeout": "600000"})


def shoal_check(cluster: FaultCluster, node: int, *extra: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "shoal", "check", "--addr", cluster.addr(node), "--timeout", "1",
                           "--recheck", "0.5", *extra], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def register(cluster: FaultCluster, node: int, ip: str, port: int = 8080) -> None:
    status, text = call("POST", cluster.nodes[node].url("/nacos/v1/ns/instance"),
                        {"serviceName": "stale", "ip": ip, "port": str(port), "metadata": KEEP})
    assert status == 200, text


def owned_by(cluster: FaultCluster, owner: int) -> str:
    """An ip whose ip:8080 node ``owner`` is responsible for (a write there is not forwarded)."""
    return next(ip for ip in (f"10.23.0.{n}" for n in range(1, 250)) if owner_index(cluster, f"{ip}:8080") == owner)


def consistency(cluster: FaultCluster, node: int) -> dict[str, object]:
    status, text = http_get(cluster.nodes[node].url("/nacos/v1/shoal/consistency?recheckMs=300"), 10)
    assert status == 200, text
    result: dict[str, object] = json.loads(text)
    return result


def gauge(cluster: FaultCluster, node: int, member: str) -> float:
    status, text = http_get(cluster.nodes[node].url("/nacos/actuator/prometheus"), 3)
    assert status == 200
    match = re.search(rf'^shoal_consistency_disagreements{{member="{re.escape(member)}"}} (\S+)$', text, re.MULTILINE)
    assert match, text[-500:]
    return float(match.group(1))


def test_check_names_the_paused_node_then_agrees_after_sigcont(fault_cluster: Callable[..., FaultCluster]) -> None:
    cluster = fault_cluster(3, *FAST_MEMBERS)
    cluster.start_all()
    a, c = 0, 2
    poll_until(lambda: all(s == "UP" for s in cluster.member_states(a).values()), 30, what="every member UP")
    register(cluster, a, owned_by(cluster, a))
    poll_until(lambda: all(len(cluster.instance_ips(i, "stale")) == 1 for i in range(3)), 20, what="replication")

    code, out = shoal_check(cluster, a)
    assert (code, out.strip()) == (0, "all 3 nodes agree on 1 service"), out

    freeze(cluster.nodes[c])
    try:
        register(cluster, a, owned_by(cluster, a).replace("10.23.0.", "10.23.1."))
        code, out = shoal_check(cluster, a)
        assert code == 3, out
        assert f"{cluster.addr(c)} does not answer" in out
        # the API the console's cluster page reads says the same, and sets the gauge
        result = consistency(cluster, a)
        assert result["agree"] is False and result["unanswered"] == [cluster.addr(c)], result
        assert gauge(cluster, a, cluster.addr(c)) == -1
    finally:
        thaw(cluster.nodes[c])
    poll_until(lambda: shoal_check(cluster, a)[0] == 0, 60, interval=0.5, what="shoal check to agree after SIGCONT")
    assert shoal_check(cluster, c)[1].strip() == "all 3 nodes agree on 1 service"
    assert consistency(cluster, a)["agree"] is True
    assert gauge(cluster, a, cluster.addr(c)) == 0


def test_check_names_the_member_that_answers_a_stale_list(fault_cluster: Callable[..., FaultCluster]) -> None:
    cluster = fault_cluster(3)
    drop = TestHooks(drop_incoming_sync=1_000_000).to_env()  # C never applies what its peers send it
    cluster.start_all(envs={2: drop})
    a, b, c = 0, 1, 2
    poll_until(lambda: all(s == "UP" for s in cluster.member_states(a).values()), 30, what="every member UP")
    register(cluster, a, owned_by(cluster, a))
    poll_until(lambda: len(cluster.instance_ips(b, "stale")) == 1, 20, what="replication to B")

    code, out = shoal_check(cluster, b, "--service", "stale")
    assert code == 3, out
    line = next(x for x in out.splitlines() if x.startswith("public/DEFAULT_GROUP@@stale:"))
    assert f"{cluster.addr(a)}, {cluster.addr(b)} hold 1 instance(s)" in line
    assert f"{cluster.addr(c)} do not have it" in line
    assert "3 of 3 nodes answered; they disagree on 1 of 1 services" in out

    code, out = shoal_check(cluster, a, "--json")
    report = json.loads(out)
    assert code == 3 and report["disagreementsPerMember"] == {cluster.addr(a): 0, cluster.addr(b): 0,
                                                              cluster.addr(c): 1}, report
    result = consistency(cluster, c)  # C itself sees that it is the odd one out
    assert result["disagreementsPerMember"] == report["disagreementsPerMember"], result
    assert gauge(cluster, c, cluster.addr(c)) == 1
