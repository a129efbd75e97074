"""The registry's in-memory model: services, clients, their publications and subscriptions.

Mirrors Nacos 2.x's naming core (Client / ClientManager / ClientServiceIndexesManager /
ServiceStorage) with typed in-loop events between the parts.
"""
