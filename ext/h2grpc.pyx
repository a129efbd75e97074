# cython: language_level=3
"""One server-side HTTP/2 session (libnghttp2) speaking gRPC framing.

``feed(data)`` parses what the peer sent and returns the events it produced, in order, as
tuples ``(kind, stream_id, a, b)``:

* ``EV_HEADERS``: a new request stream; ``a`` is the ``:path``, ``b`` a dict of the other
  headers (lower-case names, ``grpc-timeout``, ``grpc-encoding``, ``content-type``...).
* ``EV_MESSAGE``: one complete gRPC message (the 5-byte prefix stripped, reassembled across
  DATA frames); ``a`` is its bytes.
* ``EV_HALF_CLOSE``: the client ended its side of the stream.
* ``EV_CLOSED``: the stream is gone (``a`` = the HTTP/2 error code: 0 after a normal end,
  else the peer's RST_STREAM code or ours).
* ``EV_FAILED``: the session itself ended the call (``a`` = gRPC status, ``b`` = message).

Events raised while writing (a stream closing once its END_STREAM went out) are kept for
``take_events()``.

A message whose declared size is over the limit is answered RESOURCE_EXHAUSTED without
buffering it; a compressed message is answered UNIMPLEMENTED (we never offer compression).
Both end the stream; its later DATA is dropped. PING, SETTINGS and flow control are
nghttp2's (window updates follow consumption automatically).

Abuse limits (docs/native-transport.md), each a constructor argument:

* ``max_concurrent_streams`` and ``max_header_list`` are advertised in our SETTINGS; a stream
  over the first is refused by nghttp2 (REFUSED_STREAM while the peer has not ACKed our
  SETTINGS, a connection PROTOCOL_ERROR after), a header list over the second is reset.
* ``reset_burst``/``reset_rate``: the token bucket of nghttp2's rapid-reset guard
  (CVE-2023-44487): each RST_STREAM from the peer takes a token; none left means GOAWAY.
* ``max_outbound_ack``: PING/SETTINGS ACKs queued and unsent (a flood) before nghttp2 ends the
  session; ``max_settings``: entries accepted in one SETTINGS frame.
* ``max_continuations``: CONTINUATION frames after one HEADERS (CVE-2024-28182). nghttp2 1.52
  has no such bound, and it decodes the CONTINUATIONs of a header block it already refused
  without calling back at all, so ``feed`` counts them itself in a scan of the frame headers
  before nghttp2 sees the bytes; past the bound the session ends with GOAWAY
  ENHANCE_YOUR_CALM and nothing more is read.
* ``max_read_buffer``: bytes of unfinished messages the connection may hold across its
  streams (a message reserves its declared size when its prefix arrives); a message that
  does not fit is answered RESOURCE_EXHAUSTED like one over ``max_message``. At least one
  message of ``max_message`` bytes always fits.

Whichever of these ends the session sets ``abuse`` to a reason and queues a GOAWAY; the
owner writes ``pending_output()`` and closes the connection. Bytes that are not HTTP/2
at all raise ``H2Error`` from ``feed`` (a GOAWAY is queued first).

Replies: ``send_message`` queues one message (sending the response headers first when
needed), ``send_trailers`` ends the stream with a status (a trailers-only response when no
message was sent), ``reply`` does both for a unary call. ``pending_output()`` returns the
bytes to write to the socket.
"""

from _nghttp2 cimport *
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE,
                                 PyByteArray_Resize)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy
from libc.stdint cimport int32_t, uint8_t, uint32_t

EV_HEADERS = 1
EV_MESSAGE = 2
EV_HALF_CLOSE = 3
EV_CLOSED = 4
EV_FAILED = 5

cdef enum:
    _PREFACE_LEN = 24  # "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", skipped by H2Session._scan
    _SMALL = 1024      # output pieces shorter than this are copied together; longer ones are not copied
    _FRAMEBUF_CHUNK = 16394  # NGHTTP2_FRAMEBUF_CHUNKLEN: frame header + pad byte + 16384 payload bytes

# gRPC status codes used here
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14


# --- one outbound frame buffer for every session ---------------------------------------------
# Each nghttp2 session allocates a 16 KB buffer (its first "framebufs" chunk) that it serializes
# every outgoing frame into, and that it uses only inside nghttp2_session_mem_send: the frame is
# packed there, handed to us and copied out (``output_parts`` copies every piece at once, and the
# header of a NO_COPY DATA frame in ``_send_data``) before the next one is packed, and once
# mem_send has returned 0 the session holds nothing in it. Touched, that is a 4 KB page per
# connection (a fifth of an idle connection's memory, which docs/native-transport.md bounds at 20 KB).
# So all sessions get the same static buffer through nghttp2's allocator hooks: sessions are only
# driven while holding the GIL and no Python code runs inside mem_send, so only one session uses
# it at a time (``output_parts`` refuses to be re-entered, and a session whose mem_send failed,
# which may have left a frame half sent in it, never calls mem_send again). Further chunks (a
# header block over 16 KB) are ordinary per-session allocations.
cdef char _framebuf[_FRAMEBUF_CHUNK]
cdef bint _framebuf_offered = False  # set while a session is created: its first chunk is _framebuf
cdef bint _framebuf_taken = False    # that session took it
cdef bint _sending = False           # some session is inside output_parts


