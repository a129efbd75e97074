# cython: language_level=3
"""One client-side HTTP/2 session (libnghttp2) making unary gRPC calls.

The counterpart of ``h2grpc.H2Session`` for the calls a node makes to its peers
(``shoal.transport.grpc.native_peer_client``). It knows no sockets: the owner writes what
``output()`` returns and hands what it reads to ``feed(data)``, which returns the events the
bytes produced, in order, as tuples ``(kind, a, b, c, d)``:

* ``EV_DONE``: a call is over: ``(EV_DONE, stream_id, status, message, data)``. ``status`` is
  the gRPC status (0 = OK), ``message`` its text (percent-decoded), ``data`` the answer's one
  message (the 5-byte prefix stripped) or None. A stream the server reset, a GOAWAY that did
  not cover it (REFUSED_STREAM: UNAVAILABLE), an HTTP status other than 200 or a missing
  ``grpc-status`` become statuses as gRPC maps them.
* ``EV_GOAWAY``: the server is going away: ``(EV_GOAWAY, last_stream_id, error_code, None,
  None)``. Calls up to ``last_stream_id`` may still finish; the later ones end REFUSED.

Events produced while writing are kept for ``take_events()``.

``call(headers, message)`` opens one stream: HEADERS (the given request headers) and the
message in DATA frames ending the stream; it returns the stream id. ``cancel(stream_id)``
resets a call (RST_STREAM CANCEL, after a deadline); no event follows for it.

Flow control is nghttp2's (WINDOW_UPDATEs follow consumption); our SETTINGS offer a large
stream window and the connection window is raised to ``4 * window`` so that snapshot pages
(up to ``max_message``, 64 MiB) arrive without a round trip per 64 KB. An answer whose
declared size is over ``max_message`` is refused from its prefix, nothing buffered: the call
ends RESOURCE_EXHAUSTED and its stream is reset. Server push is switched off.

Unlike the server session this one uses nghttp2's own allocator (no shared frame buffer) and
no library internals, so any libnghttp2 with the 1.52 API serves it; it is imported only where
``h2grpc`` (which checks the version) imports too (``shoal.transport.selection``).
"""

from _nghttp2 cimport *
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE, \
    PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy
from libc.stdint cimport int32_t, uint8_t, uint32_t

from urllib.parse import unquote

EV_DONE = 1
EV_GOAWAY = 2

# gRPC status codes
OK = 0
CANCELLED = 1
UNKNOWN = 2
DEADLINE_EXCEEDED = 4
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
UNAUTHENTICATED = 16

#: HTTP/2 RST_STREAM code → gRPC status (gRPC's PROTOCOL-HTTP2 mapping; others: INTERNAL)
_RST_STATUS = {
    NGHTTP2_REFUSED_STREAM: UNAVAILABLE,
    NGHTTP2_CANCEL: CANCELLED,
    NGHTTP2_ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED,
    NGHTTP2_INADEQUATE_SECURITY: PERMISSION_DENIED,
}
#: HTTP status of a response without grpc-status → gRPC status (others: UNKNOWN)
_HTTP_STATUS = {400: INTERNAL, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED, 404: UNIMPLEMENTED,
                429: UNAVAILABLE, 502: UNAVAILABLE, 503: UNAVAILABLE, 504: UNAVAILABLE}


class H2Error(Exception):
    """The session cannot go on (the server broke HTTP/2, or a call could not be submitted)."""


class H2CallbackError(H2Error):
    """One of our nghttp2 callbacks raised (a bug here): the session is over, the callback's
    exception is ``__cause__``."""


cdef class _Call:
    """One unary call: the request being sent, the answer being received."""
    cdef int32_t sid
    # outbound: the 5-byte prefix, then the message
    cdef bytes prefix
    cdef bytes body
    cdef Py_ssize_t sent
    # inbound
    cdef int http_status
    cdef int grpc_status          # -1 until a grpc-status header arrives
    cdef str grpc_message
    cdef int local_status         # -1, or the status we ended the call with ourselves
    cdef str local_message
    cdef bytearray pbuf           # a 5-byte prefix that arrived split
    cdef bytes msg                # the answer being reassembled, allocated at its declared size
    cdef Py_ssize_t filled
    cdef Py_ssize_t need          # body bytes still expected; -1 while reading a prefix
    cdef object data              # the complete answer, or None
    cdef bint cancelled           # reset by the owner: no event

    def __cinit__(self):
        self.grpc_status = -1
        self.local_status = -1
        self.need = -1
        self.data = None
        self.grpc_message = ""
        self.local_message = ""


cdef inline _Call _call_of(H2ClientSession self, int32_t sid):
    return <_Call>self.calls.get(sid)


