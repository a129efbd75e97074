# cython: language_level=3, boundscheck=False, wraparound=False
# Nacos gRPC Payload codec: protobuf's wire format written out by hand for the one message
# shape Nacos uses. The spec is src/shoal/kernels/payload_py.py (built on protobuf's own
# parser): every rule below mirrors it, so both accept exactly the same bytes, return the same
# values and raise the same PayloadDecodeError class for everything else.
#
#   Payload  { Metadata metadata = 2; google.protobuf.Any body = 3; }
#   Metadata { string type = 3; map<string, string> headers = 7; string clientIp = 8; }
#   Any      { string type_url = 1; bytes value = 2; }
#   map entry{ string key = 1; string value = 2; }
#
# Decoding never reads outside [start, end) of the input: every read is checked against the end
# of the message it belongs to before it happens. Work is linear in the input; group nesting is
# bounded by MAX_DEPTH, so is the C recursion that skips them.
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_SetItem
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

from collections.abc import Mapping

from shoal.kernels.payload_py import PayloadDecodeError


cdef extern from "Python.h":
    # A new reference, or NULL with UnicodeDecodeError set: checked by hand (see _utf8).
    PyObject* PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    void PyErr_Clear()
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL


# Wire types.
cdef enum:
    VARINT = 0
    I64 = 1
    LEN = 2
    SGROUP = 3
    EGROUP = 4
    I32 = 5

# Nesting of submessages and groups below the Payload that protobuf's parser accepts.
cdef enum:
    MAX_DEPTH = 100

ctypedef const unsigned char* cursor


# encode() has a parameter named `type`, as the protobuf field and the twin's.
cdef object _type_of = type


cdef int _fail(str why) except -1:
    raise PayloadDecodeError(why)


# -- decoding: primitives -----------------------------------------------------------------------

cdef cursor _read_varint5(cursor p, cursor end, uint64_t* out, str what) except NULL:
    """A varint of at most 5 bytes (a tag or a length prefix); ``what`` names it in errors."""
    cdef uint64_t value = 0
    cdef unsigned char byte
    cdef int shift = 0
    while True:
        if p >= end:
            _fail(f"truncated {what}")
        byte = p[0]
        p += 1
        value |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift == 35:
            _fail(f"{what} longer than 5 bytes")
    out[0] = value
    return p


cdef cursor _read_tag(cursor p, cursor end, uint32_t* tag) except NULL:
    """A tag: a varint of at most 5 bytes whose value fits in 32 bits, field number > 0."""
    cdef uint64_t value
    if p >= end:
        _fail("truncated tag")
    if p[0] < 0x80:  # one-byte tags: every field number below 16
        value = p[0]
        p += 1
    else:
        p = _read_varint5(p, end, &value, "tag")
        if value > 0xFFFFFFFF:
            _fail("tag does not fit in 32 bits")
    if value >> 3 == 0:
        _fail("field number 0")
    tag[0] = <uint32_t>value
    return p


cdef cursor _skip_varint(cursor p, cursor end) except NULL:
    """Skip a varint value of at most 10 bytes (its value is not checked, as protobuf's)."""
    cdef int i
    for i in range(10):
        if p >= end:
            _fail("truncated varint")
        if p[0] < 0x80:
            return p + 1
        p += 1
    _fail("varint longer than 10 bytes")
    return NULL


cdef cursor _read_len(cursor p, cursor end, Py_ssize_t* size) except NULL:
    """A length prefix: a varint of at most 5 bytes, no larger than the bytes left."""
    cdef uint64_t value
    p = _read_varint5(p, end, &value, "length")
    if value > <uint64_t>(end - p):
        _fail("length past the end of the message")
    size[0] = <Py_ssize_t>value
    return p


cdef cursor _skip_field(cursor p, cursor end, uint32_t tag, int depth) except NULL:
    """Skip the value of an unknown field whose tag was just read, at nesting ``depth``."""
    cdef int wire_type = tag & 7
    cdef uint32_t inner
    cdef Py_ssize_t size
    if wire_type == VARINT:
        return _skip_varint(p, end)
    if wire_type == LEN:
        p = _read_len(p, end, &size)
        return p + size
    if wire_type == I64:
        if end - p < 8:
            _fail("truncated 64-bit field")
        return p + 8
    if wire_type == I32:
        if end - p < 4:
            _fail("truncated 32-bit field")
        return p + 4
    if wire_type == SGROUP:
        if depth + 1 > MAX_DEPTH:
            _fail("groups nested too deep")
        while True:
            p = _read_tag(p, end, &inner)  # fails at the end: an unterminated group
            if inner & 7 == EGROUP:
                if inner >> 3 != tag >> 3:
                    _fail("end-group tag does not match its start")
                return p
            p = _skip_field(p, end, inner, depth + 1)
    if wire_type == EGROUP:
        _fail("end-group tag outside a group")
    _fail(f"invalid wire type {wire_type}")
    return NULL