cdef extern from "<malloc.h>":
    size_t malloc_usable_size(void *ptr) nogil

cdef size_t _lib_bytes = 0  # bytes nghttp2 holds now (usable sizes), for library_bytes()


cdef void *_mem_malloc(size_t size, void *mem_user_data) noexcept nogil:
    global _lib_bytes
    cdef void *p = malloc(size)
    if p != NULL:
        _lib_bytes += malloc_usable_size(p)
    return p


cdef void _mem_free(void *ptr, void *mem_user_data) noexcept nogil:
    global _lib_bytes
    if ptr != NULL and ptr != <void*>_framebuf:
        _lib_bytes -= malloc_usable_size(ptr)
        free(ptr)


cdef void *_mem_calloc(size_t nmemb, size_t size, void *mem_user_data) noexcept nogil:
    global _lib_bytes
    cdef void *p = calloc(nmemb, size)
    if p != NULL:
        _lib_bytes += malloc_usable_size(p)
    return p


cdef void *_mem_realloc(void *ptr, size_t size, void *mem_user_data) noexcept nogil:
    global _framebuf_offered, _framebuf_taken, _lib_bytes
    cdef void *fresh
    cdef size_t before
    if ptr == NULL and _framebuf_offered and size == _FRAMEBUF_CHUNK:
        _framebuf_offered = False
        _framebuf_taken = True
        return <void*>_framebuf
    if ptr == <void*>_framebuf:  # never done by nghttp2 1.52 for this chunk; a private copy if it ever is
        fresh = malloc(size)
        if fresh != NULL:
            memcpy(fresh, ptr, size if size < _FRAMEBUF_CHUNK else _FRAMEBUF_CHUNK)
            _lib_bytes += malloc_usable_size(fresh)
        return fresh
    before = malloc_usable_size(ptr) if ptr != NULL else 0
    fresh = realloc(ptr, size)
    if fresh != NULL:
        _lib_bytes += malloc_usable_size(fresh) - before
    elif size == 0:  # realloc(p, 0) freed p
        _lib_bytes -= before
    return fresh


def library_bytes():
    """Bytes libnghttp2 holds now across every session (heap blocks, shared frame buffer not
    counted): what a test bounds, since tracemalloc does not see C allocations."""
    return _lib_bytes


cdef nghttp2_mem _mem
_mem.mem_user_data = NULL
_mem.malloc = _mem_malloc
_mem.free = _mem_free
_mem.calloc = _mem_calloc
_mem.realloc = _mem_realloc


# --- the library linked at run time ------------------------------------------------------------
# The shared frame buffer above relies on how nghttp2 1.52 allocates and uses its first framebufs
# chunk, and feed()'s CONTINUATION scan stands in for a bound 1.52 lacked: another version may
# allocate differently (a silent memory corruption) or bound CONTINUATIONs itself. So the module
# refuses, at import, a library it was not tested with (docs/native-transport.md, "Library
# version"); the node then explains the refusal and grpc.aio still serves the gRPC ports.
#: version_num (0xMMmmpp) -> version tested with this module
TESTED_LIBRARY_VERSIONS = {0x013400: "1.52.0"}
cdef nghttp2_info *_lib_info = nghttp2_version(0)
LIBRARY_VERSION = (<bytes>_lib_info.version_str).decode("ascii", "replace")
LIBRARY_VERSION_NUM = _lib_info.version_num


def check_library(int version_num, str version):
    """ImportError, saying why and what to do, unless ``version_num`` was tested."""
    if version_num not in TESTED_LIBRARY_VERSIONS:
        tested = ", ".join(sorted(TESTED_LIBRARY_VERSIONS.values()))
        raise ImportError(
            f"shoal._ext.h2grpc was tested with libnghttp2 {tested} only, and this process loaded "
            f"libnghttp2 {version}: the native gRPC transport relies on that version's allocation of its "
            f"outbound frame buffer and works around its CONTINUATION handling (docs/native-transport.md). "
            f"Run the gRPC ports on grpc.aio (-D shoal.remote.transport=grpcio), or install libnghttp2 {tested} "
            f"and rebuild the extension.")


check_library(LIBRARY_VERSION_NUM, LIBRARY_VERSION)


