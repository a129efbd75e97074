"""The built-in DNS's read use case (docs/protocol.md §8): which instances a name answers with.

DNS clients cannot tell a bad address from a good one, so only instances that are healthy,
enabled and of weight above zero are offered, from every cluster, without the protection
threshold. The result is the same tuple object until the service changes (it is cached against
the service's view, which the model replaces on every change), so the DNS server can cache what
it builds from it too.
"""

from __future__ import annotations

import collections

from shoal.errors import NacosError
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey, normalise_namespace
from shoal.model.services import ServiceView
from shoal.service_layer.naming import NamingService

#: Services whose filtered instances are remembered (least recently asked dropped first).
MAX_CACHED = 4096


class DnsReads:
    """Answerable instances of a service in one namespace (Nacos 3.3 DNS module's lookup)."""

    def __init__(self, naming: NamingService, namespace: str) -> None:
        self.naming = naming
        self.namespace = normalise_namespace(namespace)
        self._cache: collections.OrderedDict[ServiceKey, tuple[ServiceView, tuple[InstanceInfo, ...]]] = (
            collections.OrderedDict())

    def answerable(self, group: str, service: str) -> tuple[InstanceInfo, ...] | None:
        """The healthy, enabled instances of weight > 0 (possibly none), or None when the
        service does not exist or its name is not a legal one."""
        key = ServiceKey(self.namespace, group, service)
        try:
            if not self.naming.reads.service_exists(key):
                self._cache.pop(key, None)
                return None
        except NacosError:  # a name the parameter checker refuses names no service
            return None
        view = self.naming.reads.storage.view(key)
        cached = self._cache.pop(key, None)
        if cached is None or cached[0] is not view:
            cached = (view, tuple(inst for inst in view.instances
                                  if inst.healthy and inst.enabled and inst.weight > 0))
        self._cache[key] = cached
        if len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return cached[1]
