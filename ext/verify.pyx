# cython: language_level=3
# Distro verify digests; the spec (and the wire contract) is src/shoal/kernels/verify_py.py.
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.number cimport PyNumber_Index
from cpython.unicode cimport (
    PyUnicode_1BYTE_KIND,
    PyUnicode_2BYTE_KIND,
)
from libc.stdint cimport uint64_t

from pyunicode cimport Py_UCS1, Py_UCS2, Py_UCS4_t, PyUnicode_IS_ASCII, UnicodeView, unicode_view


cdef uint64_t FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t FNV_PRIME = 0x100000001B3ULL
cdef uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL


cdef inline uint64_t _fnv_cp(uint64_t h, uint64_t c) noexcept:
    # Feed the UTF-8 encoding of code point c (not a surrogate) into FNV-1a, byte by byte,
    # without materialising the encoded bytes. uint64_t products wrap mod 2**64 by definition.
    if c < 0x80:
        return (h ^ c) * FNV_PRIME
    if c < 0x800:
        h = (h ^ (0xC0 | (c >> 6))) * FNV_PRIME
    else:
        if c < 0x10000:
            h = (h ^ (0xE0 | (c >> 12))) * FNV_PRIME
        else:
            h = (h ^ (0xF0 | (c >> 18))) * FNV_PRIME
            h = (h ^ (0x80 | ((c >> 12) & 0x3F))) * FNV_PRIME
        h = (h ^ (0x80 | ((c >> 6) & 0x3F))) * FNV_PRIME
    return (h ^ (0x80 | (c & 0x3F))) * FNV_PRIME


cdef uint64_t _fnv(object cid) except? 0:
    if not isinstance(cid, str):
        raise TypeError(f"client ids must be str, got {type(cid).__name__}")
    cdef UnicodeView u = unicode_view(cid)
    cdef Py_ssize_t i
    cdef const Py_UCS1* p1
    cdef const Py_UCS2* p2
    cdef const Py_UCS4_t* p4
    cdef uint64_t c, h = FNV_OFFSET
    if u.kind == PyUnicode_1BYTE_KIND:
        p1 = <const Py_UCS1*>u.data
        if PyUnicode_IS_ASCII(cid):  # the str's bytes are its UTF-8 bytes
            for i in range(u.length):
                h = (h ^ p1[i]) * FNV_PRIME
        else:
            for i in range(u.length):
                h = _fnv_cp(h, p1[i])
        return h
    if u.kind == PyUnicode_2BYTE_KIND:
        p2 = <const Py_UCS2*>u.data
        for i in range(u.length):
            c = p2[i]
            if 0xD800 <= c <= 0xDFFF:
                break
            h = _fnv_cp(h, c)
        else:
            return h
    else:
        p4 = <const Py_UCS4_t*>u.data
        for i in range(u.length):
            c = p4[i]
            if 0xD800 <= c <= 0xDFFF:
                break
            h = _fnv_cp(h, c)
        else:
            return h
    # A lone surrogate cannot be UTF-8 encoded: raise exactly what str.encode raises.
    cid.encode("utf-8")
    raise AssertionError("unreachable: str.encode accepted a surrogate")


cdef inline uint64_t _splitmix64(uint64_t z) noexcept:
    z += GOLDEN
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


def fnv1a64(client_id):
    return PyLong_FromUnsignedLongLong(_fnv(client_id))


def splitmix64(z):
    # Python ints of any size: only the value mod 2**64 matters.
    cdef uint64_t v = <uint64_t>(PyNumber_Index(z) & 0xFFFFFFFFFFFFFFFF)
    return PyLong_FromUnsignedLongLong(_splitmix64(v))


cdef object _check_buckets(n_buckets):
    n_buckets = PyNumber_Index(n_buckets)
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be at least 1, got {n_buckets}")
    return n_buckets


def bucket_of(client_ids, n_buckets):
    n_buckets = _check_buckets(n_buckets)
    # fnv < 2**64, so a modulus of 2**64 or more leaves it unchanged.
    cdef bint reduce = n_buckets <= 0xFFFFFFFFFFFFFFFF
    cdef uint64_t n = <uint64_t>n_buckets if reduce else 0
    cdef list out = []
    cdef uint64_t h
    for cid in client_ids:
        h = _fnv(cid)
        out.append(PyLong_FromUnsignedLongLong(h % n if reduce else h))
    return out


def bucket_digests(client_ids, revisions, n_buckets):
    cdef Py_ssize_t n = _check_buckets(n_buckets)
    cdef Py_ssize_t count = len(client_ids)
    if count != len(revisions):
        raise ValueError(f"client_ids and revisions differ in length: {count} != {len(revisions)}")
    # Index lists/tuples directly; other sized iterables (the twin zips them) are copied once.
    ids = client_ids if isinstance(client_ids, (list, tuple)) else list(client_ids)
    revs = revisions if isinstance(revisions, (list, tuple)) else list(revisions)
    if len(ids) != count or len(revs) != count:
        raise ValueError("client_ids or revisions changed length while being read")
    cdef uint64_t* acc = <uint64_t*>PyMem_Calloc(n, sizeof(uint64_t))
    if acc == NULL:
        raise MemoryError()
    cdef Py_ssize_t i
    cdef long long revision
    cdef int overflow = 0
    cdef uint64_t h
    cdef list out
    try:
        for i in range(count):
            rev_obj = PyNumber_Index(revs[i])
            revision = PyLong_AsLongLongAndOverflow(rev_obj, &overflow)
            if overflow != 0 or revision < 0:
                raise ValueError(f"revision out of range [0, 2**63 - 1]: {rev_obj}")
            h = _fnv(ids[i])
            # Unsigned 64-bit arithmetic below: the products and the sum wrap mod 2**64.
            acc[h % <uint64_t>n] += _splitmix64(h ^ (<uint64_t>revision * GOLDEN))
        out = [PyLong_FromUnsignedLongLong(acc[i]) for i in range(n)]
    finally:
        PyMem_Free(acc)
    return out


