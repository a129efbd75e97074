"""Instance ids as Nacos generates them (InstanceIdGeneratorManager; docs/protocol.md §3.6).

An instance registered without an ``instanceId`` gets one from the generator its metadata names
in ``preserved.instance.id.generator``:

* ``simple`` (the default, also for an unknown name): ``ip#port#cluster#group@@service``;
* ``snowflake``: ``<id>#cluster#group@@service`` where ``<id>`` is a 64-bit snowflake
  (SnowFlowerIdGenerator): milliseconds since 2018-08-05T00:34:00Z (Nacos's epoch
  1533429240000) shifted left 22, a 10-bit worker id shifted left 12, a 12-bit sequence within
  the millisecond. The worker id is ``nacos.core.snowflake.worker-id``, or when it is -1 (the
  default) the low 10 bits of the node's IPv4 address, as Nacos derives it; the clock is the wall clock at start plus
  the monotonic time since, so ids never go backwards while the node runs.

Like Nacos, each registration without an id generates a new one (the id is then kept with the
instance, replicated with it and answered to every query).
"""

from __future__ import annotations

import socket
import threading
import time

from shoal.model.instance import INSTANCE_ID_GENERATOR_KEY, InstanceInfo, generate_instance_id

#: Nacos's generator names (the metadata key is PreservedMetadataKeys.INSTANCE_ID_GENERATOR).
SIMPLE, SNOWFLAKE = "simple", "snowflake"
SPLITTER = "#"

EPOCH_MS = 1533429240000
WORKER_ID_BITS, SEQUENCE_BITS = 10, 12
MAX_WORKER_ID = (1 << WORKER_ID_BITS) - 1
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1


def local_worker_id() -> int:
    """The low 10 bits of this host's outward IPv4 address (no packet is sent, no name resolved);
    0 when it has none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # a UDP connect only picks the route's source address
            address = s.getsockname()[0]
    except OSError:
        return 0
    octets = socket.inet_aton(address)
    return ((octets[-2] & 0b11) << 8) + octets[-1]


class Snowflake:
    """Nacos's SnowFlowerIdGenerator: unique, increasing 64-bit ids for one worker id."""

    def __init__(self, worker_id: int) -> None:
        if not 0 <= worker_id <= MAX_WORKER_ID:
            raise ValueError(f"worker id must be between 0 and {MAX_WORKER_ID}, got {worker_id}")
        self.worker_id = worker_id
        self._wall_start_ms = time.time_ns() // 1_000_000
        self._mono_start_ns = time.monotonic_ns()
        self._last_ms = -1
        self._sequence = 0
        self._lock = threading.Lock()  # registrations come from the loop; the lock is never contended there

    def _now_ms(self) -> int:
        return self._wall_start_ms + (time.monotonic_ns() - self._mono_start_ns) // 1_000_000

    def next_id(self) -> int:
        with self._lock:
            now = self._now_ms()
            if now == self._last_ms:
                self._sequence = (self._sequence + 1) & SEQUENCE_MASK
                if self._sequence == 0:  # 4096 ids in this millisecond: wait for the next one
                    while now <= self._last_ms:
                        now = self._now_ms()
            else:
                self._sequence = 0
            self._last_ms = now
            return ((now - EPOCH_MS) << (WORKER_ID_BITS + SEQUENCE_BITS)) | (self.worker_id << SEQUENCE_BITS) \
                | self._sequence


_snowflake: Snowflake | None = None


def configure(worker_id: int) -> None:
    """Use ``worker_id`` (``nacos.core.snowflake.worker-id``; -1: from the node's IPv4 address)."""
    global _snowflake
    _snowflake = Snowflake(worker_id if worker_id >= 0 else local_worker_id())


def snowflake() -> Snowflake:
    """The process's generator (from the node's address on first use, unless :func:`configure` ran)."""
    global _snowflake
    if _snowflake is None:
        _snowflake = Snowflake(local_worker_id())
    return _snowflake


def new_instance_id(inst: InstanceInfo, cluster: str, grouped_service: str) -> str:
    """The id the generator named in the instance's metadata gives it (Nacos's generators)."""
    if inst.metadata.get(INSTANCE_ID_GENERATOR_KEY) == SNOWFLAKE:
        return SPLITTER.join((str(snowflake().next_id()), cluster, grouped_service))
    return generate_instance_id(inst.ip, inst.port, cluster, grouped_service)
