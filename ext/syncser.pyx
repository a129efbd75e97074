# cython: language_level=3
# Client sync batches; the spec (and the wire format) is src/shoal/kernels/syncser_py.py.
# Every check below mirrors the twin's, in the same order, so both raise the same exception
# class for the same bad input and accept exactly the same bytes.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromUnsignedLongLong
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DATA, PyUnicode_GET_LENGTH
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from shoal.kernels.syncser_layout import SyncDecodeError


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    int PyUnicode_READY(object o) except -1
    # Public since 3.11; `le=1` writes/reads IEEE-754 binary64 little-endian on any host.
    int PyFloat_Pack8(double x, char* p, int le) except -1
    double PyFloat_Unpack8(const char* p, int le) except? -1.0
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    int PyGC_Disable()
    int PyGC_Enable()


cdef bytes MAGIC = b"SHSY"
cdef int FORMAT_VERSION = 1
cdef Py_ssize_t HEADER_SIZE = 5
cdef long long REVISION_MAX = 0x7FFFFFFFFFFFFFFF
# Smallest encoded size of each item (see the twin), to bound counts by the bytes left.
cdef Py_ssize_t MIN_CLIENT = 4
cdef Py_ssize_t MIN_SERVICE = 5
cdef Py_ssize_t MIN_INSTANCE = 16
cdef Py_ssize_t MIN_METADATA = 2


# -- encoding -----------------------------------------------------------------------------------

cdef struct Buf:
    char* data
    Py_ssize_t length
    Py_ssize_t capacity


cdef int _reserve(Buf* b, Py_ssize_t extra) except -1:
    if b.length + extra <= b.capacity:
        return 0
    cdef Py_ssize_t capacity = b.capacity * 2
    if capacity < b.length + extra:
        capacity = b.length + extra
    if capacity < 4096:
        capacity = 4096
    cdef char* data = <char*>PyMem_Realloc(b.data, capacity)
    if data == NULL:
        raise MemoryError()
    b.data = data
    b.capacity = capacity
    return 0


cdef inline int _put_u8(Buf* b, unsigned char value) except -1:
    if b.length >= b.capacity:
        _reserve(b, 1)
    b.data[b.length] = <char>value
    b.length += 1
    return 0


cdef inline int _put_uvarint(Buf* b, uint64_t value) except -1:
    if b.length + 10 > b.capacity:
        _reserve(b, 10)
    while value >= 0x80:
        b.data[b.length] = <char>((value & 0x7F) | 0x80)
        b.length += 1
        value >>= 7
    b.data[b.length] = <char>value
    b.length += 1
    return 0


cdef int _put_str(Buf* b, object value, str what) except -1:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, got {type(value).__name__}")
    cdef const char* src
    cdef Py_ssize_t n
    cdef bytes encoded
    PyUnicode_READY(value)
    if PyUnicode_IS_ASCII(value):  # the str's own bytes are its UTF-8 bytes
        src = <const char*>PyUnicode_DATA(value)
        n = PyUnicode_GET_LENGTH(value)
    else:  # raises UnicodeEncodeError on a lone surrogate, as str.encode does
        encoded = PyUnicode_AsUTF8String(value)
        src = PyBytes_AS_STRING(encoded)
        n = PyBytes_GET_SIZE(encoded)
    _put_uvarint(b, <uint64_t>n)
    _reserve(b, n)
    memcpy(b.data + b.length, src, n)
    b.length += n
    return 0


cdef inline bint _check_bool(object value, str what) except -1:
    if value is True:
        return 1
    if value is False:
        return 0
    raise TypeError(f"{what} must be bool, got {type(value).__name__}")


cdef long long _check_int(object value, long long low, long long high, str what) except? -1:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be int, got {type(value).__name__}")
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow != 0 or v < low or v > high:
        raise ValueError(f"{what} out of range [{low}, {high}]: {value}")
    return v


cdef inline tuple _check_tuple(object value, Py_ssize_t arity, str what):
    if not isinstance(value, tuple):
        raise TypeError(f"{what} must be a tuple, got {type(value).__name__}")
    if len(<tuple>value) != arity:
        raise ValueError(f"{what} must have {arity} fields, got {len(<tuple>value)}")
    return <tuple>value


cdef inline object _check_list(object value, str what):
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list or tuple, got {type(value).__name__}")
    return value


