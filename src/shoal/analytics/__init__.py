"""Offline analytics over exported registry snapshots, run with PySpark from the ``shoal`` CLI.

Why separate: Spark is heavy (a JVM, seconds to start, gigabytes of memory) and must never run inside
a registry node or slow its event loop. These jobs read only exported files (:mod:`shoal.export`)
and import nothing from the server except the leaf kernels (``shoal.kernels.*``), so they can run
on any machine that has the snapshots. Job modules import pyspark lazily; importing this package
is cheap and works without pyspark installed (``shoal analytics --help`` does not need it).
"""
