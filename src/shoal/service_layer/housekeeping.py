"""Housekeeping of the service records (Nacos EmptyServiceAutoCleanerV2)."""

from __future__ import annotations

import logging

from shoal.clock import Clock
from shoal.config import Config, LiveConfig
from shoal.model.services import ServiceIndex, ServiceManager

log = logging.getLogger(__name__)


class EmptyServiceCleaner:
    """Drops services nobody publishes and nobody created through the service API."""

    def __init__(self, live: LiveConfig, clock: Clock, services: ServiceManager, index: ServiceIndex) -> None:
        self.live = live  # read through :attr:`config` each time
        self.clock = clock
        self.services = services
        self.index = index

    @property
    def config(self) -> Config:
        """The live settings, read each time (a switch may change them)."""
        return self.live.current

    def clean_empty_services(self) -> int:
        """Drop services with no publishers for long enough; how many went."""
        now = self.clock.now_ms()
        expired = [
            record.key for record in self.services
            if not record.has_metadata
            and not self.index.publishers_of(record.key)
            and now - record.last_change_ms >= self.config.empty_service_expired_ms
        ]
        for key in expired:
            self.services.remove(key)
            log.info("removed empty service %s", key)
        return len(expired)
