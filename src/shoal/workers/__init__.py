"""A node on every core: one supervisor and N worker processes (issue 21, docs/workers.md).

* :mod:`shoal.workers.placement` — what the supervisor tells a worker (its index, every
  worker's private port), read from the environment; the one contract between the two.
* :mod:`shoal.workers.supervisor` — starts, restarts and stops the workers.
"""
