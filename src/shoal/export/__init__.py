"""Registry snapshots as Arrow IPC files: versioned schemas, a chunked writer, a validating reader.

The node's export task feeds :class:`~shoal.export.writer.SnapshotWriter` from its model; offline
tools (``shoal.analytics``) read the files back with :mod:`shoal.export.reader`. Submodules are
imported explicitly (``from shoal.export import writer``) so importing the package stays cheap.
"""
