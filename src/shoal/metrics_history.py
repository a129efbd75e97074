"""The last minutes of a node's figures, in memory, for the console's charts (issue 23 item 6).

A :class:`ChartHistory` takes one :class:`ChartSample` every ``shoal.console.chart.interval-ms``
(a ``Periodic`` that ``Node`` owns) into a ring buffer of ``window-ms / interval-ms`` samples,
so the memory is bounded whatever the uptime. Each sample is read from what the node already
counts (:class:`ChartSources`), never from a scrape's text:

* requests per second by kind (the transport: ``grpc``, ``http``, ``cluster``): the delta of
  the request counters over the interval's measured length;
* push p99: from the delta of the ``shoal_push_ack_seconds`` buckets over the interval (the
  pushes acked in it), interpolated within its bucket as Prometheus's ``histogram_quantile``;
  None when nothing was acked;
* connections and instances: gauges at the sample time;
* Distro sync per member: the peer's send queue (clients waiting to be synced) and the batches
  that failed in the interval;
* services in disagreement at the members' last digest comparison (None before the first).

A sample costs one pass over the bounded request entries, the push histogram's buckets and the
peer queues' sizes; the instance count is a pass over the clients that yields to the loop every
few thousand (:func:`count_in_chunks`), so a large registry never holds the loop for long.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoal.clock import Clock


@dataclass(frozen=True)
class PeerSync:
    """One peer's Distro send queue at the sample time: clients waiting, batches failed so far."""

    peer: str
    pending: int
    failed_batches: int


@dataclass(frozen=True)
class ChartSources:
    """Where a sample's figures come from (callables over the node's own counters)."""

    #: requests counted since the start, by kind
    requests: Callable[[], dict[str, float]]
    #: cumulative push-ack bucket counts: one per bound of ``push_bounds``, then +Inf
    push_buckets: Callable[[], Sequence[float]]
    push_bounds: Sequence[float]
    connections: Callable[[], int]
    #: instances held (awaited: a count over a large registry yields to the loop, :func:`count_in_chunks`)
    instances: Callable[[], Awaitable[int]]
    peers: Callable[[], list[PeerSync]] = list
    #: services in disagreement at the last consistency check (None: no check yet)
    disagreements: Callable[[], int | None] = lambda: None


@dataclass(frozen=True)
class PeerSample:
    pending: int
    failed: int  # batches that failed during the interval


@dataclass(frozen=True)
class ChartSample:
    """The node's figures over one interval, stamped with its end (wall-clock epoch ms)."""

    time_ms: int
    requests_per_s: dict[str, float]
    pushes: int  # pushes acked during the interval
    push_p99_ms: float | None
    connections: int
    instances: int
    sync: dict[str, PeerSample] = field(default_factory=dict)
    disagreements: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time_ms, "requests": {k: round(v, 3) for k, v in self.requests_per_s.items()},
                "pushes": self.pushes,
                "pushP99Ms": None if self.push_p99_ms is None else round(self.push_p99_ms, 3),
                "connections": self.connections, "instances": self.instances,
                "sync": {peer: {"pending": s.pending, "failed": s.failed} for peer, s in sorted(self.sync.items())},
                "disagreements": self.disagreements}


def quantile_from_buckets(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The ``q`` quantile (seconds) of observations counted in cumulative buckets (``bounds``,
    then +Inf last), as Prometheus's ``histogram_quantile``: linear within the bucket holding
    the rank, the bucket's lower bound 0 for the first; in +Inf, the highest finite bound.
    None when nothing was counted."""
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    below = 0.0
    for i, bound in enumerate(bounds):
        count = cumulative[i]
        if count >= rank:
            lower = bounds[i - 1] if i > 0 else 0.0
            in_bucket = count - below
            if in_bucket <= 0:
                return bound
            return lower + (bound - lower) * (rank - below) / in_bucket
        below = count
    return bounds[-1] if bounds else None


#: Clients counted between two yields to the loop by :func:`count_in_chunks`.
COUNT_CHUNK = 5000


async def count_in_chunks(items: Iterable[Any], count: Callable[[Any], int], chunk: int = COUNT_CHUNK) -> int:
    """``sum(count(item))`` over a snapshot of ``items``, yielding to the loop every ``chunk``
    items, so counting a large registry never holds the loop for long."""
    snapshot = list(items)
    total = 0
    for start in range(0, len(snapshot), chunk):
        if start:
            await asyncio.sleep(0)
        for item in snapshot[start:start + chunk]:
            total += count(item)
    return total


class ChartHistory:
    """The ring buffer of samples and the sampler that fills it (``tick`` is the Periodic's)."""

    def __init__(self, sources: ChartSources, clock: Clock, interval_ms: int, window_ms: int) -> None:
        self.sources = sources
        self.clock = clock
        self.interval_ms = interval_ms
        self.window_ms = window_ms
        self.capacity = max(1, window_ms // interval_ms)
        self.samples: deque[ChartSample] = deque(maxlen=self.capacity)
        # the counters at the previous tick; taken now, so the first tick is a sample already
        self._last_mono_ms = clock.monotonic_ms()
        self._last_requests = sources.requests()
        self._last_buckets = list(sources.push_buckets())
        self._last_failed = {p.peer: p.failed_batches for p in sources.peers()}

    async def tick(self) -> None:
        await self.sample()

    async def sample(self) -> ChartSample:
        """Take one sample: the interval since the previous one (or since the history was made)."""
        src = self.sources
        instances = await src.instances()  # first: it may yield; the counters below are read together
        now_mono = self.clock.monotonic_ms()
        requests = src.requests()
        buckets = list(src.push_buckets())
        peers = src.peers()
        failed_now = {p.peer: p.failed_batches for p in peers}
        previous_mono = self._last_mono_ms
        last_requests, last_buckets, last_failed = self._last_requests, self._last_buckets, self._last_failed
        self._last_mono_ms, self._last_requests, self._last_buckets = now_mono, requests, buckets
        self._last_failed = failed_now
        seconds = max(now_mono - previous_mono, 1) / 1000
        # a counter that went down (a reset) counts from zero
        rates = {kind: max(total - last_requests.get(kind, 0.0), 0.0) / seconds
                 for kind, total in sorted(requests.items())}
        deltas = ([max(now - before, 0.0) for now, before in zip(buckets, last_buckets, strict=True)]
                  if len(last_buckets) == len(buckets) else buckets)
        p99 = quantile_from_buckets(0.99, src.push_bounds, deltas)
        sample = ChartSample(
            time_ms=self.clock.now_ms(),
            requests_per_s=rates,
            pushes=int(deltas[-1]) if deltas else 0,
            push_p99_ms=None if p99 is None else p99 * 1000,
            connections=src.connections(),
            instances=instances,
            sync={p.peer: PeerSample(p.pending, max(p.failed_batches - last_failed.get(p.peer, p.failed_batches), 0))
                  for p in peers},
            disagreements=src.disagreements(),
        )
        self.samples.append(sample)
        return sample

    def to_json(self) -> dict[str, Any]:
        """The series, oldest first, with the sampling interval and the window."""
        return {"intervalMs": self.interval_ms, "windowMs": self.window_ms, "capacity": self.capacity,
                "samples": [s.to_json() for s in self.samples]}

