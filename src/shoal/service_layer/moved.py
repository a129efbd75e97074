"""The grace period of clients moved by rebalancing (beyond Nacos).

When Nacos moves a connection (``ConnectResetRequest``, or a closed stream for clients that
cannot parse it) the connection's client is released at once, and every subscriber is pushed a
list without its instances until the client has registered again on its new node: about 3 s for
the Java SDK, up to 30 s (its redo tick) for nacos-sdk-python. Those are false removals: the
service never went away.

Here the loader marks a connection as *moving* (:meth:`MovedClients.mark`) before it resets or
closes it. When that connection goes, :meth:`ConnectionClients.release_client` asks
:meth:`MovedClients.keep` first: a moving client that publishes something is *kept* instead of
released. It stays a native client of this node, so Distro keeps replicating it (verify renews
it, peers hold their copy as usual); only its subscriptions are dropped, since there is no
connection to push to. :meth:`MovedClients.tick` then releases it piece by piece:

* a kept publication whose every instance (ip, port, cluster) is published by another, live
  client of the same service — the moved client registered again, on any node, its CHANGE
  having arrived by Distro — is removed once it has been covered for :attr:`settle_ms`, so the
  new copy reaches every peer before the old one leaves;
* a kept client with nothing left is released; so is one whose grace period
  (``shoal.rebalance.grace-ms``) has passed, with whatever it still publishes.

Releasing is the ordinary write path (``ClientManager.unpublish`` / ``remove``), so peers get
the CHANGE or DELETE and nothing comes back after the grace period. A restarted node forgets its
kept clients with the rest of its previous life (the snapshot loader deletes its old connection
clients from its peers, docs/protocol.md §6.3), so nothing is kept forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.config import Config
from shoal.model.client import Client
from shoal.model.clients import ClientManager
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceIndex

log = logging.getLogger(__name__)

#: Release reasons (ClientReleased.reason) of kept clients.
REASON_MOVED_RETURNED = "moved by rebalancing: registered again on its new connection"
REASON_MOVED_GRACE_OVER = "moved by rebalancing: grace period over"
REASON_MOVED_NODE_STOPPING = "moved by rebalancing: its node is stopping"

#: Least time a re-registration must have been visible here before the old copy is removed.
MIN_SETTLE_MS = 1000

InstanceKey = tuple[str, int, str]


class MovedClients:
    """Clients moved by rebalancing: marked while moving, kept (listed) until they are back or
    their grace period passes. Shoal-only; Nacos releases them at once."""

    def __init__(self, config: Config, clients: ClientManager, index: ServiceIndex,
                 now_ms: Callable[[], int]) -> None:
        self.grace_ms = config.rebalance_grace_ms
        #: How long a kept publication must be covered by a live one before it is removed:
        #: long enough for the new copy's sync to reach the other members first.
        self.settle_ms = max(MIN_SETTLE_MS, 4 * config.sync_delay_ms)
        self.clients = clients
        self.index = index
        self.now_ms = now_ms
        #: client id → when the loader marked its connection as moving (monotonic ms).
        self.moving: dict[str, int] = {}
        #: client id → the end of its grace period (monotonic ms).
        self.kept: dict[str, int] = {}
        #: (client id, service) → since when a live client publishes all of its instances.
        self._covered_since: dict[tuple[str, ServiceKey], int] = {}
        self.returned = 0
        self.expired = 0

    def mark(self, client_id: str) -> None:
        """The loader is about to move this connection: keep its client when it goes."""
        if self.grace_ms > 0:
            self.moving[client_id] = self.now_ms()

    def is_kept(self, client_id: str) -> bool:
        return client_id in self.kept

    def keep(self, client_id: str) -> bool:
        """Called when a connection's client is about to be released: True when it is kept.

        Only a client marked as moving and publishing something is kept; any other is released
        as before (a client that simply disconnects is not moved).
        """
        marked = self.moving.pop(client_id, None)
        if marked is None:
            return False
        client = self.clients.get(client_id)
        if client is None or not client.native or not client.publications:
            return False
        now = self.now_ms()
        for service in list(client.subscriptions):  # nobody to push to any more
            self.clients.unsubscribe(client, service, now)
        self.kept[client_id] = now + self.grace_ms
        log.info("keeping the instances of moved client %s for up to %d ms", client_id, self.grace_ms)
        return True

    def tick(self) -> int:
        """Release what is back elsewhere or past its grace period; returns how many clients were released."""
        self._forget_stale_marks()
        if not self.kept:
            return 0
        now = self.now_ms()
        released = 0
        live_cache: dict[ServiceKey, set[InstanceKey]] = {}
        for client_id, deadline in list(self.kept.items()):
            client = self.clients.get(client_id)
            if client is None:  # released by another path (a peer's take-over, a replace)
                self._drop(client_id)
                continue
            if now >= deadline:
                self._drop(client_id)
                self.clients.remove(client_id, REASON_MOVED_GRACE_OVER)
                self.expired += 1
                released += 1
                continue
            for service in list(client.publications):
                if self._covered(client, service, live_cache, now):
                    self._covered_since.pop((client_id, service), None)
                    self.clients.unpublish(client, service, now, REASON_MOVED_RETURNED)
                    live_cache.pop(service, None)
            if not client.publications:
                self._drop(client_id)
                self.clients.remove(client_id, REASON_MOVED_RETURNED)
                self.returned += 1
                released += 1
        if released:
            log.info("released %d moved clients (%d kept)", released, len(self.kept))
        return released

    def release_all(self) -> int:
        """Release every kept client now (the node stops, as its other connection clients go)."""
        kept = list(self.kept)
        for client_id in kept:
            self._drop(client_id)
            self.clients.remove(client_id, REASON_MOVED_NODE_STOPPING)
        self.moving.clear()
        return len(kept)

    def _covered(self, client: Client, service: ServiceKey, cache: dict[ServiceKey, set[InstanceKey]],
                 now: int) -> bool:
        """True when the client's instances of ``service`` have been published by live clients
        for at least :attr:`settle_ms`."""
        live = cache.get(service)
        if live is None:
            live = cache[service] = self._live_instances(service)
        publication = client.publications[service]
        key = (client.client_id, service)
        if not all((i.ip, i.port, i.cluster) in live for i in publication.instances):
            self._covered_since.pop(key, None)
            return False
        since = self._covered_since.setdefault(key, now)
        return now - since >= self.settle_ms

    def _live_instances(self, service: ServiceKey) -> set[InstanceKey]:
        found: set[InstanceKey] = set()
        for publisher_id in self.index.publishers_of(service):
            if publisher_id in self.kept:
                continue
            publisher = self.clients.get(publisher_id)
            publication = publisher.publications.get(service) if publisher is not None else None
            if publication is not None:
                found.update((i.ip, i.port, i.cluster) for i in publication.instances)
        return found

    def _drop(self, client_id: str) -> None:
        self.kept.pop(client_id, None)
        for key in [k for k in self._covered_since if k[0] == client_id]:
            del self._covered_since[key]

    def _forget_stale_marks(self) -> None:
        # A mark whose connection never went (the client ignored the reset and is still here
        # after the keep-alive scan should have closed it) must not keep it on a later,
        # ordinary disconnect: marks live at most one grace period.
        if self.moving:
            cutoff = self.now_ms() - self.grace_ms
            for client_id in [c for c, at in self.moving.items() if at < cutoff or c not in self.clients.clients]:
                del self.moving[client_id]