cdef int _put_instance(Buf* b, object instance) except -1:
    cdef tuple t = _check_tuple(instance, 9, "instance record")
    _put_str(b, t[0], "ip")
    cdef long long port = _check_int(t[1], 0, 0xFFFF, "port")
    cdef double value
    weight = t[2]
    if isinstance(weight, float):
        value = PyFloat_AS_DOUBLE(weight)
    elif isinstance(weight, int):
        try:
            value = float(weight)
        except OverflowError:
            raise ValueError(f"weight too large for a double: {weight}") from None
    else:
        raise TypeError(f"weight must be float, got {type(weight).__name__}")
    _reserve(b, 11)
    b.data[b.length] = <char>(port & 0xFF)
    b.data[b.length + 1] = <char>(port >> 8)
    PyFloat_Pack8(value, b.data + b.length + 2, 1)
    b.length += 10
    cdef unsigned char flags = _check_bool(t[3], "healthy")
    flags |= _check_bool(t[4], "enabled") << 1
    _put_u8(b, flags)
    _put_str(b, t[5], "cluster")
    _put_str(b, t[6], "instance_id")
    metadata = t[7]
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    _put_uvarint(b, <uint64_t>len(<dict>metadata))
    cdef Py_ssize_t pos = 0
    cdef PyObject* key = NULL
    cdef PyObject* item = NULL
    while PyDict_Next(metadata, &pos, &key, &item):
        # Encoding a str runs no Python code, so the dict cannot change under this walk.
        _put_str(b, <object>key, "metadata key")
        _put_str(b, <object>item, "metadata value")
    cdef long long last_beat = _check_int(t[8], -REVISION_MAX - 1, REVISION_MAX, "last_beat_ms")
    # zigzag: the arithmetic shift spreads the sign bit; computed on uint64 to avoid UB.
    _put_uvarint(b, (<uint64_t>last_beat << 1) ^ <uint64_t>(last_beat >> 63))
    return 0


cdef int _put_service(Buf* b, object service) except -1:
    cdef tuple t = _check_tuple(service, 5, "service record")
    _put_str(b, t[0], "namespace")
    _put_str(b, t[1], "group")
    _put_str(b, t[2], "service")
    _put_u8(b, _check_bool(t[3], "is_batch"))
    instances = _check_list(t[4], "instances")
    _put_uvarint(b, <uint64_t>len(instances))
    for instance in instances:
        _put_instance(b, instance)
    return 0


def encode_batch(records):
    items = _check_list(records, "records")
    cdef Buf b
    b.data = NULL
    b.length = 0
    b.capacity = 0
    cdef tuple t
    try:
        _reserve(&b, 4096)
        memcpy(b.data, PyBytes_AS_STRING(MAGIC), 4)
        b.data[4] = <char>FORMAT_VERSION
        b.length = HEADER_SIZE
        _put_uvarint(&b, <uint64_t>len(items))
        for record in items:
            t = _check_tuple(record, 4, "client record")
            _put_u8(&b, <unsigned char>_check_int(t[0], 0, 0xFF, "op"))
            _put_str(&b, t[1], "client_id")
            _put_uvarint(&b, <uint64_t>_check_int(t[2], 0, REVISION_MAX, "revision"))
            services = _check_list(t[3], "services")
            _put_uvarint(&b, <uint64_t>len(services))
            for service in services:
                _put_service(&b, service)
        return PyBytes_FromStringAndSize(b.data, b.length)
    finally:
        PyMem_Free(b.data)


# -- decoding -----------------------------------------------------------------------------------

# Short ASCII strings repeat heavily in a batch (namespace, group, cluster, metadata keys and
# values, service names). A per-call direct-mapped cache hands out one str object per distinct
# value: fewer allocations, cached hashes for the metadata dicts, and shared memory downstream.
cdef enum:
    CACHE_SLOTS = 1024  # power of two
    CACHE_MAX_LEN = 32


cdef struct Reader:
    const unsigned char* buf
    Py_ssize_t pos
    Py_ssize_t end
    PyObject* cache[CACHE_SLOTS]  # owned references or NULL


cdef inline Py_ssize_t _need(Reader* r, Py_ssize_t n) except -1:
    # Advance past n bytes and return where they start.
    cdef Py_ssize_t start = r.pos
    if n > r.end - start:
        raise SyncDecodeError(f"truncated batch: need {n} bytes at offset {start}")
    r.pos = start + n
    return start


cdef inline unsigned char _u8(Reader* r) except? 0xFF:
    if r.pos >= r.end:
        raise SyncDecodeError(f"truncated batch: need 1 bytes at offset {r.pos}")
    r.pos += 1
    return r.buf[r.pos - 1]


