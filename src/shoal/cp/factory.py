"""Builds a node's CP store from its configuration (the one place app.py will call).

``shoal.cp.mode`` picks the implementation; empty means *embedded* for a standalone node,
*etcd* when ``shoal.cp.endpoints`` is set, else *managed-etcd* (one supervised etcd member per
node, see :mod:`shoal.cp.supervisor`, and an :class:`~shoal.cp.etcd.EtcdStore` on all of them).
With the cluster TLS settings on (``nacos.remote.peer.rpc.tls.*``) the managed members and the
node's client to them use TLS with that material (:func:`managed_tls`); never plaintext then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shoal.config import Config
from shoal.cp.supervisor import EtcdSupervisor, EtcdTls, plan_members
from shoal.errors import ConfigError, TlsConfigError
from shoal.tls import peer_settings

if TYPE_CHECKING:  # the stores are imported where one is built: a node's supervisor, which only
    # runs the managed etcd member (managed_member), never loads the etcd client (aiohttp)
    from shoal.cp.etcd import EtcdStore
    from shoal.cp.store import CpStore, SiblingViews

log = logging.getLogger(__name__)

MODES = ("embedded", "etcd", "managed-etcd")


def cp_mode(config: Config, clustered: bool) -> str:
    """The effective ``shoal.cp.mode`` (raises ConfigError for a bad combination)."""
    mode = config.cp_mode.strip().lower()
    if mode and mode not in MODES:
        raise ConfigError(f"shoal.cp.mode must be one of {', '.join(MODES)}, not {config.cp_mode!r}")
    if not mode:
        mode = "etcd" if config.cp_endpoints else "managed-etcd" if clustered else "embedded"
    if mode == "etcd" and not config.cp_endpoints:
        raise ConfigError("shoal.cp.mode=etcd needs shoal.cp.endpoints (--cp-endpoints host:port,...)")
    if mode == "managed-etcd" and not clustered:
        raise ConfigError("shoal.cp.mode=managed-etcd needs the cluster members (--members)")
    if bool(config.cp_tls_cert) != bool(config.cp_tls_key):
        raise ConfigError("shoal.cp.tls.cert and shoal.cp.tls.key must be set together")
    if config.cp_request_timeout_ms <= 0 or config.cp_history_revisions <= 0:
        raise ConfigError("shoal.cp.request-timeout-ms and shoal.cp.history-revisions must be positive")
    return mode


@dataclass
class CpRuntime:
    """A node's CP store and, in managed-etcd mode, the etcd member it supervises."""

    mode: str
    store: CpStore
    supervisor: EtcdSupervisor | None = None

    async def start(self) -> None:
        if self.supervisor is not None:
            await self.supervisor.start()
        await self.store.start()

    async def stop(self) -> None:
        await self.store.close()
        if self.supervisor is not None:
            await self.supervisor.stop()


#: How often a worker's embedded store looks for what its sibling workers wrote to the shared file.
WORKER_POLL_INTERVAL_S = 0.05


def build_cp(config: Config, members: Sequence[tuple[str, int]] = (), self_address: str = "",
             worker: bool = False, siblings: SiblingViews | None = None) -> CpRuntime:
    """The CP runtime of a node; ``members`` is the (host, main port) list, ``self_address``
    this node's ``host:port`` in it (both as the member manager resolved them). A ``worker`` of a
    multi-worker node never runs an etcd member (its supervisor does, and hands it the endpoints):
    standalone, it shares the node's embedded file with its siblings, polled every
    :data:`WORKER_POLL_INTERVAL_S` so a sibling's write reaches its watchers promptly; ``siblings``:
    what its writes wait for (the sibling workers' views, docs/workers.md)."""
    mode = cp_mode(config, bool(members))
    if mode == "embedded":
        from shoal.cp.embedded import EmbeddedStore

        poll_s = WORKER_POLL_INTERVAL_S if worker else 1.0
        return CpRuntime(mode, EmbeddedStore.in_data_dir(config.data_dir, config.cp_history_revisions, poll_s,
                                                              siblings))
    if mode == "etcd":
        endpoints = [e.strip() for e in config.cp_endpoints.split(",") if e.strip()]
        return CpRuntime(mode, _etcd_store(config, endpoints, siblings))
    supervisor, tls = managed_member(config, members, self_address)
    if tls is None:
        return CpRuntime(mode, _etcd_store(config, supervisor.endpoints, siblings), supervisor)
    # https URLs, verified against the cluster's CA; the node always shows its certificate (the
    # members require one when mutual auth is asked for)
    from shoal.cp.etcd import EtcdStore

    store = EtcdStore(supervisor.client_urls, request_timeout_ms=config.cp_request_timeout_ms,
                      ca_file=tls.trusted_ca_file, cert_file=tls.cert_file, key_file=tls.key_file,
                      user=config.cp_user, password=config.cp_password, siblings=siblings)
    return CpRuntime(mode, store, supervisor)