cdef int _on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                    const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) noexcept:
    cdef H2ClientSession self = <H2ClientSession>user_data
    cdef _Call call
    if frame.hd.type != NGHTTP2_HEADERS:
        return 0
    try:
        call = _call_of(self, frame.hd.stream_id)
        if call is None:
            return 0
        key = (<const char*>name)[:namelen]
        if key == b":status":
            call.http_status = int((<const char*>value)[:valuelen])
        elif key == b"grpc-status":
            call.grpc_status = int((<const char*>value)[:valuelen])
        elif key == b"grpc-message":
            call.grpc_message = unquote((<const char*>value)[:valuelen].decode("utf-8", "replace"))
    except ValueError:  # a status that is no number: the call is malformed, the session is fine
        call.local_status = INTERNAL
        call.local_message = "malformed status header"
    except BaseException as exc:
        return self._callback_failed(exc, "_on_header")
    return 0


cdef int _on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    cdef H2ClientSession self = <H2ClientSession>user_data
    try:
        if frame.hd.type == NGHTTP2_GOAWAY:
            self.goaway_received = True
            self._event((EV_GOAWAY, frame.goaway.last_stream_id, frame.goaway.error_code, None, None))
    except BaseException as exc:
        return self._callback_failed(exc, "_on_frame_recv")
    return 0


cdef int _on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
                        size_t length, void *user_data) noexcept:
    cdef H2ClientSession self = <H2ClientSession>user_data
    cdef _Call call
    try:
        call = _call_of(self, stream_id)
        if call is None or call.local_status >= 0:
            return 0
        self._reassemble(call, <const char*>data, length)
    except BaseException as exc:
        return self._callback_failed(exc, "_on_data_chunk")
    return 0


cdef int _on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                          void *user_data) noexcept:
    cdef H2ClientSession self = <H2ClientSession>user_data
    cdef _Call call
    try:
        call = <_Call>self.calls.pop(stream_id, None)
        if call is not None and not call.cancelled:
            self._event(_outcome(call, error_code))
    except BaseException as exc:
        return self._callback_failed(exc, "_on_stream_close")
    return 0


cdef tuple _outcome(_Call call, uint32_t error_code):
    """The EV_DONE of a closed stream: what status the call ended with, and its answer."""
    cdef int status
    cdef str message
    if call.local_status >= 0:
        status, message = call.local_status, call.local_message
    elif call.grpc_status >= 0:
        status, message = call.grpc_status, call.grpc_message
        if status == OK and (call.data is None or call.need >= 0):
            status, message = INTERNAL, "the answer ended without its message"
    elif error_code != NGHTTP2_NO_ERROR:
        status = _RST_STATUS.get(error_code, INTERNAL)
        message = f"stream reset by the server (HTTP/2 error {error_code})"
    elif call.http_status and call.http_status != 200:
        status = _HTTP_STATUS.get(call.http_status, UNKNOWN)
        message = f"HTTP status {call.http_status}"
    else:
        status, message = INTERNAL, "the answer ended without grpc-status"
    return (EV_DONE, call.sid, status, message, call.data if status == OK else None)


cdef ssize_t _read_body(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                        uint32_t *data_flags, nghttp2_data_source *source, void *user_data) noexcept:
    # The request's DATA: the 5-byte prefix, then the message, copied into nghttp2's frame buffer.
    cdef H2ClientSession self = <H2ClientSession>user_data
    cdef _Call call
    cdef Py_ssize_t total, left, n = 0, take
    try:
        call = _call_of(self, stream_id)
        if call is None:
            data_flags[0] = NGHTTP2_DATA_FLAG_EOF
            return 0
        total = 5 + PyBytes_GET_SIZE(call.body)
        left = <Py_ssize_t>length
        if call.sent < 5:
            take = min(5 - call.sent, left)
            memcpy(buf, PyBytes_AS_STRING(call.prefix) + call.sent, take)
            call.sent += take
            n += take
            left -= take
        if left > 0 and call.sent < total:
            take = min(total - call.sent, left)
            memcpy(buf + n, PyBytes_AS_STRING(call.body) + call.sent - 5, take)
            call.sent += take
            n += take
        if call.sent == total:
            data_flags[0] = NGHTTP2_DATA_FLAG_EOF
            call.prefix = None
            call.body = None  # sent: the request's bytes are not kept until the answer
        return n
    except BaseException as exc:
        return self._callback_failed(exc, "_read_body")


