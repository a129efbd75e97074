"""Service identity and Nacos's naming defaults."""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_NAMESPACE = "public"
DEFAULT_GROUP = "DEFAULT_GROUP"
DEFAULT_CLUSTER = "DEFAULT"
GROUP_SEPARATOR = "@@"


class ServiceKey(NamedTuple):
    """(namespace, group, name): the identity of a service (Nacos ``Service`` singleton)."""

    namespace: str
    group: str
    name: str

    @property
    def grouped_name(self) -> str:
        return f"{self.group}{GROUP_SEPARATOR}{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.group}@@{self.name}"


def normalise_namespace(namespace: str | None) -> str:
    """Blank namespace means ``public`` (Nacos keeps "" distinct; its Python SDK then lists
    an empty namespace, so we normalise everywhere — Java clients always send ``public``)."""
    return namespace.strip() if namespace and namespace.strip() else DEFAULT_NAMESPACE


def service_key(namespace: str | None, group: str | None, name: str) -> ServiceKey:
    return ServiceKey(normalise_namespace(namespace), group or DEFAULT_GROUP, name)


def split_grouped_name(grouped: str, default_group: str = DEFAULT_GROUP) -> tuple[str, str]:
    """``G@@svc`` → (G, svc); a bare name gets ``default_group`` (NamingUtils.getGroupName)."""
    if GROUP_SEPARATOR in grouped:
        group, _, name = grouped.partition(GROUP_SEPARATOR)
        return group, name
    return default_group, grouped
