"""The Nacos 3.x naming admin API, ``/nacos/v3/admin/ns`` (docs/protocol.md §5.7).

InstanceControllerV3, ServiceControllerV3, ClientControllerV3, OperatorControllerV3,
HealthControllerV3 and ClusterControllerV3: every route is ADMIN_API (a global admin when auth is
on) and answers a ``Result``. Where the 3.x answer is the v2 one, the route is the v2 handler;
every other handler here calls the service layer's use cases and builds the 3.x shape itself
(the service detail, the client views, the metrics, the subscriber page), and maps the one error
3.x answers differently (an unknown switch entry is a 500).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal.errors import InvalidParam, MissingParam, NacosError
from shoal.model.keys import ServiceKey
from shoal.service_layer import NamingService
from shoal.transport.http.api import Api, dumps, v2_ok
from shoal.transport.http.console_api import detail_info_json, push_lag_json, service_view_json
from shoal.transport.http.naming import NamingRoutes, service_detail_json
from shoal.transport.http.operator import OperatorRoutes
from shoal.transport.http.params import Params
from shoal.transport.http.routes import Route

BASE = "/nacos/v3/admin/ns"
INSTANCE = BASE + "/instance"
SERVICE = BASE + "/service"
CLIENT = BASE + "/client"
OPS = BASE + "/ops"

#: MetricsInfo (3.x): the v2 metrics without cpu, load, mem and responsibleInstanceCount.
METRICS_KEYS = ("status", "serviceCount", "instanceCount", "subscribeCount", "clientCount",
                "connectionBasedClientCount", "ephemeralIpPortClientCount", "persistentIpPortClientCount",
                "responsibleClientCount")

#: HealthOperatorV2Impl.checkers: the checker types this node runs, each with its defaults.
CHECKERS = {"TCP": {"type": "TCP"},
            "HTTP": {"type": "HTTP", "path": "", "headers": "", "expectedResponseCode": 200},
            "NONE": {"type": "NONE"}}

#: SelectorManager.getAllSelectorTypes: what ``selector`` may be (kept, see check_selector).
SELECTOR_TYPES = ["none", "label"]


class V3NamingRoutes:
    """The ``/nacos/v3/admin/ns`` endpoints: the use cases of ``naming``, and the v2 naming and
    operator handlers where 3.x answers as v2 does.

    ``responsible`` names the member responsible for an ``ip:port`` (this node's address when it
    is this node), for ``client/distro``; ``is_serving`` and ``owner_of`` (who handles an
    ``ip:port``, None: this node) are the metrics' status and responsibility."""

    def __init__(self, naming: NamingService, v2: NamingRoutes, operator: OperatorRoutes,
                 responsible: Callable[[str], str], is_serving: Callable[[], bool],
                 owner_of: Callable[[str], str | None]) -> None:
        self.v2 = v2
        self.operator = operator
        self.service_ops = naming.service_ops
        self.reads = naming.reads
        self.introspection = naming.introspection
        self.catalog = naming.catalog
        self.responsible = responsible
        self.is_serving = is_serving
        self.owner_of = owner_of

    def routes(self, admin: str) -> list[Route]:
        """The route table; every route needs a global admin when auth is on."""
        n, op = self.v2, self.operator
        return [
            Route("POST", INSTANCE, n.v2_register, admin, distro=True),
            Route("DELETE", INSTANCE, n.v2_deregister, admin, distro=True),
            Route("PUT", INSTANCE, n.v2_update, admin, distro=True),
            Route("GET", INSTANCE, self.instance_detail, admin),
            Route("GET", INSTANCE + "/list", self.instances, admin),
            Route("PUT", INSTANCE + "/metadata/batch", op.batch(Api.V2, remove=False), admin),
            Route("DELETE", INSTANCE + "/metadata/batch", op.batch(Api.V2, remove=True), admin),
            Route("PUT", INSTANCE + "/partial", op.v2_patch, admin, distro=True),
            Route("POST", SERVICE, n.v2_service_create, admin),
            Route("DELETE", SERVICE, n.v2_service_delete, admin),
            Route("PUT", SERVICE, n.v2_service_update, admin),
            Route("GET", SERVICE, self.service_detail, admin),
            Route("GET", SERVICE + "/list", self.services, admin),
            Route("GET", SERVICE + "/subscribers", self.service_subscribers, admin),
            Route("GET", SERVICE + "/selector/types", self.selector_types, admin),
            Route("GET", CLIENT + "/list", n.v2_client_list, admin),
            Route("GET", CLIENT, self.client_detail, admin),
            Route("GET", CLIENT + "/publish/list", self.client_publications, admin),
            Route("GET", CLIENT + "/subscribe/list", self.client_subscriptions, admin),
            Route("GET", CLIENT + "/service/publisher/list", self.service_publishers, admin),
            Route("GET", CLIENT + "/service/subscriber/list", self.service_subscribers_of_clients, admin),
            Route("GET", CLIENT + "/distro", self.client_distro, admin),
            Route("GET", OPS + "/metrics", self.metrics, admin),
            Route("GET", OPS + "/switches", op.v2_switches, admin),
            Route("PUT", OPS + "/switches", self.update_switch, admin),
            Route("PUT", OPS + "/log", op.v2_log, admin),
            Route("PUT", BASE + "/health/instance", self.health_update, admin),
            Route("GET", BASE + "/health/checkers", self.checkers, admin),
            Route("PUT", BASE + "/cluster", self.cluster_update, admin),
        ]

    # --- instances and services --------------------------------------------------------------
    async def instances(self, request: web.Request, p: Params) -> web.StreamResponse:
        """Every instance of the service (enabled or not), optionally healthy only."""
        hosts = self.reads.service_instances(p.v2_service(), p.text("clusterName"),
                                                     p.boolean("healthyOnly", False))
        return v2_ok(dumps(hosts))

    async def instance_detail(self, request: web.Request, p: Params) -> web.StreamResponse:
        """One instance in the Instance shape; NotFound (404, 20004) when absent."""
        return v2_ok(dumps(self.reads.instance_json(p.v2_service(), p.required("ip"), p.port(), p.cluster())))

    async def service_detail(self, request: web.Request, p: Params) -> web.StreamResponse:
        """ServiceDetailInfo: the v2 detail with ``namespaceId`` for v2's ``namespace``."""
        service = p.v2_service()
        return v2_ok(dumps(service_detail_json(service, self.service_ops.describe(service), "namespaceId")))

    async def services(self, request: web.Request, p: Params) -> web.StreamResponse:
        """CatalogServiceV2Impl.listService: a Page of ServiceView, ``serviceNameParam`` and
        ``groupNameParam`` matching parts of the names (as the console's search),
        ``ignoreEmptyService``; with ``withInstances`` a Page of ServiceDetailInfo."""
        namespace, name_part, group_part = p.namespace(), p.text("serviceNameParam"), p.text("groupNameParam")
        page_no, page_size = p.integer("pageNo", 1, 1), p.integer("pageSize", 100, 1)
        if p.boolean("withInstances", False):
            count, rows = self.catalog.list_service_details(namespace, name_part, group_part, page_no, page_size)
            details = [detail_info_json(found, dict(record.metadata)) for record, found in rows]
            return v2_ok(dumps(_page(details, count, page_no, page_size)))
        page = self.catalog.list_services(namespace, name_part, group_part, page_no, page_size,
                                          has_ip_count=p.boolean("ignoreEmptyService", False))
        items = [service_view_json(s) for s in page.services]
        return v2_ok(dumps(_page(items, page.count, page_no, page_size)))

    async def service_subscribers(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A Page of SubscriberInfo (ServiceOperatorV2Impl.getSubscribers; ``pageNo`` 1,
        ``pageSize`` 100). An unknown service has none. Subscriptions stay on the node that
        holds the connection, so this is this node's subscribers (``aggregation`` is accepted)."""
        service = p.v2_service()
        page_no, page_size = p.integer("pageNo", 1, 1), p.integer("pageSize", 100, 1)
        p.boolean("aggregation", True)
        rows = self.catalog.subscribers(service, self.v2.push)
        chunk = rows[(page_no - 1) * page_size:page_no * page_size]
        items = [{"namespaceId": service.namespace, "groupName": service.group, "serviceName": service.name,
                  "ip": r.subscriber.ip, "port": 0, "agent": r.subscriber.agent, "appName": r.subscriber.app,
                  "clientId": r.client_id, "pushLag": push_lag_json(r)}
                 for r in chunk]
        return v2_ok(dumps(_page(items, len(rows), page_no, page_size)))

    async def selector_types(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(SELECTOR_TYPES))

    # --- clients (ClientControllerV3: the 3.x maintainer shapes) -----------------------------
    async def client_detail(self, request: web.Request, p: Params) -> web.StreamResponse:
        """ClientSummaryInfo; an unknown client is 404 / 20004."""
        c = self.introspection.client_detail(p.required("clientId"))
        connection = c.connection_based
        return v2_ok(dumps({
            "clientId": c.client_id, "ephemeral": True, "lastUpdatedTime": c.last_updated_ms,
            "clientType": "connection" if connection else "ipPort", "connectType": "GRPC" if connection else None,
            "appName": c.app if connection else None, "version": c.agent if connection else None,
            "clientIp": c.client_ip, "clientPort": int(c.client_port) if c.client_port.isdigit() else 0}))

    async def client_publications(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A ClientServiceInfo per published instance, ``publisherInfo`` filled."""
        out = [_client_service(key, {"clientId": None, "ip": i.ip, "port": i.port, "clusterName": i.cluster}, None)
               for key, i in self.introspection.client_publications(p.required("clientId"))]
        return v2_ok(dumps(out))

    async def client_subscriptions(self, request: web.Request, p: Params) -> web.StreamResponse:
        """A ClientServiceInfo per subscribed service, ``subscriberInfo`` filled."""
        out = [_client_service(key, None, {"clientId": None, "appName": s.app, "agent": s.agent, "address": s.ip})
               for key, s in self.introspection.client_subscriptions(p.required("clientId"))]
        return v2_ok(dumps(out))

    async def service_publishers(self, request: web.Request, p: Params) -> web.StreamResponse:
        """ClientPublisherInfo of every instance of the service (``ip`` and ``port`` filter)."""
        service = p.v2_service()
        ip, port = p.text("ip"), p.integer("port", -1)
        return v2_ok(dumps([{"clientId": r.client_id, "ip": r.instance.ip, "port": r.instance.port,
                             "clusterName": r.instance.cluster} for r in self.catalog.publishers(service)
                            if (not ip or r.instance.ip == ip) and (port < 0 or r.instance.port == port)]))

    async def service_subscribers_of_clients(self, request: web.Request, p: Params) -> web.StreamResponse:
        """ClientSubscriberInfo of every subscriber of the service (``ip`` and ``port`` filter;
        a gRPC subscriber's port is 0, as in Nacos)."""
        service = p.v2_service()
        ip, port = p.text("ip"), p.integer("port", -1)
        return v2_ok(dumps([{"clientId": r.client_id, "appName": r.subscriber.app, "agent": r.subscriber.agent,
                             "address": r.subscriber.ip, "pushLag": push_lag_json(r)}
                            for r in self.catalog.subscribers(service, self.v2.push)
                            if (not ip or r.subscriber.ip == ip) and port in (-1, 0)]))

    async def client_distro(self, request: web.Request, p: Params) -> web.StreamResponse:
        """``{"responsibleServer": "ip:port"}``: the member responsible for ``ip:port`` (DistroMapper)."""
        tag = f"{p.required('ip')}:{p.required('port')}"
        return v2_ok(dumps({"responsibleServer": self.responsible(tag)}))

    # --- operator and health -------------------------------------------------------------------
    async def metrics(self, request: web.Request, p: Params) -> web.StreamResponse:
        """MetricsInfo: the status, and the counts (null with ``onlyStatus``, the default)."""
        out: dict[str, Any] = dict.fromkeys(METRICS_KEYS)
        out["status"] = "UP" if self.is_serving() else "STARTING"
        if not p.boolean("onlyStatus", True):
            m = await self.introspection.operator_metrics(self.owner_of)
            out.update(serviceCount=m.service_count, instanceCount=m.instance_count,
                       subscribeCount=m.subscribe_count, clientCount=m.client_count,
                       connectionBasedClientCount=m.connection_based_client_count,
                       ephemeralIpPortClientCount=m.ephemeral_ip_port_client_count,
                       persistentIpPortClientCount=0, responsibleClientCount=m.responsible_client_count)
        return v2_ok(dumps(out))

    async def update_switch(self, request: web.Request, p: Params) -> web.StreamResponse:
        """OperatorControllerV3.updateSwitch: ``entry`` and ``value`` missing are 400 / 10000; an
        entry or value the switches refuse is 500 / 30000 (3.x's IllegalArgumentException)."""
        entry, value = p.required("entry"), p.required("value")
        try:
            await self.operator.switches.update(entry, value, p.boolean("debug", False))
        except MissingParam:
            raise
        except InvalidParam as exc:
            raise NacosError(exc.message) from None
        return v2_ok('"ok"')

    async def health_update(self, request: web.Request, p: Params) -> web.StreamResponse:
        """HealthControllerV3.update: a persistent instance's health set by hand."""
        await self.v2.health_update(p)
        return v2_ok('"ok"')

    async def cluster_update(self, request: web.Request, p: Params) -> web.StreamResponse:
        """ClusterControllerV3.update: one cluster's health-check settings."""
        await self.v2.cluster_update(p)
        return v2_ok('"ok"')

    async def checkers(self, request: web.Request, p: Params) -> web.StreamResponse:
        return v2_ok(dumps(CHECKERS))


def _page(items: list[dict[str, Any]], total: int, page_no: int, page_size: int) -> dict[str, Any]:
    """Nacos's Page."""
    return {"totalCount": total, "pageNumber": page_no, "pagesAvailable": math.ceil(total / page_size),
            "pageItems": items}


def _client_service(key: ServiceKey, publisher: dict[str, Any] | None,
                    subscriber: dict[str, Any] | None) -> dict[str, Any]:
    """ClientServiceInfo."""
    return {"namespaceId": key.namespace, "groupName": key.group, "serviceName": key.name,
            "publisherInfo": publisher, "subscriberInfo": subscriber}
