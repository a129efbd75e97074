"""Shoal: a Nacos 2.x-compatible service registry node."""

__version__ = "0.1.0"