cdef inline uint64_t _uvarint(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef Py_ssize_t start = r.pos
    cdef uint64_t value = 0
    cdef unsigned int shift = 0
    cdef unsigned char byte
    while True:
        if r.pos >= r.end:
            raise SyncDecodeError(f"truncated batch: need 1 bytes at offset {r.pos}")
        byte = r.buf[r.pos]
        r.pos += 1
        # The 10th byte carries bit 63 only; anything more would not fit 64 bits.
        if shift == 63 and byte > 1:
            raise SyncDecodeError(f"varint at offset {start} exceeds 64 bits")
        value |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift != 0:
                raise SyncDecodeError(f"non-minimal varint at offset {start}")
            return value
        shift += 7


cdef inline Py_ssize_t _count(Reader* r, Py_ssize_t min_size, str what) except -1:
    cdef uint64_t n = _uvarint(r)
    # Bound by the bytes left before anything is allocated: every item needs min_size bytes.
    if n > <uint64_t>((r.end - r.pos) // min_size):
        raise SyncDecodeError(f"{what} count {n} exceeds the {r.end - r.pos} bytes left")
    return <Py_ssize_t>n


cdef inline size_t _slot_of(const unsigned char* p, Py_ssize_t n) noexcept:
    # Cheap mix of the length and up to the first and last 8 bytes; collisions only cost a miss.
    cdef uint64_t head = 0, tail = 0
    if n >= 8:
        memcpy(&head, p, 8)
        memcpy(&tail, p + n - 8, 8)
    else:
        memcpy(&head, p, n)
    cdef uint64_t h = (head * 0x9E3779B97F4A7C15ULL) ^ (tail + <uint64_t>n) * 0xC2B2AE3D27D4EB4FULL
    return <size_t>(h >> 54) & (CACHE_SLOTS - 1)


cdef str _string(Reader* r):
    cdef uint64_t n = _uvarint(r)
    if n > <uint64_t>(r.end - r.pos):
        raise SyncDecodeError(f"truncated batch: need {n} bytes at offset {r.pos}")
    cdef Py_ssize_t start = r.pos
    r.pos += <Py_ssize_t>n
    cdef const unsigned char* p = r.buf + start
    cdef size_t slot = 0
    cdef PyObject* hit
    if n <= CACHE_MAX_LEN:
        slot = _slot_of(p, <Py_ssize_t>n)
        hit = r.cache[slot]
        # An ASCII str whose bytes equal these is exactly what decoding them would produce.
        if (hit != NULL and PyUnicode_GET_LENGTH(<object>hit) == <Py_ssize_t>n
                and memcmp(PyUnicode_DATA(<object>hit), p, n) == 0):
            return <str>hit
    try:
        value = PyUnicode_DecodeUTF8(<const char*>p, <Py_ssize_t>n, NULL)
    except UnicodeDecodeError as exc:
        raise SyncDecodeError(f"invalid UTF-8 at offset {start}: {exc.reason}") from None
    if n <= CACHE_MAX_LEN and PyUnicode_IS_ASCII(value):
        Py_XDECREF(r.cache[slot])
        Py_INCREF(value)
        r.cache[slot] = <PyObject*>value
    return value


cdef tuple _read_instance(Reader* r):
    ip = _string(r)
    cdef Py_ssize_t at = _need(r, 10)
    port = <long>r.buf[at] | (<long>r.buf[at + 1] << 8)
    weight = PyFloat_Unpack8(<const char*>r.buf + at + 2, 1)
    cdef unsigned char flags = _u8(r)
    if flags > 3:
        raise SyncDecodeError(f"unknown instance flag bits {flags:#x} at offset {r.pos - 1}")
    cluster = _string(r)
    instance_id = _string(r)
    cdef Py_ssize_t i, n_metadata = _count(r, MIN_METADATA, "metadata")
    cdef dict metadata = {}
    for i in range(n_metadata):
        key = _string(r)
        PyDict_SetItem(metadata, key, _string(r))
    if len(metadata) != n_metadata:
        raise SyncDecodeError("duplicate metadata key")
    cdef uint64_t zigzag = _uvarint(r)
    cdef int64_t last_beat = <int64_t>((zigzag >> 1) ^ (0 - (zigzag & 1)))
    return (ip, port, weight, (flags & 1) != 0, (flags & 2) != 0, cluster, instance_id, metadata,
            last_beat)


cdef tuple _read_service(Reader* r):
    namespace = _string(r)
    group = _string(r)
    name = _string(r)
    cdef unsigned char is_batch = _u8(r)
    if is_batch > 1:
        raise SyncDecodeError(f"is_batch must be 0 or 1, got {is_batch} at offset {r.pos - 1}")
    cdef Py_ssize_t i, n_instances = _count(r, MIN_INSTANCE, "instance")
    cdef list instances = []
    for i in range(n_instances):
        instances.append(_read_instance(r))
    return (namespace, group, name, is_batch == 1, instances)


def decode_batch(data):
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, bytearray or memoryview, got {type(data).__name__}")
    cdef bytes buf = data if type(data) is bytes else bytes(data)
    # A batch builds ~10 tuples/lists per client, all of which survive: with the cyclic GC on,
    # its young collections keep promoting them and trigger full-heap passes mid-decode, which
    # tripled decode time in measurements. Nothing below runs Python bytecode, so the GIL is
    # not released and no other thread can observe the pause; the caller's GC state is restored
    # and the next collection sees the new objects once.
    cdef int gc_was_enabled = PyGC_Disable()
    try:
        return _decode(buf)
    finally:
        if gc_was_enabled:
            PyGC_Enable()


cdef list _decode(bytes buf):
    cdef Reader r
    r.buf = <const unsigned char*>PyBytes_AS_STRING(buf)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(buf)
    memset(r.cache, 0, sizeof(r.cache))
    cdef Py_ssize_t i
    try:
        return _read_batch(&r)
    finally:
        for i in range(CACHE_SLOTS):
            Py_XDECREF(r.cache[i])


cdef int _start_batch(Reader* r) except -1:
    """Check a batch's header (magic, version) and move past it; both readers start here."""
    if r.end < HEADER_SIZE or memcmp(r.buf, PyBytes_AS_STRING(MAGIC), 4) != 0:
        raise SyncDecodeError("not a sync batch (bad magic)")
    if r.buf[4] != FORMAT_VERSION:
        raise SyncDecodeError(f"unsupported sync batch version {r.buf[4]}")
    r.pos = HEADER_SIZE
    return 0


cdef list _read_batch(Reader* r):
    _start_batch(r)
    cdef list records = []
    cdef Py_ssize_t i, j, n_clients = _count(r, MIN_CLIENT, "client"), n_services
    cdef unsigned char op
    cdef uint64_t revision
    cdef list services
    for i in range(n_clients):
        op = _u8(r)
        client_id = _string(r)
        revision = _uvarint(r)
        if revision > <uint64_t>REVISION_MAX:
            raise SyncDecodeError(f"revision {revision} exceeds 2**63 - 1")
        n_services = _count(r, MIN_SERVICE, "service")
        services = []
        for j in range(n_services):
            services.append(_read_service(r))
        records.append((op, client_id, PyLong_FromUnsignedLongLong(revision), services))
    if r.pos != r.end:
        raise SyncDecodeError(f"{r.end - r.pos} trailing bytes after the batch")
    return records


# -- splitting: records with each service left as its bytes (see the twin's split_batch) ---------

cdef inline int _skip_string(Reader* r) except -1:
    cdef uint64_t n = _uvarint(r)
    if n > <uint64_t>(r.end - r.pos):
        raise SyncDecodeError(f"truncated batch: need {n} bytes at offset {r.pos}")
    r.pos += <Py_ssize_t>n
    return 0


cdef int _skip_service(Reader* r) except -1:
    _skip_string(r)
    _skip_string(r)
    _skip_string(r)
    cdef unsigned char is_batch = _u8(r)
    if is_batch > 1:
        raise SyncDecodeError(f"is_batch must be 0 or 1, got {is_batch} at offset {r.pos - 1}")
    cdef Py_ssize_t i, j, n_metadata, n_instances = _count(r, MIN_INSTANCE, "instance")
    cdef unsigned char flags
    for i in range(n_instances):
        _skip_string(r)
        _need(r, 10)
        flags = _u8(r)
        if flags > 3:
            raise SyncDecodeError(f"unknown instance flag bits {flags:#x} at offset {r.pos - 1}")
        _skip_string(r)
        _skip_string(r)
        n_metadata = _count(r, MIN_METADATA, "metadata")
        for j in range(n_metadata):
            _skip_string(r)
            _skip_string(r)
        _uvarint(r)
    return 0


def split_batch(data):
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, bytearray or memoryview, got {type(data).__name__}")
    cdef bytes buf = data if type(data) is bytes else bytes(data)
    cdef Reader r
    r.buf = <const unsigned char*>PyBytes_AS_STRING(buf)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(buf)
    memset(r.cache, 0, sizeof(r.cache))
    cdef Py_ssize_t i
    try:
        return _split_batch(&r)
    finally:
        for i in range(CACHE_SLOTS):
            Py_XDECREF(r.cache[i])


cdef list _split_batch(Reader* r):
    _start_batch(r)
    cdef list records = []
    cdef Py_ssize_t i, j, start, n_clients = _count(r, MIN_CLIENT, "client"), n_services
    cdef unsigned char op
    cdef uint64_t revision
    cdef list services
    for i in range(n_clients):
        op = _u8(r)
        client_id = _string(r)
        revision = _uvarint(r)
        if revision > <uint64_t>REVISION_MAX:
            raise SyncDecodeError(f"revision {revision} exceeds 2**63 - 1")
        n_services = _count(r, MIN_SERVICE, "service")
        services = []
        for j in range(n_services):
            start = r.pos
            _skip_service(r)
            services.append(PyBytes_FromStringAndSize(<const char*>r.buf + start, r.pos - start))
        records.append((op, client_id, PyLong_FromUnsignedLongLong(revision), services))
    if r.pos != r.end:
        raise SyncDecodeError(f"{r.end - r.pos} trailing bytes after the batch")
    return records