cdef class H2ClientSession:
    """A client HTTP/2 session carrying unary gRPC calls; fed bytes, producing events and bytes."""
    cdef nghttp2_session *session
    cdef readonly dict calls        # stream id → _Call, open calls
    cdef list events
    cdef readonly Py_ssize_t max_message
    cdef readonly bint goaway_received
    cdef bytearray _out
    cdef bint _send_failed
    cdef object _callback_error
    cdef str _callback_name

    def __cinit__(self, Py_ssize_t max_message=64 * 1024 * 1024, int window=16 * 1024 * 1024,
                  int max_header_list=65536):
        cdef nghttp2_session_callbacks *cbs
        cdef nghttp2_settings_entry iv[3]
        cdef int rv
        self.session = NULL
        self.calls = {}
        self.events = None
        self.max_message = max_message
        if nghttp2_session_callbacks_new(&cbs) != 0:
            raise MemoryError()
        nghttp2_session_callbacks_set_on_header_callback(cbs, _on_header)
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, _on_frame_recv)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, _on_data_chunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs, _on_stream_close)
        rv = nghttp2_session_client_new2(&self.session, cbs, <void*>self, NULL)
        nghttp2_session_callbacks_del(cbs)
        if rv != 0:
            raise MemoryError(nghttp2_strerror(rv).decode())
        iv[0].settings_id = NGHTTP2_SETTINGS_ENABLE_PUSH
        iv[0].value = 0
        iv[1].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        iv[1].value = window
        iv[2].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        iv[2].value = max_header_list
        nghttp2_submit_settings(self.session, NGHTTP2_FLAG_NONE, iv, 3)
        nghttp2_session_set_local_window_size(self.session, NGHTTP2_FLAG_NONE, 0, window * 4)

    def __dealloc__(self):
        if self.session != NULL:
            nghttp2_session_del(self.session)
            self.session = NULL

    cdef int _callback_failed(self, BaseException exc, str name) noexcept:
        if self._callback_error is None:
            self._callback_error = exc
            self._callback_name = name
        return NGHTTP2_ERR_CALLBACK_FAILURE

    cdef int _raise_callback_error(self) except -1:
        exc = self._callback_error
        if exc is None:
            return 0
        self._callback_error = None
        nghttp2_session_terminate_session(self.session, NGHTTP2_INTERNAL_ERROR)
        raise H2CallbackError(f"{self._callback_name} raised {type(exc).__name__}: {exc}") from exc

    cdef int _event(self, tuple event) except -1:
        if self.events is None:
            self.events = [event]
        else:
            self.events.append(event)
        return 0

    # --- calls ---------------------------------------------------------------------------
    def call(self, list headers, bytes message):
        """Open a unary call: ``headers`` as ``(name, value)`` bytes pairs (pseudo-headers first),
        then ``message`` as one gRPC message ending the stream. Returns the stream id; H2Error
        when the session takes no new stream (GOAWAY received, ids used up)."""
        cdef Py_ssize_t n = len(headers), i, size = PyBytes_GET_SIZE(message)
        cdef nghttp2_nv nva[16]
        cdef nghttp2_data_provider prd
        cdef _Call call
        cdef int32_t sid
        cdef unsigned char *p
        if n > 16:
            raise ValueError("at most 16 request headers")
        if size > self.max_message:
            raise ValueError(f"message of {size} bytes is over the limit of {self.max_message} bytes")
        for i in range(n):
            _nv(&nva[i], <bytes>headers[i][0], <bytes>headers[i][1])
        call = _Call()
        call.body = message
        call.prefix = PyBytes_FromStringAndSize(NULL, 5)
        p = <unsigned char*>PyBytes_AS_STRING(call.prefix)
        p[0] = 0
        p[1] = (size >> 24) & 0xFF
        p[2] = (size >> 16) & 0xFF
        p[3] = (size >> 8) & 0xFF
        p[4] = size & 0xFF
        prd.source.ptr = NULL
        prd.read_callback = _read_body
        sid = nghttp2_submit_request(self.session, NULL, nva, n, &prd, NULL)
        if sid < 0:
            raise H2Error(nghttp2_strerror(sid).decode())
        call.sid = sid
        self.calls[sid] = call
        return sid

    def cancel(self, int32_t stream_id):
        """Reset a call (RST_STREAM CANCEL): its deadline passed. No event follows for it."""
        cdef _Call call = _call_of(self, stream_id)
        if call is not None:
            call.cancelled = True
            nghttp2_submit_rst_stream(self.session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL)

    def can_open(self):
        """True while new calls may be opened (no GOAWAY received, stream ids left)."""
        return not self.goaway_received and not self._send_failed and \
            nghttp2_session_get_next_stream_id(self.session) < 0x7FFFFF00

    def open_calls(self):
        return len(self.calls)

    # --- input ---------------------------------------------------------------------------
    def feed(self, bytes data):
        """Parse bytes from the server; the events they produced. H2Error on a broken server."""
        cdef ssize_t rv = nghttp2_session_mem_recv(self.session, <const uint8_t*>PyBytes_AS_STRING(data),
                                                   <size_t>PyBytes_GET_SIZE(data))
        events = self.events
        self.events = None
        if self._callback_error is not None:
            self._raise_callback_error()
        if rv < 0:
            nghttp2_session_terminate_session(self.session, NGHTTP2_PROTOCOL_ERROR)
            raise H2Error(nghttp2_strerror(<int>rv).decode())
        return events if events is not None else []

    cdef int _reassemble(self, _Call call, const char *data, Py_ssize_t length) except -1:
        cdef Py_ssize_t have, take, size
        cdef int flag
        cdef const unsigned char *p
        while length > 0:
            if call.need < 0:  # reading a prefix
                if call.data is not None:
                    self._fail(call, INTERNAL, "more than one answer message")
                    return 0
                have = len(call.pbuf) if call.pbuf is not None else 0
                if have == 0 and length >= 5:
                    p = <const unsigned char*>data
                    flag = p[0]
                    size = (<Py_ssize_t>p[1] << 24) | (p[2] << 16) | (p[3] << 8) | p[4]
                    data += 5
                    length -= 5
                else:
                    if call.pbuf is None:
                        call.pbuf = bytearray()
                    take = min(5 - have, length)
                    call.pbuf += data[:take]
                    data += take
                    length -= take
                    if len(call.pbuf) < 5:
                        return 0
                    p = <const unsigned char*>PyByteArray_AS_STRING(call.pbuf)
                    flag = p[0]
                    size = (<Py_ssize_t>p[1] << 24) | (p[2] << 16) | (p[3] << 8) | p[4]
                    call.pbuf = None
                if flag & 1:
                    self._fail(call, INTERNAL, "compressed answer (no grpc-encoding was offered)")
                    return 0
                if size > self.max_message:
                    self._fail(call, RESOURCE_EXHAUSTED,
                               f"answer of {size} bytes is over the limit of {self.max_message} bytes")
                    return 0
                if size <= length:  # the whole answer in this chunk: one copy
                    call.data = PyBytes_FromStringAndSize(data, size)
                    data += size
                    length -= size
                    continue
                call.need = size
                call.msg = PyBytes_FromStringAndSize(NULL, size)
                call.filled = 0
            take = min(call.need, length)
            memcpy(PyBytes_AS_STRING(call.msg) + call.filled, data, take)
            call.filled += take
            data += take
            length -= take
            call.need -= take
            if call.need == 0:
                call.data = call.msg
                call.msg = None
                call.need = -1
        return 0

    cdef void _fail(self, _Call call, int status, str message):
        call.local_status = status
        call.local_message = message
        call.msg = None
        call.pbuf = None
        call.need = -1
        nghttp2_submit_rst_stream(self.session, NGHTTP2_FLAG_NONE, call.sid, NGHTTP2_CANCEL)

    # --- output --------------------------------------------------------------------------
    def output(self):
        """Everything nghttp2 wants to write now, as one bytearray (empty when nothing)."""
        cdef const uint8_t *data
        cdef ssize_t n
        cdef Py_ssize_t have
        cdef bytearray out = None
        if self._send_failed:
            raise H2Error("the session failed while sending")
        while True:
            n = nghttp2_session_mem_send(self.session, &data)
            if n < 0:
                self._send_failed = True
                self._raise_callback_error()
                raise H2Error(nghttp2_strerror(<int>n).decode())
            if n == 0:
                break
            if out is None:
                out = PyByteArray_FromStringAndSize(<const char*>data, n)
            else:
                have = PyByteArray_GET_SIZE(out)
                PyByteArray_Resize(out, have + n)
                memcpy(PyByteArray_AS_STRING(out) + have, data, n)
        if self._callback_error is not None:
            self._send_failed = True
            self._raise_callback_error()
        return out if out is not None else bytearray()

    def take_events(self):
        """Events produced outside ``feed`` (calls ended while writing), or None."""
        if not self.events:
            return None
        events = self.events
        self.events = None
        return events

    def is_done(self):
        """True when the session neither reads nor writes any more."""
        return not nghttp2_session_want_read(self.session) and not nghttp2_session_want_write(self.session)


cdef inline void _nv(nghttp2_nv *nv, bytes name, bytes value):
    nv.name = <uint8_t*>PyBytes_AS_STRING(name)
    nv.namelen = PyBytes_GET_SIZE(name)
    nv.value = <uint8_t*>PyBytes_AS_STRING(value)
    nv.valuelen = PyBytes_GET_SIZE(value)
    nv.flags = NGHTTP2_NV_FLAG_NONE
