"""Namespaces, cluster-wide: Nacos's namespace use cases over the CP store's NAMESPACES keyspace.

Mirrors Nacos 2.x ``NamespaceOperationService`` with the checks of ``NamespaceController`` /
``NamespaceControllerV2``:

* the id is ``[\\w-]+`` (ASCII word characters and ``-``), at most 128 characters, trimmed; a blank
  id on create gets a random UUID;
* the name is required, at most 128 characters, without any of ``@#$%^&*``; the description is
  optional (at most 256 characters, Nacos's ``tenant_desc`` column);
* ``public`` always exists, is listed first, and can be neither created, edited nor deleted; ``""``
  and ``public`` both name it everywhere. The v1/v2 APIs list it as Nacos 2.x does (id ``""``,
  detail ``Public`` / ``Public Namespace``), the v3 APIs as Nacos 3.x does (:data:`V3`: id
  ``public``, name ``public``, description ``Default Namespace``);
* every namespace carries Nacos's fixed config ``quota`` (200) and ``configCount`` 0 (Shoal keeps
  no configs); ``type`` is 0 for public and 2 (custom) for the others.

Each namespace is one key ``<id>`` holding ``{"id", "name", "desc", "createTime"}``. Creation is a
create-if-absent, so two nodes creating one id at once yield one winner and one
:class:`~shoal.errors.NamespaceAlreadyExist`; edits are compare-and-put on the revision read.
Reads come from the node's view of the keyspace (local, also while the store is unreachable);
writes raise :class:`~shoal.errors.CpUnavailable` when the store has no quorum.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from shoal.cp.store import CpView
from shoal.errors import IllegalNamespace, MissingParam, NamespaceAlreadyExist, NamespaceNotExist
from shoal.model.keys import DEFAULT_NAMESPACE

log = logging.getLogger(__name__)

#: Nacos's ``DEFAULT_QUOTA``: the config quota every namespace reports.
DEFAULT_QUOTA = 200
MAX_ID_LENGTH = 128
MAX_NAME_LENGTH = 128
MAX_DESC_LENGTH = 256
TYPE_GLOBAL, TYPE_CUSTOM = 0, 2
PUBLIC_LIST_NAME = "public"
PUBLIC_SHOW_NAME = "Public"
PUBLIC_DESC = "Public Namespace"

#: Nacos 3.x's public namespace (NamespaceOperationService): its id, name and description.
V3_PUBLIC_ID, V3_PUBLIC_NAME, V3_PUBLIC_DESC = DEFAULT_NAMESPACE, "public", "Default Namespace"

_ID_RE = re.compile(r"[\w-]+", re.ASCII)
_NAME_RE = re.compile(r"[^@#$%^&*]+")
_CAS_ATTEMPTS = 5


def is_public(namespace_id: str) -> bool:
    """``""`` and ``public`` both name the public namespace."""
    return namespace_id.strip() in ("", DEFAULT_NAMESPACE)


def namespace_json(namespace_id: str, name: str, desc: str | None, kind: int) -> dict[str, Any]:
    """Nacos's ``Namespace`` as Jackson writes it (field order included)."""
    return {"namespace": namespace_id, "namespaceShowName": name, "namespaceDesc": desc, "quota": DEFAULT_QUOTA,
            "configCount": 0, "type": kind}


def validate_id(namespace_id: str) -> str:
    """The trimmed id, or IllegalNamespace with Nacos's messages."""
    namespace_id = namespace_id.strip()
    if not _ID_RE.fullmatch(namespace_id):
        raise IllegalNamespace(f"namespaceId [{namespace_id}] mismatch the pattern")
    if len(namespace_id) > MAX_ID_LENGTH:
        raise IllegalNamespace(f"too long namespaceId, over {MAX_ID_LENGTH}")
    return namespace_id


def validate_name(name: str | None, desc: str | None) -> None:
    if name is None:
        raise MissingParam("namespaceName")
    if not _NAME_RE.fullmatch(name):
        raise IllegalNamespace(f"namespaceName [{name}] contains illegal char")
    if len(name) > MAX_NAME_LENGTH:
        raise IllegalNamespace(f"too long namespaceName, over {MAX_NAME_LENGTH}")
    if desc is not None and len(desc) > MAX_DESC_LENGTH:
        raise IllegalNamespace(f"too long namespaceDesc, over {MAX_DESC_LENGTH}")


