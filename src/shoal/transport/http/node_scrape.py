"""``/nacos/actuator/prometheus`` of a node of workers (``--workers N``): one answer for the node.

A worker asked on its node's public port renders its own registry, asks each sibling worker for
its own on the sibling's private port (all at once, each bounded by :data:`SCRAPE_TIMEOUT_S`), and
merges them (:func:`merge_expositions`); a sibling asked on its private port answers only its own,
so no scrape asks further. A single-process node, or a worker asked on its private port, answers
its own registry as before.

The merged answer:

* **Nacos's families** (``nacos_monitor``, ``nacos_naming_*``, the Micrometer timers
  ``grpc_server_requests_seconds*`` / ``http_server_requests_seconds*``, ``system_*``) appear once
  per node, with their own labels only, as a Nacos node exports them, so Nacos dashboards read
  the node: counters and histograms are summed over the workers; gauges that count what a worker
  holds (connections, its pushes and health checks, :data:`SUMMED_MONITOR_NAMES`) are summed; the
  other gauges, which every worker holds alike (the registry's sizes: each worker holds a full
  replica; a ``_max``; the host's load), are the largest; ``avgPushCost`` is recomputed from the
  summed cost and count.
* **Shoal's and the process's families** (``shoal_*``, ``process_*``, ``python_*``) appear once
  per worker, each series labelled ``worker="i"``: sum them in PromQL (``sum without (worker)``).
* ``shoal_worker_up{worker="i"}``: 1 for each worker whose figures are in the answer, 0 for a
  sibling that did not answer in time (its figures are then missing from the sums).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.utils import floatToGoString

from shoal.tls import PortTls

log = logging.getLogger(__name__)

#: How long a scrape waits for a sibling worker's figures.
SCRAPE_TIMEOUT_S = 1.0
PATH = "/nacos/actuator/prometheus"

#: Families labelled by worker (every other family is summed or maxed into one set per node).
PER_WORKER_PREFIXES = ("shoal_", "process_", "python_")

#: ``nacos_monitor`` gauges that count what one worker holds or did: the node's value is the sum.
SUMMED_MONITOR_NAMES = frozenset({
    "longConnection", "totalPush", "failedPush", "emptyPush", "totalPushCountForAvg", "totalPushCostForAvg",
    "pushPendingTaskCount", "httpHealthCheck", "tcpHealthCheck", "mysqlHealthCheck",
    "serviceSubscribedEventQueueSize", "serviceChangedEventQueueSize",
})

UP_FAMILY = ("# HELP shoal_worker_up 1 for each worker of this node whose figures this answer holds, "
             "0 for one that did not answer in time\n# TYPE shoal_worker_up gauge\n")


class NodeScrape:
    """Asks a worker's siblings for their own figures, on their private HTTP ports."""

    def __init__(self, siblings: Sequence[tuple[int, str]], tls: PortTls | None,
                 timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        """``siblings``: (worker index, private ``ip:port``) of every other worker of the node."""
        self.siblings = tuple(siblings)
        self.scheme = "https" if tls is not None else "http"
        self.ssl = tls.client_context() if tls is not None else None
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl) if self.ssl is not None else None
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  connector=connector)
        return self._session

    async def _one(self, address: str) -> bytes | None:
        try:
            async with self._client().get(f"{self.scheme}://{address}{PATH}") as response:
                return await response.read() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("scrape of sibling worker %s failed: %s", address, exc)
            return None

    async def gather(self) -> list[tuple[int, bytes | None]]:
        """Each sibling's exposition text (None: it did not answer within the timeout)."""
        answers = await asyncio.gather(*(self._one(address) for _, address in self.siblings))
        return [(index, answer) for (index, _), answer in zip(self.siblings, answers, strict=True)]

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


@dataclass
class _Family:
    name: str
    meta: list[str] = field(default_factory=list)  # its HELP and TYPE lines
    kind: str = "untyped"
    #: per worker: its sample lines as (sample name, labels text, value text)
    samples: dict[int, list[tuple[str, str, str]]] = field(default_factory=dict)


def _parse(text: str, worker: int, families: dict[str, _Family]) -> None:
    current: _Family | None = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = families.get(parts[2])
                if current is None:
                    current = families[parts[2]] = _Family(parts[2])
                if not any(m.startswith(f"# {parts[1]} ") for m in current.meta):  # the first worker's
                    current.meta.append(line)
                    if parts[1] == "TYPE" and len(parts) == 4:
                        current.kind = parts[3].strip()
            continue
        head, _, value = line.rpartition(" ")
        brace = head.find("{")
        name, labels = (head, "") if brace < 0 else (head[:brace], head[brace + 1:-1])
        if current is None or not name.startswith(current.name):
            current = families.setdefault(name, _Family(name))
        current.samples.setdefault(worker, []).append((name, labels, value))


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return float("nan")


def _node_samples(family: _Family) -> list[str]:
    """One set of samples for the node: summed or the largest, per (sample name, labels)."""
    order: list[tuple[str, str]] = []
    values: dict[tuple[str, str], list[float]] = {}
    for samples in family.samples.values():
        for name, labels, value in samples:
            key = (name, labels)
            if key not in values:
                order.append(key)
                values[key] = []
            values[key].append(_number(value))
    summed = family.kind in ("counter", "histogram", "summary")
    combined: dict[tuple[str, str], float] = {}
    for key in order:
        name, labels = key
        monitor_name = labels.rpartition('name="')[2].split('"', 1)[0] if family.name == "nacos_monitor" else ""
        if summed or monitor_name in SUMMED_MONITOR_NAMES:
            combined[key] = sum(values[key])
        else:
            combined[key] = max(values[key])
    if family.name == "nacos_monitor":  # the average of every worker's pushes, not the largest average
        def monitor(name: str) -> tuple[str, str] | None:
            return next((k for k in order if f'name="{name}"' in k[1]), None)
        avg, cost, count = monitor("avgPushCost"), monitor("totalPushCostForAvg"), monitor("totalPushCountForAvg")
        if avg is not None and cost is not None and count is not None:
            combined[avg] = combined[cost] // combined[count] if combined[count] > 0 else -1.0
    return [f"{name}{{{labels}}} {_text(combined[(name, labels)])}" if labels
            else f"{name} {_text(combined[(name, labels)])}" for name, labels in order]


def _text(value: float) -> str:
    """A sample value as prometheus_client writes it."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def merge_expositions(parts: Sequence[tuple[int, bytes | None]]) -> bytes:
    """One exposition text (format 0.0.4) for the node from each worker's (index, text or None);
    see the module doc for what is summed, what is the largest and what is labelled by worker."""
    families: dict[str, _Family] = {}
    for worker, body in sorted(parts, key=lambda p: p[0]):
        if body is not None:
            _parse(body.decode("utf-8", "replace"), worker, families)
    out: list[str] = []
    for family in families.values():
        out.extend(family.meta)
        if family.name.startswith(PER_WORKER_PREFIXES):
            for worker in sorted(family.samples):
                for name, labels, value in family.samples[worker]:
                    out.append(f'{name}{{worker="{worker}"{"," + labels if labels else ""}}} {value}')
        else:
            out.extend(_node_samples(family))
    up = UP_FAMILY + "".join(f'shoal_worker_up{{worker="{worker}"}} {1.0 if body is not None else 0.0}\n'
                             for worker, body in sorted(parts, key=lambda p: p[0]))
    return ("\n".join(out) + "\n" + up).encode("utf-8")
