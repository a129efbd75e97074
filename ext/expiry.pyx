# cython: language_level=3
# Deadline scans over slot tables; the spec is src/shoal/kernels/expiry_py.py.
from cpython.number cimport PyNumber_Index

cdef long long INT64_MAX = 0x7FFFFFFFFFFFFFFF


def idle_slots(const long long[:] stamps, now_ms, idle_ms):
    # now - stamp >= idle  <=>  stamp <= now - idle. The threshold is computed with Python ints
    # so no C subtraction can overflow; stamps are int64, so clamping it to INT64_MAX is exact.
    threshold_obj = PyNumber_Index(now_ms) - PyNumber_Index(idle_ms)
    cdef list out = []
    if threshold_obj < 0:
        return out
    cdef unsigned long long threshold
    if threshold_obj > INT64_MAX:
        threshold = <unsigned long long>INT64_MAX
    else:
        threshold = <unsigned long long><long long>threshold_obj
    cdef Py_ssize_t i, n = stamps.shape[0]
    for i in range(n):
        # One unsigned compare does both tests: a negative (empty) stamp wraps to >= 2**63,
        # which is above any threshold in [0, INT64_MAX].
        if <unsigned long long>stamps[i] <= threshold:
            out.append(i)
    return out


def beat_deadlines(const long long[:] last_beat, const long long[:] unhealthy_after,
                   const long long[:] remove_after, const unsigned char[:] healthy,
                   now_ms):
    cdef Py_ssize_t i, n = last_beat.shape[0]
    # PyNumber_Index first: a plain `long long now_ms` argument would silently truncate floats.
    cdef long long now = PyNumber_Index(now_ms)
    if not (unhealthy_after.shape[0] == n and remove_after.shape[0] == n and healthy.shape[0] == n):
        raise ValueError(
            "parallel buffers differ in length: "
            f"last_beat={n}, unhealthy_after={unhealthy_after.shape[0]}, "
            f"remove_after={remove_after.shape[0]}, healthy={healthy.shape[0]}"
        )
    cdef list to_unhealthy = []
    cdef list to_remove = []
    # With now < 0 and beat >= 0 the elapsed time is negative, so no non-negative timeout is
    # passed; returning early also keeps now - beat below from ever overflowing.
    if now < 0:
        return to_unhealthy, to_remove
    cdef long long beat, elapsed, remove_ms, unhealthy_ms
    for i in range(n):
        beat = last_beat[i]
        if beat < 0:
            continue
        elapsed = now - beat  # both in [0, INT64_MAX]: cannot overflow
        remove_ms = remove_after[i]
        if remove_ms >= 0 and elapsed > remove_ms:
            to_remove.append(i)
            continue
        unhealthy_ms = unhealthy_after[i]
        if healthy[i] == 1 and unhealthy_ms >= 0 and elapsed > unhealthy_ms:
            to_unhealthy.append(i)
    return to_unhealthy, to_remove
