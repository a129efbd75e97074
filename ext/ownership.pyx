# cython: language_level=3
# Distro ownership arithmetic (Nacos DistroMapper); the spec is src/shoal/kernels/ownership_py.py.
from cpython.number cimport PyNumber_Index
from cpython.unicode cimport (
    PyUnicode_1BYTE_KIND,
    PyUnicode_2BYTE_KIND,
)
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, uint32_t

from pyunicode cimport Py_UCS1, Py_UCS2, Py_UCS4_t, UnicodeView, unicode_view


cdef long long INT_MAX = 2147483647  # Java Integer.MAX_VALUE


cdef inline uint32_t _java_hash(str s) except? 0xFFFFFFFF:
    # Java String.hashCode over UTF-16 code units: h = 31 * h + unit, wrapping mod 2**32
    # (uint32_t arithmetic wraps by definition in C). The str's code points are read in place;
    # kinds 1 and 2 hold only BMP code points, i.e. exactly one UTF-16 unit each.
    cdef UnicodeView u = unicode_view(s)
    cdef Py_ssize_t i
    cdef const Py_UCS1* p1
    cdef const Py_UCS2* p2
    cdef const Py_UCS4_t* p4
    cdef uint32_t h = 0
    cdef uint32_t c  # not Py_UCS4: Cython treats that as a character type
    if u.kind == PyUnicode_1BYTE_KIND:
        p1 = <const Py_UCS1*>u.data
        for i in range(u.length):
            h = 31u * h + p1[i]
    elif u.kind == PyUnicode_2BYTE_KIND:
        p2 = <const Py_UCS2*>u.data
        for i in range(u.length):
            h = 31u * h + p2[i]
    else:
        p4 = <const Py_UCS4_t*>u.data
        for i in range(u.length):
            c = p4[i]
            if c > 0xFFFF:
                # Astral code point: Java sees the surrogate pair (high, low).
                c -= 0x10000
                h = 31u * h + (0xD800u | (c >> 10))
                c = 0xDC00u | (c & 0x3FFu)
            h = 31u * h + c
    return h


cdef inline long long _distro(uint32_t h) noexcept:
    # abs() of the signed value, taken in 64 bits so that -2**31 has a positive absolute value.
    cdef long long v = <int32_t>h
    if v < 0:
        v = -v
    return v % INT_MAX


cdef inline long long _distro_of(object key) except -1:
    if not isinstance(key, str):
        raise TypeError(f"expected str, got {type(key).__name__}")
    return _distro(_java_hash(<str>key))


def java_hash(s):
    if not isinstance(s, str):
        raise TypeError(f"expected str, got {type(s).__name__}")
    return <int32_t>_java_hash(<str>s)


def distro_hash(s):
    return _distro_of(s)


def owner_indices(keys, n_members):
    n_members = PyNumber_Index(n_members)
    if n_members <= 0:
        raise ValueError(f"n_members must be positive, got {n_members}")
    # distro hashes are below 2**31, so any modulus >= 2**31 leaves them unchanged: clamping to
    # 2**31 is exact and keeps the arithmetic in C.
    cdef long long n = n_members if n_members < 0x80000000 else 0x80000000
    cdef list out = []
    for key in keys:
        out.append(_distro_of(key) % n)
    return out


cdef long long* _member_ids(members, dict ids) except NULL:
    # Map each address to a small int (equal addresses share one id) so owners compare as ints.
    cdef Py_ssize_t i = 0, n = len(members)
    cdef long long* out = <long long*>PyMem_Malloc((n if n > 0 else 1) * sizeof(long long))
    if out == NULL:
        raise MemoryError()
    try:
        for member in members:
            if i >= n:
                raise ValueError("member list changed size during iteration")
            out[i] = ids.setdefault(member, len(ids))
            i += 1
        if i != n:
            raise ValueError("member list changed size during iteration")
    except BaseException:
        PyMem_Free(out)
        raise
    return out


def moved_keys(keys, old_members, new_members):
    for member in (*old_members, *new_members):
        if not isinstance(member, str):
            raise TypeError(f"member addresses must be str, got {type(member).__name__}")
    cdef Py_ssize_t n_old = len(old_members), n_new = len(new_members)
    cdef Py_ssize_t i
    cdef list moved = []
    if n_old == 0 or n_new == 0:
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"expected str, got {type(key).__name__}")
        return [] if n_old == n_new else list(range(len(keys)))
    cdef dict ids = {}
    cdef long long* old_ids = _member_ids(old_members, ids)
    cdef long long* new_ids = NULL
    cdef long long h
    try:
        new_ids = _member_ids(new_members, ids)
        i = 0
        for key in keys:
            h = _distro_of(key)
            if old_ids[h % n_old] != new_ids[h % n_new]:
                moved.append(i)
            i += 1
    finally:
        PyMem_Free(old_ids)
        PyMem_Free(new_ids)
    return moved
