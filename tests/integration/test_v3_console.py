"""The Nacos 3.x console API (``/nacos/v3/console``), the 3.x namespace ids, and the modules Shoal
lacks (501 / 40001) on real servers (docs/protocol.md §5.7); nacos-sdk-python 3.x with the 3.x
namespace id ``public``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import ClientConfigBuilder, ListInstanceParam, NacosException, RegisterInstanceParam
from v2.nacos.ai.model.ai_param import DownloadSkillParam
from v2.nacos.ai.nacos_ai_service import NacosAIService

from shoal.testing import ServerProcess, poll_until
from shoal.testing.auth import PASSWORD, add_user_with_grant, ok
from shoal.testing.http import call, call_json

from . import admin

node = admin.node
auth_node = admin.auth_node
CONSOLE = "/nacos/v3/console"
PUBLIC_3X = {"namespace": "public", "namespaceShowName": "public", "namespaceDesc": "Default Namespace",
             "quota": 200, "configCount": 0, "type": 0}
pytestmark = pytest.mark.integration


def error(method: str, url: str, status: int, params: dict[str, str] | None = None,
          data: dict[str, str] | None = None) -> int:
    body = call_json(method, url, params, data, status=status)
    assert set(body) == {"code", "message", "data"} and body["code"] != 0, body
    return int(body["code"])


def test_health_state_and_cluster(node: ServerProcess) -> None:
    assert ok(call_json("GET", node.url(CONSOLE + "/health/liveness"))) == "ok"
    assert ok(call_json("GET", node.url(CONSOLE + "/health/readiness"))) == "ok"
    state = call_json("GET", node.url(CONSOLE + "/server/state"))  # the bare map, as Nacos answers it
    assert state["version"].startswith("shoal-") and state["function_mode"] == "naming"
    assert ok(call_json("GET", node.url(CONSOLE + "/server/announcement"))) is None
    assert ok(call_json("GET", node.url(CONSOLE + "/server/announcement"), {"language": "en-US"})) is None
    assert call_json("GET", node.url(CONSOLE + "/server/announcement"), {"language": "fr-FR"}) == {
        "code": 30000, "message": "Unsupported language: fr-FR", "data": None}
    assert ok(call_json("GET", node.url(CONSOLE + "/server/guide"))) is None
    [me] = ok(call_json("GET", node.url(CONSOLE + "/core/cluster/nodes"), {"keyword": "x"}))
    assert me["state"] == "UP" and me["port"] == node.port


def test_namespaces_answer_each_generation_its_own_public_id(node: ServerProcess) -> None:
    """3.x lists public as ``public`` (console and admin), v1/v2 as ``""``; both ids name it everywhere."""
    console_ns = CONSOLE + "/core/namespace"
    assert ok(call_json("GET", node.url(console_ns + "/list")))[0] == PUBLIC_3X
    assert ok(call_json("GET", node.url("/nacos/v3/admin/core/namespace/list")))[0] == PUBLIC_3X
    assert ok(call_json("GET", node.url("/nacos/v2/console/namespace/list")))[0]["namespace"] == ""
    assert call_json("GET", node.url("/nacos/v1/console/namespaces"))["data"][0]["namespace"] == ""
    for public in ("public", ""):
        assert ok(call_json("GET", node.url(console_ns), {"namespaceId": public})) == PUBLIC_3X
        assert ok(call_json("GET", node.url("/nacos/v3/admin/core/namespace"), {"namespaceId": public})) == PUBLIC_3X
        assert ok(call_json("GET", node.url("/nacos/v2/console/namespace"), {"namespaceId": public}))[
            "namespaceShowName"] == "Public"
    # the console's create form (customNamespaceId), existence check, edit and delete
    assert ok(call_json("POST", node.url(console_ns), data={"customNamespaceId": "con-ns",
                                                            "namespaceName": "Console", "namespaceDesc": "d"})) is True
    assert ok(call_json("GET", node.url(console_ns + "/exist"), {"customNamespaceId": "con-ns"})) is True
    assert ok(call_json("GET", node.url(console_ns + "/exist"), {"customNamespaceId": "public"})) is True
    assert ok(call_json("GET", node.url(console_ns + "/exist"), {"customNamespaceId": ""})) is False
    assert ok(call_json("GET", node.url(console_ns + "/exist"), {"customNamespaceId": "nope"})) is False
    assert error("GET", node.url(console_ns + "/exist"), 400) == 10000
    renamed = {"namespaceId": "con-ns", "namespaceName": "Renamed"}
    assert ok(call_json("PUT", node.url(console_ns), data=renamed)) is True
    detail = ok(call_json("GET", node.url(console_ns), {"namespaceId": "con-ns"}))
    assert (detail["namespace"], detail["namespaceShowName"], detail["type"]) == ("con-ns", "Renamed", 2)
    assert error("POST", node.url(console_ns), 400, data={"customNamespaceId": "bad id", "namespaceName": "x"}) \
        == 22000
    assert error("POST", node.url(console_ns), 500, data={"customNamespaceId": "con-ns", "namespaceName": "x"}) \
        == 22002
    assert error("POST", node.url(console_ns), 400, data={"customNamespaceId": "other"}) == 10000
    assert error("DELETE", node.url(console_ns), 400, data={"namespaceId": "public"}) == 22000
    assert ok(call_json("DELETE", node.url(console_ns), {"namespaceId": "con-ns"})) is True
    assert error("GET", node.url(console_ns), 404, {"namespaceId": "con-ns"}) == 22001


def test_naming_pages_in_the_3x_shapes(node: ServerProcess) -> None:
    svc = {"namespaceId": "public", "groupName": "CON", "serviceName": "web"}
    service, instance = CONSOLE + "/ns/service", CONSOLE + "/ns/instance"
    assert ok(call_json("POST", node.url(service), data={**svc, "ephemeral": "true",
                                                         "metadata": '{"team":"a"}'})) == "ok"
    # instances registered with the 3.x id and with the 2.x one land in one service
    for ip, namespace in (("10.30.0.1", "public"), ("10.30.0.2", ""), ("10.30.0.3", "public")):
        assert ok(call_json("POST", node.url("/nacos/v3/client/ns/instance"),
                            data={**svc, "namespaceId": namespace, "ip": ip, "port": "80"})) == "ok"
    detail = ok(call_json("GET", node.url(service), svc))
    assert detail["namespaceId"] == "public" and detail["serviceName"] == "web" and detail["groupName"] == "CON"
    assert detail["metadata"] == {"team": "a"} and detail["ephemeral"] is True and list(detail["clusterMap"]) == [
        "DEFAULT"]
    assert detail["selector"] == {"type": "none", "contextType": "NONE"}
    assert error("GET", node.url(service), 404, {**svc, "serviceName": "absent"}) == 21008
    listing = ok(call_json("GET", node.url(service + "/list"), {"namespaceId": "", "groupNameParam": "CON"}))
    assert listing["totalCount"] == 1 and listing["pageItems"][0]["ipCount"] == 3
    # instance list: a Page as PageUtil.subPage builds it (pagesAvailable = total / size + 1)
    page = ok(call_json("GET", node.url(instance + "/list"), {**svc, "pageNo": "2", "pageSize": "2"}))
    assert (page["totalCount"], page["pageNumber"], page["pagesAvailable"]) == (3, 2, 2)
    assert [h["ip"] for h in page["pageItems"]] == ["10.30.0.3"]
    assert error("GET", node.url(instance + "/list"), 400, {**svc, "pageNo": "0"}) == 20002  # PageForm
    empty = ok(call_json("GET", node.url(instance + "/list"), {**svc, "serviceName": "none-here"}))
    assert empty == {"totalCount": 0, "pageNumber": 1, "pagesAvailable": 0, "pageItems": []}
    # the console's instance edit (ephemeral given: the ephemeral instance)
    assert ok(call_json("PUT", node.url(instance), data={**svc, "ip": "10.30.0.1", "port": "80", "weight": "4",
                                                         "ephemeral": "true"})) == "ok"
    hosts = {h["ip"]: h for h in ok(call_json("GET", node.url(instance + "/list"), svc))["pageItems"]}
    assert hosts["10.30.0.1"]["weight"] == 4.0
    assert error("PUT", node.url(instance), 400, data={**svc, "ip": "10.30.0.1", "port": "80", "weight": "20000",
                                                       "ephemeral": "true"}) == 21001
    assert ok(call_json("GET", node.url(service + "/selector/types"))) == ["none", "label"]
    subs = ok(call_json("GET", node.url(service + "/subscribers"), svc))
    assert subs["totalCount"] == 0 and subs["pageItems"] == []
    assert ok(call_json("PUT", node.url(service), data={**svc, "metadata": '{"team":"b"}'})) == "ok"
    assert ok(call_json("GET", node.url(service), svc))["metadata"] == {"team": "b"}
    assert error("DELETE", node.url(service), 400, data=svc) == 21009  # it still has instances


def test_a_label_selector_is_parsed_and_without_a_cmdb_selects_every_instance(node: ServerProcess) -> None:
    """Nacos's LabelSelector matches the consumer's CMDB labels; with no CMDB entity for any IP
    nothing matches and Nacos answers every provider: so does Shoal. A bad expression is refused."""
    svc = {"namespaceId": "public", "groupName": "SEL", "serviceName": "labelled"}
    expression = "CONSUMER.label.az = PROVIDER.label.az"
    selector = json.dumps({"type": "label", "expression": expression})
    assert ok(call_json("POST", node.url(CONSOLE + "/ns/service"), data={**svc, "ephemeral": "true",
                                                                      "selector": selector})) == "ok"
    shown = ok(call_json("GET", node.url(CONSOLE + "/ns/service"), svc))["selector"]
    assert shown == {"labels": ["az"], "expression": expression, "type": "label", "contextType": "CMDB"}
    for ip in ("10.31.0.1", "10.31.0.2"):
        assert call("POST", node.url("/nacos/v1/ns/instance"), data={
            "serviceName": "labelled", "groupName": "SEL", "ip": ip, "port": "80"}) == (200, "ok")
    listed = call_json("GET", node.url("/nacos/v1/ns/instance/list"), {"serviceName": "SEL@@labelled",
                                                                       "clientIP": "10.31.9.9"})
    assert sorted(h["ip"] for h in listed["hosts"]) == ["10.31.0.1", "10.31.0.2"]
    bad = json.dumps({"type": "label", "expression": "CONSUMER.label.az=PROVIDER.label.zone"})
    assert error("PUT", node.url(CONSOLE + "/ns/service"), 400, data={**svc, "selector": bad}) == 20002
    status, text = call("PUT", node.url("/nacos/v1/ns/service"), data={
        "serviceName": "SEL@@labelled", "selector": bad, "protectThreshold": "0"})
    assert (status, text) == (400, "Selector parses failed: parse expression failed!")


DISABLED = (
    ("GET", "/nacos/v1/cs/configs"), ("POST", "/nacos/v1/cs/configs"), ("GET", "/nacos/v2/cs/config"),
    ("DELETE", "/nacos/v2/cs/config"), ("GET", "/nacos/v3/console/cs/config/list"),
    ("GET", "/nacos/v3/admin/cs/config"), ("POST", "/nacos/v3/client/cs/config"),
    ("GET", "/nacos/v3/admin/ai/mcp/list"), ("POST", "/nacos/v3/admin/ai/a2a"),
    ("GET", "/nacos/v3/console/ai/mcp/list"), ("GET", "/nacos/v3/admin/ai"),
    ("GET", "/nacos/v3/client/ai/prompt"), ("GET", "/nacos/v3/client/ai/skills"),
)


def test_modules_shoal_lacks_answer_501_40001(node: ServerProcess) -> None:
    for method, path in DISABLED:
        status, text = call(method, node.url(path), {"dataId": "d", "group": "g"})
        answer = json.loads(text)
        assert (status, answer["code"], answer["message"]) == (501, 40001, "API function disabled."), (path, text)
        assert "not offered" in answer["data"] and "None" not in text


CONSOLE_ROUTES = (
    ("GET", CONSOLE + "/ns/service/list", {"namespaceId": "public"}),
    ("GET", CONSOLE + "/ns/instance/list", {"serviceName": "s"}),
    ("POST", CONSOLE + "/ns/service", {"serviceName": "s"}),
    ("GET", CONSOLE + "/core/namespace/list", {}),
    ("POST", CONSOLE + "/core/namespace", {"customNamespaceId": "auth-ns", "namespaceName": "A"}),
    ("GET", CONSOLE + "/core/cluster/nodes", {}),
)


def test_console_auth(auth_node: ServerProcess) -> None:
    token = {"accessToken": call_json("POST", auth_node.url("/nacos/v3/auth/user/login"),
                                      data={"username": "nacos", "password": PASSWORD})["accessToken"]}
    add_user_with_grant(auth_node, token, "reader", "reader-pass-1", "readers", action="r")
    poll_until(lambda: call("POST", auth_node.url("/nacos/v3/auth/user/login"),
                            data={"username": "reader", "password": "reader-pass-1"})[0] == 200, timeout=10,
               what="the new user")
    user = {"accessToken": call_json("POST", auth_node.url("/nacos/v3/auth/user/login"),
                                     data={"username": "reader", "password": "reader-pass-1"})["accessToken"]}
    for method, path, params in CONSOLE_ROUTES:
        assert error(method, auth_node.url(path), 403, params) == 10001, path
        status, text = call(method, auth_node.url(path), {**token, **params})
        assert status == 200 and json.loads(text)["code"] == 0, (path, status, text)
    # a user with read on public: the reads pass, the writes and the member list do not
    assert ok(call_json("GET", auth_node.url(CONSOLE + "/ns/instance/list"), {**user, "serviceName": "s"}))[
        "totalCount"] == 0
    assert ok(call_json("GET", auth_node.url(CONSOLE + "/core/namespace/list"), user))[0] == PUBLIC_3X
    assert error("POST", auth_node.url(CONSOLE + "/ns/service"), 403, {**user, "serviceName": "t"}) == 10001
    assert error("GET", auth_node.url(CONSOLE + "/core/cluster/nodes"), 403, user) == 10001
    # health and state stay open; a disabled module is 501 whoever asks
    assert ok(call_json("GET", auth_node.url(CONSOLE + "/health/liveness"))) == "ok"
    assert call("GET", auth_node.url(CONSOLE + "/server/state"))[0] == 200
    assert error("GET", auth_node.url("/nacos/v3/console/ai/mcp/list"), 501) == 40001


async def test_the_python_sdk_with_namespace_public(node: ServerProcess, sdk: Any) -> None:
    """nacos-sdk-python 3.x configured with the 3.x id ``public`` (gRPC) shares the public
    namespace with HTTP callers that send ``""``, none or ``public``."""
    client = await sdk(node.addr, namespace="public")
    assert await client.register_instance(RegisterInstanceParam(service_name="py-pub", group_name="SDK",
                                                                ip="10.32.0.1", port=8080))
    assert call("POST", node.url("/nacos/v1/ns/instance"), data={
        "namespaceId": "", "serviceName": "SDK@@py-pub", "ip": "10.32.0.2", "port": "8080"}) == (200, "ok")

    def ips() -> list[str]:
        page = ok(call_json("GET", node.url(CONSOLE + "/ns/instance/list"),
                            {"namespaceId": "public", "groupName": "SDK", "serviceName": "py-pub"}))
        return sorted(h["ip"] for h in page["pageItems"])

    poll_until(lambda: ips() == ["10.32.0.1", "10.32.0.2"], timeout=10, what="both instances in public")
    listed = await client.list_instances(ListInstanceParam(service_name="py-pub", group_name="SDK",
                                                           subscribe=False, healthy_only=None))
    assert sorted(i.ip for i in listed) == ["10.32.0.1", "10.32.0.2"]
    v2 = call_json("GET", node.url("/nacos/v2/ns/instance/list"), {"serviceName": "py-pub", "groupName": "SDK"})
    assert sorted(h["ip"] for h in v2["data"]["hosts"]) == ["10.32.0.1", "10.32.0.2"]


async def test_the_python_sdk_ai_client_is_told_501(node: ServerProcess, tmp_path: Path) -> None:
    """nacos-sdk-python 3.x's AI service downloads skills over HTTP (``/v3/client/ai/skills``):
    it is answered 501, as by a Nacos without the AI module, and the SDK raises instead of waiting."""
    config = (ClientConfigBuilder().server_address(node.addr).namespace_id("public")
              .log_dir(str(tmp_path / "logs")).cache_dir(str(tmp_path / "cache")).build())
    service = await NacosAIService.create_ai_service(config)
    try:
        with pytest.raises(NacosException, match="501"):
            await service.download_skill_zip(DownloadSkillParam(skill_name="any"))
    finally:
        await service.shutdown()