class H2Error(Exception):
    """The peer broke HTTP/2 (bad preface, protocol error): the connection must be closed."""


class H2CallbackError(H2Error):
    """One of our nghttp2 callbacks raised (a bug here, not the peer's doing): the session is
    over (a GOAWAY INTERNAL_ERROR is queued) and the callback's exception is ``__cause__``."""


cdef bytes _percent_encode(str message):
    cdef bytes raw = message.encode("utf-8", "replace")
    cdef bytearray out = bytearray()
    cdef unsigned char c
    for c in raw:
        if 0x20 <= c <= 0x7E and c != 0x25:
            out.append(c)
        else:
            out += b"%%%02X" % c
    return bytes(out)


_STATUS_OK = b"0"


cdef inline bytes _status_bytes(int status):
    return _STATUS_OK if status == 0 else str(status).encode()


cdef class _Stream:
    """Per-stream state: inbound reassembly and the outbound message queue."""
    cdef int32_t sid
    cdef dict headers
    cdef Py_ssize_t header_bytes
    # inbound
    cdef bytearray buf        # the bytes of a 5-byte prefix that arrived split
    cdef bytes msg            # the message being reassembled: allocated at its declared size, filled in place
    cdef Py_ssize_t filled    # bytes of msg received so far
    cdef Py_ssize_t need      # body bytes still expected; -1 while reading the 5-byte prefix
    cdef bint discard         # answered with an error: drop further DATA
    cdef Py_ssize_t reserved  # bytes of the read buffer reserved for the message being reassembled
    # outbound
    cdef list out             # queued bytes objects (None once sent, before out_head)
    cdef Py_ssize_t out_head  # index of the first unsent object in out
    cdef Py_ssize_t out_off   # offset into out[out_head]
    cdef Py_ssize_t out_bytes # unsent bytes in out
    cdef bint headers_sent
    cdef bint deferred
    cdef bint trailer_due
    cdef bint ended           # trailers submitted
    cdef int status
    cdef str message

    def __cinit__(self, int32_t sid):
        self.sid = sid
        self.headers = {}
        self.header_bytes = 0
        self.buf = None  # created when a prefix arrives split (most arrive whole)
        self.msg = None  # created when a message arrives split
        self.need = -1
        self.out = None  # created by the first message sent
        self.out_head = 0
        self.out_off = 0
        self.out_bytes = 0


cdef int _on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    cdef H2Session self = <H2Session>user_data
    if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
        try:
            self.streams[frame.hd.stream_id] = _Stream(frame.hd.stream_id)
        except BaseException as exc:
            return self._callback_failed(exc, "_on_begin_headers")
    return 0


cdef int _on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                    const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) noexcept:
    cdef H2Session self = <H2Session>user_data
    cdef _Stream st
    if frame.hd.type != NGHTTP2_HEADERS or frame.headers.cat != NGHTTP2_HCAT_REQUEST:
        return 0  # client trailers carry nothing we use
    try:
        st = self.streams.get(frame.hd.stream_id)
        if st is None:
            return 0
        st.header_bytes += namelen + valuelen + 32
        if st.header_bytes > self.max_header_list:
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE  # resets this stream only
        st.headers[(<const char*>name)[:namelen].decode("latin-1")] = \
            (<const char*>value)[:valuelen].decode("utf-8", "replace")
    except BaseException as exc:
        return self._callback_failed(exc, "_on_header")
    return 0


cdef int _on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    cdef H2Session self = <H2Session>user_data
    cdef _Stream st
    cdef int32_t sid = frame.hd.stream_id
    try:
        if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
            st = self.streams.get(sid)
            if st is not None:
                path = st.headers.pop(":path", "")
                self._event((EV_HEADERS, sid, path, st.headers))
                st.headers = None
        elif frame.hd.type == NGHTTP2_GOAWAY:
            self.peer_goaway = True
        elif frame.hd.type == NGHTTP2_SETTINGS:
            self.preface_received = True
        if (frame.hd.type == NGHTTP2_DATA or frame.hd.type == NGHTTP2_HEADERS) and \
                frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
            st = self.streams.get(sid)
            if st is not None and not st.discard:
                self._event((EV_HALF_CLOSE, sid, None, None))
    except BaseException as exc:
        return self._callback_failed(exc, "_on_frame_recv")
    return 0


cdef int _on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
                        size_t length, void *user_data) noexcept:
    cdef H2Session self = <H2Session>user_data
    cdef _Stream st
    try:
        st = self.streams.get(stream_id)
        if st is None or st.discard:
            return 0
        self._reassemble(st, <const char*>data, length)
    except BaseException as exc:
        return self._callback_failed(exc, "_on_data_chunk")
    return 0


