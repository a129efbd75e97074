"""The CP half's store: a linearizable, revisioned key-value store with local views.

``store`` is the interface (keyspaces, events, :class:`~shoal.cp.store.CpView`), ``embedded``
the SQLite store of a standalone node, ``etcd`` the etcd v3 client of a cluster, ``supervisor``
the managed etcd member of a node, ``factory`` builds them from the configuration.
"""