# --- sorted uint64 arrays: the detail phase of verify ----------------------------------------
from cpython.long cimport PyLong_AsUnsignedLongLong
from cpython.mem cimport PyMem_Malloc
from cpython.array cimport array as c_array
import array as _array_mod


cdef unsigned long long* _sorted_u64(object values, str name, Py_ssize_t* count) except NULL:
    # A C copy of ``values`` after the twin's checks, in the twin's order: each value an int in
    # [0, 2**64) (TypeError / ValueError), then non-decreasing (ValueError).
    return _copy_u64(values, name, count, True)


cdef unsigned long long* _unsorted_u64(object values, str name, Py_ssize_t* count) except NULL:
    return _copy_u64(values, name, count, False)


cdef unsigned long long* _copy_u64(object values, str name, Py_ssize_t* count, bint sorted_) except NULL:
    # One copy path for both: an array('Q') through a typed view, anything else item by item.
    cdef Py_ssize_t i, n
    cdef unsigned long long v, prev = 0
    cdef unsigned long long* out
    cdef unsigned long long[::1] view
    cdef bint is_q = isinstance(values, c_array) and (<c_array>values).ob_descr.typecode == b'Q'
    seq = None
    if is_q:
        view = values
        n = view.shape[0]
    else:
        seq = values if isinstance(values, (list, tuple)) else list(values)
        n = len(seq)
    out = <unsigned long long*>PyMem_Malloc((n if n > 0 else 1) * sizeof(unsigned long long))
    if out == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            if is_q:
                v = view[i]
            else:
                item = PyNumber_Index(seq[i])
                try:
                    v = PyLong_AsUnsignedLongLong(item)
                except OverflowError:
                    raise ValueError(f"{name}[{i}] out of range [0, 2**64 - 1]: {item}") from None
            if sorted_ and v < prev:
                raise ValueError(f"{name} is not sorted at position {i}")
            out[i] = v
            prev = v
    except BaseException:
        PyMem_Free(out)
        raise
    count[0] = n
    return out


def diff_sorted(a, b):
    cdef Py_ssize_t na = 0, nb = 0, i = 0, j = 0
    cdef unsigned long long* xs = _sorted_u64(a, "a", &na)
    cdef unsigned long long* ys = NULL
    cdef list only_a = [], only_b = []
    try:
        ys = _sorted_u64(b, "b", &nb)
        while i < na and j < nb:
            if xs[i] == ys[j]:
                i += 1
                j += 1
            elif xs[i] < ys[j]:
                only_a.append(PyLong_FromUnsignedLongLong(xs[i]))
                i += 1
            else:
                only_b.append(PyLong_FromUnsignedLongLong(ys[j]))
                j += 1
        while i < na:
            only_a.append(PyLong_FromUnsignedLongLong(xs[i]))
            i += 1
        while j < nb:
            only_b.append(PyLong_FromUnsignedLongLong(ys[j]))
            j += 1
    finally:
        PyMem_Free(xs)
        if ys != NULL:
            PyMem_Free(ys)
    return only_a, only_b


def salted32(values, salt):
    cdef uint64_t s = <uint64_t>(PyNumber_Index(salt) & 0xFFFFFFFFFFFFFFFF)
    cdef uint64_t v
    cdef list out = []
    for value in values:
        item = PyNumber_Index(value)
        try:
            v = PyLong_AsUnsignedLongLong(item)
        except OverflowError:
            raise ValueError(f"value out of range [0, 2**64 - 1]: {item}") from None
        out.append(PyLong_FromUnsignedLongLong(_splitmix64(v ^ s) >> 32))
    return out


def sub_keys(fnvs, terms, n_buckets, k, salt):
    cdef Py_ssize_t count = len(fnvs)
    if count != len(terms):
        raise ValueError(f"fnvs and terms differ in length: {count} != {len(terms)}")
    n_obj = _check_buckets(n_buckets)
    k_obj = _check_buckets(k)
    if n_obj * k_obj > 0xFFFFFFFF:
        raise ValueError(f"n_buckets * k must be below 2**32, got {n_obj * k_obj}")
    cdef uint64_t n = <uint64_t>n_obj, kk = <uint64_t>k_obj
    cdef uint64_t s = <uint64_t>(PyNumber_Index(salt) & 0xFFFFFFFFFFFFFFFF)
    cdef Py_ssize_t na = 0, nt = 0, i
    cdef unsigned long long* fs = _unsorted_u64(fnvs, "fnvs", &na)
    cdef unsigned long long* ts = NULL
    cdef uint64_t f
    cdef list out = []
    try:
        ts = _unsorted_u64(terms, "terms", &nt)
        for i in range(count):
            f = fs[i]
            out.append(PyLong_FromUnsignedLongLong(
                (((f % n) * kk + (f // n) % kk) << 32) | (_splitmix64(ts[i] ^ s) >> 32)))
    finally:
        PyMem_Free(fs)
        if ts != NULL:
            PyMem_Free(ts)
    return out