cdef int _on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                          void *user_data) noexcept:
    cdef H2Session self = <H2Session>user_data
    try:
        st = self.streams.pop(stream_id, None)
        if st is not None:
            self.backlog -= (<_Stream>st).out_bytes
            self._release(<_Stream>st)
            self._event((EV_CLOSED, stream_id, error_code, None))
    except BaseException as exc:
        return self._callback_failed(exc, "_on_stream_close")
    return 0


cdef ssize_t _read_data(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                        uint32_t *data_flags, nghttp2_data_source *source, void *user_data) noexcept:
    # Zero copy: this only sizes the next DATA frame; _send_data writes its bytes (straight from
    # the queued messages) when nghttp2 sends it, within the same nghttp2_session_mem_send call.
    cdef H2Session self = <H2Session>user_data
    cdef _Stream st
    cdef Py_ssize_t take
    try:
        st = self.streams.get(stream_id)
        if st is None:
            data_flags[0] = NGHTTP2_DATA_FLAG_EOF
            return 0
        take = st.out_bytes if <size_t>st.out_bytes <= length else <Py_ssize_t>length
        if take == st.out_bytes:  # everything queued goes in this frame
            if st.trailer_due:
                st.trailer_due = False
                data_flags[0] = NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM
                self._submit_trailer(st)
            elif take == 0:
                st.deferred = True
                return NGHTTP2_ERR_DEFERRED
        if take:
            data_flags[0] |= NGHTTP2_DATA_FLAG_NO_COPY
        return take
    except BaseException as exc:
        return self._callback_failed(exc, "_read_data")


cdef int _send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                    nghttp2_data_source *source, void *user_data) noexcept:
    # One DATA frame sized by _read_data: its 9-byte header, then ``length`` bytes taken off the
    # stream's queue. Large pieces go out as the queued objects themselves (or memoryview slices
    # of them), small ones are copied into the output's small-bytes buffer.
    cdef H2Session self = <H2Session>user_data
    cdef _Stream st
    cdef bytes chunk
    cdef Py_ssize_t n, take, left = <Py_ssize_t>length
    try:
        st = self.streams.get(frame.hd.stream_id)
        if st is None or frame.data.padlen != 0 or st.out_bytes < left:
            raise AssertionError(f"DATA frame of {length} bytes on stream {frame.hd.stream_id} does not match "
                                 f"its queue (padlen {frame.data.padlen})")
        self._emit(<const char*>framehd, 9)
        while left:
            chunk = <bytes>st.out[st.out_head]
            n = PyBytes_GET_SIZE(chunk) - st.out_off
            take = n if n <= left else left
            if take < _SMALL:
                self._emit(PyBytes_AS_STRING(chunk) + st.out_off, take)
            elif take == PyBytes_GET_SIZE(chunk):
                self._emit_object(chunk)
            else:
                self._emit_object(memoryview(chunk)[st.out_off:st.out_off + take])
            left -= take
            if take == n:
                st.out[st.out_head] = None
                st.out_head += 1
                st.out_off = 0
            else:
                st.out_off += take
        if st.out_head == len(st.out):
            st.out = None  # an idle stream keeps no queue
            st.out_head = 0
        st.out_bytes -= <Py_ssize_t>length
        self.backlog -= <Py_ssize_t>length
    except BaseException as exc:
        return self._callback_failed(exc, "_send_data")
    return 0


cdef int _on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) noexcept:
    # A GOAWAY may come from nghttp2 itself (the rapid-reset guard, a flood, a protocol error):
    # the owner must see it (``abuse``, ``goaway_sent``) to close the connection.
    cdef H2Session self = <H2Session>user_data
    if frame.hd.type == NGHTTP2_GOAWAY:
        self.goaway_sent = True
        if frame.goaway.error_code != NGHTTP2_NO_ERROR:
            self.goaway_code = frame.goaway.error_code
            if self.abuse is None:
                try:
                    self.abuse = _GOAWAY_REASONS.get(frame.goaway.error_code, "protocol error")
                except BaseException as exc:
                    return self._callback_failed(exc, "_on_frame_send")
    return 0


_GOAWAY_REASONS = {
    NGHTTP2_PROTOCOL_ERROR: "protocol error",
    NGHTTP2_INTERNAL_ERROR: "too many stream resets (rapid reset)",  # nghttp2's reset guard uses this code
    NGHTTP2_ENHANCE_YOUR_CALM: "flood (ENHANCE_YOUR_CALM)",
}


