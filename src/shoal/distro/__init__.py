"""Distro: the AP replication of ephemeral clients between nodes (Nacos core/distributed/distro
and naming/consistency/ephemeral/distro/v2)."""
