# Stub of the compiled shoal._ext.expiry (ext/expiry.pyx); the spec is shoal.kernels.expiry_py.
from typing_extensions import Buffer

def idle_slots(stamps: Buffer, now_ms: int, idle_ms: int) -> list[int]: ...
def beat_deadlines(
    last_beat: Buffer, unhealthy_after: Buffer, remove_after: Buffer, healthy: Buffer, now_ms: int
) -> tuple[list[int], list[int]]: ...