class NamespaceService:
    """Namespace CRUD over one CP view (Nacos ``NamespaceOperationService``)."""

    def __init__(self, view: CpView[Any], now_ms: Callable[[], int] | None = None) -> None:
        self.view = view
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)

    # --- reads (local) -------------------------------------------------------------------------
    def list(self, v3: bool = False) -> list[dict[str, Any]]:
        """Public first (in the 2.x form, or with ``v3`` the 3.x one), then the custom namespaces
        in creation order."""
        custom = sorted(self.view.items(), key=lambda item: (int(item[1].get("createTime", 0)), item[0]))
        public = (namespace_json(V3_PUBLIC_ID, V3_PUBLIC_NAME, V3_PUBLIC_DESC, TYPE_GLOBAL) if v3
                  else namespace_json("", PUBLIC_LIST_NAME, None, TYPE_GLOBAL))
        return [public] + [
            namespace_json(nid, str(rec.get("name", "")), rec.get("desc"), TYPE_CUSTOM) for nid, rec in custom]

    def get(self, namespace_id: str, v3: bool = False) -> dict[str, Any]:
        """One namespace with its description (public in the 2.x form, or with ``v3`` the 3.x
        one, always under id ``public`` there); NamespaceNotExist if absent."""
        if is_public(namespace_id) and v3:
            return namespace_json(V3_PUBLIC_ID, V3_PUBLIC_NAME, V3_PUBLIC_DESC, TYPE_GLOBAL)
        if is_public(namespace_id):
            return namespace_json(namespace_id.strip(), PUBLIC_SHOW_NAME, PUBLIC_DESC, TYPE_GLOBAL)
        rec = self.view.get(namespace_id.strip())
        if rec is None:
            raise NamespaceNotExist(f"namespaceId [ {namespace_id} ] not exist")
        return namespace_json(namespace_id.strip(), str(rec.get("name", "")), rec.get("desc"), TYPE_CUSTOM)

    def exists(self, namespace_id: str) -> bool:
        namespace_id = namespace_id.strip()
        return bool(namespace_id) and (is_public(namespace_id) or namespace_id in self.view)

    # --- writes (to the store) -----------------------------------------------------------------
    async def create(self, namespace_id: str | None, name: str | None, desc: str | None) -> str:
        """Create a namespace (a random UUID when ``namespace_id`` is blank); returns its id."""
        if namespace_id is None or not namespace_id.strip():
            namespace_id = str(uuid.uuid4())
        else:
            namespace_id = validate_id(namespace_id)
        validate_name(name, desc)
        assert name is not None
        if is_public(namespace_id):
            raise NamespaceAlreadyExist(f"namespaceId [{namespace_id}] already exist")
        record = {"id": namespace_id, "name": name, "desc": desc, "createTime": self._now_ms()}
        if not await self.view.create(namespace_id, record):
            raise NamespaceAlreadyExist(f"namespaceId [{namespace_id}] already exist")
        log.info("namespace %r (%s) created", namespace_id, name)
        return namespace_id

    async def edit(self, namespace_id: str, name: str | None, desc: str | None) -> None:
        """Change a namespace's name and description (compare-and-put on what was read)."""
        validate_name(name, desc)
        namespace_id = namespace_id.strip()
        if is_public(namespace_id):
            raise IllegalNamespace("the public namespace cannot be edited")
        for _ in range(_CAS_ATTEMPTS):
            current = self.view.get(namespace_id)
            if current is None:
                raise NamespaceNotExist(f"namespaceId [ {namespace_id} ] not exist")
            updated = {**current, "name": name, "desc": desc}
            if await self.view.compare_and_put(namespace_id, updated, self.view.mod_revision(namespace_id)):
                return
        raise NamespaceAlreadyExist(f"namespaceId [{namespace_id}] was changed concurrently; retry")

    async def delete(self, namespace_id: str) -> bool:
        """Remove a namespace; False if it did not exist (Nacos answers true either way)."""
        namespace_id = namespace_id.strip()
        if is_public(namespace_id):
            raise IllegalNamespace("the public namespace cannot be deleted")
        deleted = await self.view.delete(namespace_id)
        if deleted:
            log.info("namespace %r deleted", namespace_id)
        return deleted
