"""Liveness of clients: connection keep-alive, heartbeats of ip:port clients."""