cdef inline int _expect_len(uint32_t tag) except -1:
    if tag & 7 != LEN:
        raise PayloadDecodeError(f"field {tag >> 3} has wire type {tag & 7}, expected 2 (length-delimited)")
    return 0


cdef str EMPTY = ""


cdef inline str _utf8(cursor p, Py_ssize_t size):
    if size == 0:
        return EMPTY
    cdef PyObject* text = PyUnicode_DecodeUTF8(<const char*>p, size, NULL)
    if text == NULL:  # UnicodeDecodeError (or MemoryError): no exception machinery on success
        PyErr_Clear()
        raise PayloadDecodeError("string field is not valid UTF-8")
    cdef str result = <str>text  # takes a second reference...
    Py_DECREF(result)  # ...and drops the one PyUnicode_DecodeUTF8 returned
    return result


# -- decoding: the messages ---------------------------------------------------------------------

cdef struct Fields:
    # Where the last body value seen lies in the input (bytes are made once, at the end).
    cursor body
    Py_ssize_t body_size


cdef int _decode_entry(cursor p, cursor end, dict headers) except -1:
    cdef uint32_t tag
    cdef Py_ssize_t size
    cdef str key = EMPTY
    cdef str value = EMPTY
    while p < end:
        p = _read_tag(p, end, &tag)
        if tag >> 3 == 1:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            key = _utf8(p, size)
            p += size
        elif tag >> 3 == 2:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            value = _utf8(p, size)
            p += size
        else:
            p = _skip_field(p, end, tag, 2)
    PyDict_SetItem(headers, key, value)
    return 0


cdef int _decode_metadata(cursor p, cursor end, list out, dict headers) except -1:
    # out = [type, client_ip], updated in place: a later Metadata merges into an earlier one.
    cdef uint32_t tag
    cdef Py_ssize_t size
    while p < end:
        p = _read_tag(p, end, &tag)
        if tag >> 3 == 3:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            out[0] = _utf8(p, size)
            p += size
        elif tag >> 3 == 7:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            _decode_entry(p, p + size, headers)
            p += size
        elif tag >> 3 == 8:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            out[1] = _utf8(p, size)
            p += size
        else:
            p = _skip_field(p, end, tag, 1)
    return 0


cdef int _decode_any(cursor p, cursor end, Fields* fields) except -1:
    cdef uint32_t tag
    cdef Py_ssize_t size
    while p < end:
        p = _read_tag(p, end, &tag)
        if tag >> 3 == 1:  # type_url: validated (protobuf does), then dropped
            _expect_len(tag)
            p = _read_len(p, end, &size)
            _utf8(p, size)
            p += size
        elif tag >> 3 == 2:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            fields.body = p
            fields.body_size = size
            p += size
        else:
            p = _skip_field(p, end, tag, 1)
    return 0


cdef tuple _decode(cursor p, cursor end):
    cdef uint32_t tag
    cdef Py_ssize_t size
    cdef Fields fields
    fields.body = NULL
    fields.body_size = 0
    cdef list out = [EMPTY, EMPTY]
    cdef dict headers = {}
    while p < end:
        p = _read_tag(p, end, &tag)
        if tag >> 3 == 2:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            _decode_metadata(p, p + size, out, headers)
            p += size
        elif tag >> 3 == 3:
            _expect_len(tag)
            p = _read_len(p, end, &size)
            _decode_any(p, p + size, &fields)
            p += size
        else:
            p = _skip_field(p, end, tag, 0)
    cdef bytes body = PyBytes_FromStringAndSize(<const char*>fields.body, fields.body_size)
    return (out[0], headers, out[1], body)


def decode(data):
    """(metadata.type, metadata.headers, metadata.clientIp, body.value) of a serialized Payload.

    Raises PayloadDecodeError on malformed input; see shoal.kernels.payload_py.
    """
    cdef cursor p
    cdef Py_buffer view
    if type(data) is bytes:
        p = <cursor>PyBytes_AS_STRING(data)
        return _decode(p, p + PyBytes_GET_SIZE(data))
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <cursor>view.buf
        return _decode(p, p + view.len)
    finally:
        PyBuffer_Release(&view)


# -- encoding -----------------------------------------------------------------------------------

cdef inline Py_ssize_t _varint_size(uint64_t value) noexcept:
    cdef Py_ssize_t n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


