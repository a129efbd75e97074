"""Nacos 3.3's built-in DNS: A, AAAA and SRV answers for services (docs/protocol.md §8)."""

from shoal.dns.resolver import DnsResolver
from shoal.dns.server import DnsServer, RateLimiter

__all__ = ["DnsResolver", "DnsServer", "RateLimiter"]