def managed_member(config: Config, members: Sequence[tuple[str, int]],
                   self_address: str) -> tuple[EtcdSupervisor, EtcdTls | None]:
    """This node's etcd member in the managed-etcd mode (not started), and the TLS it serves."""
    tls = managed_tls(config)
    planned = plan_members(members, config.cp_client_port_offset, config.cp_peer_port_offset, tls=tls is not None)
    by_address = {f"{host}:{port}": m for (host, port), m in zip(members, planned, strict=True)}
    me = by_address.get(self_address)
    if me is None:
        raise ConfigError(f"this node ({self_address}) is not in the member list; cannot place its etcd member")
    supervisor = EtcdSupervisor(me, planned, config.data_dir, config.cp_etcd_binary,
                                history_revisions=config.cp_history_revisions,
                                log_max_bytes=config.cp_etcd_log_max_bytes, log_keep=config.cp_etcd_log_count,
                                log_check_interval_ms=config.cp_etcd_log_check_interval_ms, tls=tls)
    return supervisor, tls


def worker_cp_overrides(supervisor: EtcdSupervisor, tls: EtcdTls | None) -> list[str]:
    """The ``-D`` arguments that make a worker of a managed-etcd node a client of its node's etcd
    members (mode etcd), which the node's supervisor runs: a worker never runs one itself."""
    overrides = ["shoal.cp.mode=etcd", f"shoal.cp.endpoints={','.join(supervisor.client_urls)}"]
    if tls is not None:
        overrides += [f"shoal.cp.tls.ca={tls.trusted_ca_file}", f"shoal.cp.tls.cert={tls.cert_file}",
                      f"shoal.cp.tls.key={tls.key_file}"]
    return [arg for item in overrides for arg in ("-D", item)]


def managed_tls(config: Config) -> EtcdTls | None:
    """The TLS the managed etcd members serve (None: the cluster settings ask for none).

    Raises TlsConfigError (exit 2) when the cluster TLS settings cannot be carried over to etcd:
    etcd reads no encrypted key, and its members verify each other against a CA file, so the
    trust collection is needed even without mutual auth. Files were already checked by NodeTls."""
    settings = peer_settings(config)
    if settings is None:
        return None
    if config.cp_tls_ca or config.cp_tls_cert:
        raise TlsConfigError("shoal.cp.tls.* is for an external etcd (--cp-endpoints); the managed etcd members "
                             f"use the cluster TLS settings {settings.prefix}.*")
    if not settings.trust_file:
        raise TlsConfigError(f"{settings.trust_prop} is needed with {settings.prefix}.enableTls=true in the "
                             "managed-etcd CP mode: the etcd members verify each other's certificates against it "
                             "(or use an external etcd with --cp-endpoints)")
    if settings.private_key_password:
        raise TlsConfigError(f"{settings.password_prop}: the managed etcd members cannot read an encrypted key; "
                             f"give {settings.key_prop} an unencrypted key (mode 0600) or use an external etcd "
                             "with --cp-endpoints")
    return EtcdTls(settings.cert_chain_file, settings.private_key_file, settings.trust_file, settings.mutual)


def _etcd_store(config: Config, endpoints: Sequence[str], siblings: SiblingViews | None) -> EtcdStore:
    from shoal.cp.etcd import EtcdStore

    return EtcdStore(endpoints, request_timeout_ms=config.cp_request_timeout_ms, ca_file=config.cp_tls_ca,
                     cert_file=config.cp_tls_cert, key_file=config.cp_tls_key,
                     user=config.cp_user, password=config.cp_password, siblings=siblings)