cdef inline char* _put_varint(char* out, uint64_t value) noexcept:
    while value >= 0x80:
        out[0] = <char>((value & 0x7F) | 0x80)
        out += 1
        value >>= 7
    out[0] = <char>value
    return out + 1


cdef inline char* _put_bytes(char* out, unsigned char tag, const char* src, Py_ssize_t size) noexcept:
    out[0] = <char>tag
    out = _put_varint(out + 1, <uint64_t>size)
    memcpy(out, src, size)
    return out + size


cdef inline Py_ssize_t _field_size(Py_ssize_t size) noexcept:
    # tag (one byte for every field here) + length + data
    return 1 + _varint_size(<uint64_t>size) + size


cdef inline const char* _str_utf8(object value, str what, Py_ssize_t* size) except NULL:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, got {_type_of(value).__name__}")
    # ASCII strings hand out their own data; others cache their UTF-8 form on the object.
    # A lone surrogate raises UnicodeEncodeError, as str.encode does.
    return PyUnicode_AsUTF8AndSize(value, size)


def encode(type, body, headers=None, client_ip=""):
    """A serialized Payload: metadata{type, headers, clientIp}, body{value}.

    See shoal.kernels.payload_py.encode, whose bytes these are.
    """
    cdef Py_ssize_t type_size, ip_size, body_size, key_size, value_size
    cdef Py_ssize_t entry_size, metadata_size, any_size, total, pos = 0
    cdef const char* type_data = _str_utf8(type, "type", &type_size)
    cdef const char* body_data
    cdef const char* ip_data
    cdef const char* key_data
    cdef const char* value_data
    cdef Py_buffer view
    cdef bint release = False
    cdef PyObject* key
    cdef PyObject* value
    cdef list items = None
    cdef bytes result
    cdef char* out
    cdef Py_ssize_t i, n
    if PyBytes_CheckExact(body):
        body_data = PyBytes_AS_STRING(body)
        body_size = PyBytes_GET_SIZE(body)
    else:
        PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
        release = True
        body_data = <const char*>view.buf
        body_size = view.len
    try:
        ip_data = _str_utf8(client_ip, "client_ip", &ip_size)
        # Header entries as a flat [key, value, key, value, ...] list in iteration order.
        if headers is not None:
            if PyDict_CheckExact(headers):
                n = len(<dict>headers)
                if n:
                    items = [None] * (2 * n)
                    i = 0
                    while PyDict_Next(headers, &pos, &key, &value):
                        items[i] = <object>key
                        items[i + 1] = <object>value
                        i += 2
            elif isinstance(headers, Mapping):
                items = []
                for k, v in headers.items():
                    items.append(k)
                    items.append(v)
            else:
                raise TypeError(f"headers must be a mapping, got {_type_of(headers).__name__}")
        metadata_size = 0
        if type_size:
            metadata_size += _field_size(type_size)
        if ip_size:
            metadata_size += _field_size(ip_size)
        if items is not None:
            for i in range(0, len(items), 2):
                _str_utf8(items[i], "header name", &key_size)
                _str_utf8(items[i + 1], "header value", &value_size)
                metadata_size += _field_size(_field_size(key_size) + _field_size(value_size))
        any_size = _field_size(body_size) if body_size else 0
        total = _field_size(metadata_size) + _field_size(any_size)

        result = PyBytes_FromStringAndSize(NULL, total)
        out = PyBytes_AS_STRING(result)
        out[0] = 0x12  # field 2 (metadata), length-delimited
        out = _put_varint(out + 1, <uint64_t>metadata_size)
        if type_size:
            out = _put_bytes(out, 0x1A, type_data, type_size)  # field 3 (type)
        if items is not None:
            for i in range(0, len(items), 2):
                key_data = _str_utf8(items[i], "header name", &key_size)  # cached: no work
                value_data = _str_utf8(items[i + 1], "header value", &value_size)
                entry_size = _field_size(key_size) + _field_size(value_size)
                out[0] = 0x3A  # field 7 (headers entry)
                out = _put_varint(out + 1, <uint64_t>entry_size)
                out = _put_bytes(out, 0x0A, key_data, key_size)  # entry field 1 (key)
                out = _put_bytes(out, 0x12, value_data, value_size)  # entry field 2 (value)
        if ip_size:
            out = _put_bytes(out, 0x42, ip_data, ip_size)  # field 8 (clientIp)
        out[0] = 0x1A  # field 3 (body), length-delimited
        out = _put_varint(out + 1, <uint64_t>any_size)
        if body_size:
            out = _put_bytes(out, 0x12, body_data, body_size)  # Any field 2 (value)
        return result
    finally:
        if release:
            PyBuffer_Release(&view)