cdef class H2Session:
    """A server HTTP/2 session carrying gRPC calls; fed bytes, producing events and bytes."""
    cdef nghttp2_session *session
    cdef readonly dict streams
    cdef list events
    cdef readonly Py_ssize_t max_message
    cdef Py_ssize_t max_header_list
    cdef readonly Py_ssize_t backlog     # queued, not yet framed outbound message bytes
    cdef readonly bint peer_goaway
    cdef readonly bint goaway_sent
    cdef readonly uint32_t goaway_code  # error code of the GOAWAY we sent (0 = graceful)
    cdef readonly object abuse          # why the session was ended for misbehaviour, or None
    cdef readonly bint preface_received # the client's connection preface and first SETTINGS arrived
    cdef readonly Py_ssize_t read_buffered  # bytes reserved by unfinished inbound messages
    cdef Py_ssize_t max_read_buffer
    cdef Py_ssize_t max_continuations
    # frame-header scan (see _scan): preface bytes left, header bytes held, payload left, CONTINUATIONs
    cdef Py_ssize_t _scan_preface
    cdef Py_ssize_t _scan_have
    cdef Py_ssize_t _scan_skip
    cdef Py_ssize_t _scan_cont
    cdef unsigned char _scan_hd[9]
    # output being assembled by output_parts(): finished parts, and small pieces still being joined
    cdef list _parts
    cdef bytearray _small
    cdef readonly bint shares_framebuf  # its outbound frame buffer is the process-wide one
    cdef bint _send_failed              # nghttp2_session_mem_send failed: never call it again
    cdef object _callback_error         # the first exception a callback raised (see _callback_failed)
    cdef str _callback_name             # ... and which callback

    def __cinit__(self, Py_ssize_t max_message=4 * 1024 * 1024, int max_concurrent_streams=1000,
                  int max_header_list=16384, int window=1024 * 1024, *, uint64_t reset_burst=1000,
                  uint64_t reset_rate=33, Py_ssize_t max_outbound_ack=1000, Py_ssize_t max_settings=32,
                  Py_ssize_t max_continuations=8, Py_ssize_t max_read_buffer=16 * 1024 * 1024):
        cdef nghttp2_session_callbacks *cbs
        cdef nghttp2_option *opt
        cdef nghttp2_settings_entry iv[3]
        cdef int rv
        self.session = NULL
        self.streams = {}
        self.events = None  # created by the first event: an idle connection holds no list
        self.max_message = max_message
        self.max_header_list = max_header_list
        self.backlog = 0
        self.abuse = None
        self.max_read_buffer = max(max_read_buffer, max_message + 5)
        self.max_continuations = max_continuations
        self._scan_preface = _PREFACE_LEN
        self._scan_cont = -1
        if nghttp2_session_callbacks_new(&cbs) != 0:
            raise MemoryError()
        nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, _on_begin_headers)
        nghttp2_session_callbacks_set_on_header_callback(cbs, _on_header)
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, _on_frame_recv)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, _on_data_chunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs, _on_stream_close)
        nghttp2_session_callbacks_set_on_frame_send_callback(cbs, _on_frame_send)
        nghttp2_session_callbacks_set_send_data_callback(cbs, _send_data)
        if nghttp2_option_new(&opt) != 0:
            nghttp2_session_callbacks_del(cbs)
            raise MemoryError()
        nghttp2_option_set_max_reserved_remote_streams(opt, 0)
        nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024)
        # Memory per idle connection (at most 20 KB each at 10,000, docs/native-transport.md): our response headers
        # are few and short, so no HPACK dynamic table for them (about 200 bytes a connection, for
        # about 25 more header bytes an answer); and no closed streams kept for RFC 7540
        # priorities, which we never use (about 250 bytes a connection).
        nghttp2_option_set_max_deflate_dynamic_table_size(opt, 0)
        nghttp2_option_set_no_closed_streams(opt, 1)
        nghttp2_option_set_max_outbound_ack(opt, max_outbound_ack)
        nghttp2_option_set_max_settings(opt, max_settings)
        nghttp2_option_set_stream_reset_rate_limit(opt, reset_burst, reset_rate)
        global _framebuf_offered, _framebuf_taken
        _framebuf_offered = True
        _framebuf_taken = False
        rv = nghttp2_session_server_new3(&self.session, cbs, <void*>self, opt, &_mem)
        _framebuf_offered = False
        self.shares_framebuf = _framebuf_taken
        nghttp2_option_del(opt)
        nghttp2_session_callbacks_del(cbs)
        if rv != 0:
            raise MemoryError(nghttp2_strerror(rv).decode())
        iv[0].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
        iv[0].value = max_concurrent_streams
        iv[1].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        iv[1].value = window
        iv[2].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        iv[2].value = max_header_list
        nghttp2_submit_settings(self.session, NGHTTP2_FLAG_NONE, iv, 3)
        nghttp2_session_set_local_window_size(self.session, NGHTTP2_FLAG_NONE, 0, window * 4)

    cdef int _callback_failed(self, BaseException exc, str name) noexcept:
        """A callback raised: keep the first exception (the caller of the C function raises it as
        H2CallbackError once nghttp2 returns) and tell nghttp2 to give up."""
        if self._callback_error is None:
            self._callback_error = exc
            self._callback_name = name
        return NGHTTP2_ERR_CALLBACK_FAILURE

    cdef int _raise_callback_error(self) except -1:
        """Raise what a callback kept, chained to the H2CallbackError that ends the session."""
        exc = self._callback_error
        if exc is None:
            return 0
        self._callback_error = None
        nghttp2_session_terminate_session(self.session, NGHTTP2_INTERNAL_ERROR)
        raise H2CallbackError(f"{self._callback_name} raised {type(exc).__name__}: {exc}") from exc

    def __dealloc__(self):
        if self.session != NULL:
            nghttp2_session_del(self.session)
            self.session = NULL

    # --- input ---------------------------------------------------------------------------
    def feed(self, bytes data):
        """Parse bytes from the peer; the events they produced. Raises H2Error on a broken peer."""
        cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t take = size
        cdef ssize_t rv = 0
        cdef bint over = False
        if self.abuse is None:
            take = self._scan(<const unsigned char*>PyBytes_AS_STRING(data), size)
            over = take < 0
            if over:
                take = -take - 1
        if take > 0:
            rv = nghttp2_session_mem_recv(self.session, <const uint8_t*>PyBytes_AS_STRING(data), <size_t>take)
        if over and rv >= 0:
            self.abuse = f"more than {self.max_continuations} CONTINUATION frames in one header block"
            nghttp2_session_terminate_session(self.session, NGHTTP2_ENHANCE_YOUR_CALM)
        events = self.events
        self.events = None
        if self._callback_error is not None:
            self._raise_callback_error()
        if rv < 0:
            # Broken or flooding peer: queue a GOAWAY saying so (written if the owner flushes).
            if rv == NGHTTP2_ERR_FLOODED:
                self.abuse = "flood of PING/SETTINGS frames whose ACKs it does not read"
                nghttp2_session_terminate_session(self.session, NGHTTP2_ENHANCE_YOUR_CALM)
            else:
                nghttp2_session_terminate_session(self.session, NGHTTP2_PROTOCOL_ERROR)
            raise H2Error(self.abuse or nghttp2_strerror(<int>rv).decode())
        return events if events is not None else []

    cdef Py_ssize_t _scan(self, const unsigned char *data, Py_ssize_t length):
        """Follow the frame headers in ``data``, counting the CONTINUATIONs of each header block.

        Returns ``length``, or ``-1 - n`` where ``n`` counts the bytes up to and including the
        frame header of the first CONTINUATION past the bound. Only lengths, types and flags
        are read; nghttp2 validates everything else.
        """
        cdef Py_ssize_t p = 0, take, frame_len
        cdef unsigned char ftype, flags
        while p < length:
            if self._scan_preface:
                take = min(self._scan_preface, length - p)
                self._scan_preface -= take
                p += take
                continue
            if self._scan_skip:
                take = min(self._scan_skip, length - p)
                self._scan_skip -= take
                p += take
                continue
            take = min(9 - self._scan_have, length - p)
            memcpy(&self._scan_hd[self._scan_have], data + p, take)
            self._scan_have += take
            p += take
            if self._scan_have < 9:
                break
            self._scan_have = 0
            frame_len = (<Py_ssize_t>self._scan_hd[0] << 16) | (self._scan_hd[1] << 8) | self._scan_hd[2]
            ftype = self._scan_hd[3]
            flags = self._scan_hd[4]
            self._scan_skip = frame_len
            if ftype == NGHTTP2_HEADERS or ftype == NGHTTP2_PUSH_PROMISE:
                self._scan_cont = -1 if flags & NGHTTP2_FLAG_END_HEADERS else 0
            elif ftype == NGHTTP2_CONTINUATION and self._scan_cont >= 0:
                self._scan_cont += 1
                if self._scan_cont > self.max_continuations:
                    return -1 - p
                if flags & NGHTTP2_FLAG_END_HEADERS:
                    self._scan_cont = -1
        return length

    cdef int _reassemble(self, _Stream st, const char *data, Py_ssize_t length) except -1:
        cdef Py_ssize_t have, take, size
        cdef int flag
        cdef const unsigned char *p
        cdef bytearray buf = st.buf
        while length > 0:
            if st.need < 0:  # reading the prefix
                have = len(buf) if buf is not None else 0
                if have == 0 and length >= 5:
                    p = <const unsigned char*>data
                    flag = p[0]
                    size = (<Py_ssize_t>p[1] << 24) | (p[2] << 16) | (p[3] << 8) | p[4]
                    data += 5
                    length -= 5
                else:
                    if buf is None:
                        st.buf = buf = bytearray()
                    take = min(5 - have, length)
                    buf += data[:take]
                    data += take
                    length -= take
                    if len(buf) < 5:
                        return 0
                    flag = buf[0]
                    size = (<Py_ssize_t>buf[1] << 24) | (buf[2] << 16) | (buf[3] << 8) | buf[4]
                    del buf[:]
                if flag & 1:
                    self._fail(st, UNIMPLEMENTED, "compressed messages are not supported (no grpc-encoding)")
                    return 0
                if size > self.max_message:
                    self._fail(st, RESOURCE_EXHAUSTED,
                               f"message of {size} bytes is over the limit of {self.max_message} bytes")
                    return 0
                if size <= length:  # whole message in this chunk: one copy
                    self._event((EV_MESSAGE, st.sid, PyBytes_FromStringAndSize(data, size), None))
                    data += size
                    length -= size
                    continue
                if self.read_buffered + size > self.max_read_buffer:
                    self._fail(st, RESOURCE_EXHAUSTED,
                               f"message of {size} bytes does not fit in the connection's read buffer "
                               f"({self.read_buffered} of {self.max_read_buffer} bytes held by unfinished messages)")
                    return 0
                st.reserved = size
                self.read_buffered += size
                st.need = size
                # The message's own bytes object, written in place as DATA arrives (it is not shared
                # before it is complete): no growing buffer and no final copy, so a large message
                # costs its size once (and, mmapped, only the pages its bytes have reached so far).
                st.msg = PyBytes_FromStringAndSize(NULL, size)
                st.filled = 0
            take = min(st.need, length)
            memcpy(PyBytes_AS_STRING(st.msg) + st.filled, data, take)
            st.filled += take
            data += take
            length -= take
            st.need -= take
            if st.need == 0:
                self._event((EV_MESSAGE, st.sid, st.msg, None))
                st.msg = None  # an idle stream keeps no buffer
                st.need = -1
                self._release(st)
        return 0

    cdef void _release(self, _Stream st):
        self.read_buffered -= st.reserved
        st.reserved = 0

    cdef void _fail(self, _Stream st, int status, str message):
        st.discard = True
        st.buf = None
        st.msg = None
        st.need = -1
        self._release(st)
        self._send_trailers(st.sid, status, message)
        # tell the owner the call is over; nghttp2 reports the close itself later
        self._event((EV_FAILED, st.sid, status, message))

    cdef int _event(self, tuple event) except -1:
        if self.events is None:
            self.events = [event]
        else:
            self.events.append(event)
        return 0

    # --- output --------------------------------------------------------------------------
    cdef int _submit_headers(self, _Stream st) except -1:
        cdef nghttp2_nv nva[2]
        cdef nghttp2_data_provider prd
        _nv(&nva[0], b":status", b"200")
        _nv(&nva[1], b"content-type", b"application/grpc")
        prd.source.ptr = NULL
        prd.read_callback = _read_data
        rv = nghttp2_submit_response(self.session, st.sid, nva, 2, &prd)
        if rv != 0:
            raise H2Error(nghttp2_strerror(rv).decode())
        st.headers_sent = True
        return 0

    cdef int _submit_trailer(self, _Stream st) except -1:
        cdef nghttp2_nv nva[2]
        cdef bytes status = _status_bytes(st.status)
        cdef bytes message = _percent_encode(st.message) if st.message else b""
        _nv(&nva[0], b"grpc-status", status)
        if message:
            _nv(&nva[1], b"grpc-message", message)
        nghttp2_submit_trailer(self.session, st.sid, nva, 2 if message else 1)
        st.ended = True
        return 0

    cdef bint _send_message(self, int32_t stream_id, bytes message) except -1:
        cdef _Stream st = self.streams.get(stream_id)
        if st is None or st.ended or st.trailer_due:
            return False
        cdef Py_ssize_t size = PyBytes_GET_SIZE(message)
        cdef bytes prefix = PyBytes_FromStringAndSize(NULL, 5)
        cdef unsigned char *p = <unsigned char*>PyBytes_AS_STRING(prefix)
        p[0] = 0
        p[1] = (size >> 24) & 0xFF
        p[2] = (size >> 16) & 0xFF
        p[3] = (size >> 8) & 0xFF
        p[4] = size & 0xFF
        if st.out is None:
            st.out = [prefix, message]
        else:
            st.out.append(prefix)
            st.out.append(message)
        st.out_bytes += size + 5
        self.backlog += size + 5
        if not st.headers_sent:
            self._submit_headers(st)
        elif st.deferred:
            st.deferred = False
            nghttp2_session_resume_data(self.session, stream_id)
        return True

    cdef bint _send_trailers(self, int32_t stream_id, int status, str message) except -1:
        cdef _Stream st = self.streams.get(stream_id)
        cdef nghttp2_nv nva[4]
        cdef bytes status_b, message_b
        if st is None or st.ended or st.trailer_due:
            return False
        st.status = status
        st.message = message
        if st.headers_sent:
            st.trailer_due = True
            if st.deferred:
                st.deferred = False
                nghttp2_session_resume_data(self.session, stream_id)
            return True
        status_b = _status_bytes(status)
        message_b = _percent_encode(message) if message else b""
        _nv(&nva[0], b":status", b"200")
        _nv(&nva[1], b"content-type", b"application/grpc")
        _nv(&nva[2], b"grpc-status", status_b)
        if message_b:
            _nv(&nva[3], b"grpc-message", message_b)
        st.headers_sent = True
        st.ended = True
        nghttp2_submit_response(self.session, stream_id, nva, 4 if message_b else 3, NULL)
        return True

    def send_message(self, int32_t stream_id, bytes message):
        """Queue one gRPC message on the stream; False if the stream is gone or ended."""
        return self._send_message(stream_id, message)

    def send_trailers(self, int32_t stream_id, int status, str message=""):
        """End the stream with a gRPC status (trailers-only when nothing was sent yet)."""
        return self._send_trailers(stream_id, status, message)

    def reply(self, int32_t stream_id, bytes message):
        """A unary answer: headers, the message and an OK status."""
        if self._send_message(stream_id, message):
            self._send_trailers(stream_id, 0, "")

    def reset(self, int32_t stream_id, uint32_t error_code=NGHTTP2_CANCEL):
        """RST_STREAM (e.g. CANCEL after a deadline when the client has not half-closed)."""
        if stream_id in self.streams:
            nghttp2_submit_rst_stream(self.session, NGHTTP2_FLAG_NONE, stream_id, error_code)

    def goaway(self, uint32_t error_code=NGHTTP2_NO_ERROR):
        """GOAWAY naming the last stream we processed: no new streams, current ones finish."""
        if not self.goaway_sent:
            self.goaway_sent = True
            nghttp2_submit_goaway(self.session, NGHTTP2_FLAG_NONE,
                                  nghttp2_session_get_last_proc_stream_id(self.session), error_code, NULL, 0)

    cdef int _emit(self, const char *data, Py_ssize_t n) except -1:
        cdef bytearray small = self._small
        cdef Py_ssize_t have
        if small is None:
            self._small = small = PyByteArray_FromStringAndSize(data, n)
            return 0
        have = PyByteArray_GET_SIZE(small)
        PyByteArray_Resize(small, have + n)
        memcpy(PyByteArray_AS_STRING(small) + have, data, n)
        return 0

    cdef int _emit_object(self, object part) except -1:
        if self._small is not None:
            self._parts.append(self._small)
            self._small = None
        self._parts.append(part)
        return 0

    def output_parts(self):
        """Everything nghttp2 wants to write now, as a list of buffers to write in order (empty
        when nothing): frame headers and small frames joined in bytearrays, message bytes of
        large messages as the queued bytes objects or memoryview slices of them (not copied)."""
        global _sending
        cdef const uint8_t *data
        cdef ssize_t n
        cdef list parts = []
        if self._send_failed:
            raise H2Error("the session failed while sending")
        if _sending:  # see _framebuf: one session at a time
            raise RuntimeError("H2Session.output_parts re-entered (sessions must be driven from one thread)")
        _sending = True
        self._parts = parts
        self._small = None
        try:
            while True:
                n = nghttp2_session_mem_send(self.session, &data)
                if n < 0:
                    self._send_failed = True
                    self._raise_callback_error()
                    raise H2Error(nghttp2_strerror(<int>n).decode())
                if n == 0:
                    break
                self._emit(<const char*>data, n)
            if self._small is not None:
                parts.append(self._small)
        except BaseException:
            self._send_failed = True  # a frame may be left half sent in the shared buffer
            raise
        finally:
            _sending = False
            self._parts = None
            self._small = None
        return parts

    def pending_output(self):
        """Everything nghttp2 wants to write now, as one bytes object (b"" when nothing)."""
        return b"".join(self.output_parts())

    def take_events(self):
        """Events produced outside ``feed`` (streams closed while writing), or None."""
        if not self.events:
            return None
        events = self.events
        self.events = None
        return events

    def is_done(self):
        """True when the session neither reads nor writes any more (close the socket)."""
        return not nghttp2_session_want_read(self.session) and not nghttp2_session_want_write(self.session)

    def open_streams(self):
        return len(self.streams)


cdef inline void _nv(nghttp2_nv *nv, bytes name, bytes value):
    nv.name = <uint8_t*>PyBytes_AS_STRING(name)
    nv.namelen = PyBytes_GET_SIZE(name)
    nv.value = <uint8_t*>PyBytes_AS_STRING(value)
    nv.valuelen = PyBytes_GET_SIZE(value)
    nv.flags = NGHTTP2_NV_FLAG_NONE
