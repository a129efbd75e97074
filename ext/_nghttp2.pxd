# Extern declarations of the part of libnghttp2 (nghttp2/nghttp2.h, 1.52) that ext/h2grpc.pyx (server
# sessions) and ext/h2client.pyx (client sessions) use.

from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stddef cimport size_t


cdef extern from "nghttp2/nghttp2.h":
    ctypedef struct nghttp2_session:
        pass
    ctypedef struct nghttp2_session_callbacks:
        pass
    ctypedef struct nghttp2_option:
        pass
    ctypedef struct nghttp2_priority_spec:
        pass

    ctypedef struct nghttp2_frame_hd:
        size_t length
        int32_t stream_id
        uint8_t type
        uint8_t flags

    ctypedef enum nghttp2_headers_category:
        NGHTTP2_HCAT_REQUEST
        NGHTTP2_HCAT_RESPONSE
        NGHTTP2_HCAT_PUSH_RESPONSE
        NGHTTP2_HCAT_HEADERS

    ctypedef struct nghttp2_headers:
        nghttp2_frame_hd hd
        nghttp2_headers_category cat

    ctypedef struct nghttp2_goaway:
        nghttp2_frame_hd hd
        int32_t last_stream_id
        uint32_t error_code

    ctypedef struct nghttp2_data:
        nghttp2_frame_hd hd
        size_t padlen

    ctypedef union nghttp2_frame:
        nghttp2_frame_hd hd
        nghttp2_data data
        nghttp2_headers headers
        nghttp2_goaway goaway

    ctypedef struct nghttp2_nv:
        uint8_t *name
        uint8_t *value
        size_t namelen
        size_t valuelen
        uint8_t flags

    ctypedef struct nghttp2_settings_entry:
        int32_t settings_id
        uint32_t value

    ctypedef union nghttp2_data_source:
        int fd
        void *ptr

    ctypedef ssize_t (*nghttp2_data_source_read_callback)(
        nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
        uint32_t *data_flags, nghttp2_data_source *source, void *user_data)

    ctypedef int (*nghttp2_send_data_callback)(
        nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
        nghttp2_data_source *source, void *user_data)

    ctypedef struct nghttp2_data_provider:
        nghttp2_data_source source
        nghttp2_data_source_read_callback read_callback

    ctypedef int (*nghttp2_on_begin_headers_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
    ctypedef int (*nghttp2_on_header_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
        const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
    ctypedef int (*nghttp2_on_frame_recv_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
    ctypedef int (*nghttp2_on_data_chunk_recv_callback)(
        nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
        void *user_data)
    ctypedef int (*nghttp2_on_stream_close_callback)(
        nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data)
    ctypedef int (*nghttp2_on_frame_send_callback)(
        nghttp2_session *session, const nghttp2_frame *frame, void *user_data)

    enum:
        NGHTTP2_DATA = 0
        NGHTTP2_HEADERS = 1
        NGHTTP2_RST_STREAM = 3
        NGHTTP2_SETTINGS = 4
        NGHTTP2_PUSH_PROMISE = 5
        NGHTTP2_GOAWAY = 7
        NGHTTP2_CONTINUATION = 9
        NGHTTP2_FLAG_NONE = 0
        NGHTTP2_FLAG_END_STREAM = 1
        NGHTTP2_FLAG_END_HEADERS = 4
        NGHTTP2_NV_FLAG_NONE = 0
        NGHTTP2_NV_FLAG_NO_COPY_NAME = 2
        NGHTTP2_NV_FLAG_NO_COPY_VALUE = 4
        NGHTTP2_DATA_FLAG_NONE = 0
        NGHTTP2_DATA_FLAG_EOF = 1
        NGHTTP2_DATA_FLAG_NO_END_STREAM = 2
        NGHTTP2_DATA_FLAG_NO_COPY = 4
        NGHTTP2_ERR_DEFERRED = -508
        NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE = -521
        NGHTTP2_ERR_CALLBACK_FAILURE = -902
        NGHTTP2_ERR_FLOODED = -904
        NGHTTP2_NO_ERROR = 0
        NGHTTP2_PROTOCOL_ERROR = 1
        NGHTTP2_INTERNAL_ERROR = 2
        NGHTTP2_FLOW_CONTROL_ERROR = 3
        NGHTTP2_REFUSED_STREAM = 7
        NGHTTP2_CANCEL = 8
        NGHTTP2_INADEQUATE_SECURITY = 12
        NGHTTP2_SETTINGS_ENABLE_PUSH = 2
        NGHTTP2_ENHANCE_YOUR_CALM = 11
        NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS = 3
        NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE = 4
        NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE = 6

    int nghttp2_session_callbacks_new(nghttp2_session_callbacks **callbacks_ptr)
    void nghttp2_session_callbacks_del(nghttp2_session_callbacks *callbacks)
    void nghttp2_session_callbacks_set_on_begin_headers_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_begin_headers_callback cb)
    void nghttp2_session_callbacks_set_on_header_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_header_callback cb)
    void nghttp2_session_callbacks_set_on_frame_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_recv_callback cb)
    void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_data_chunk_recv_callback cb)
    void nghttp2_session_callbacks_set_on_stream_close_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_stream_close_callback cb)
    void nghttp2_session_callbacks_set_on_frame_send_callback(
        nghttp2_session_callbacks *cbs, nghttp2_on_frame_send_callback cb)
    void nghttp2_session_callbacks_set_send_data_callback(
        nghttp2_session_callbacks *cbs, nghttp2_send_data_callback cb)

    int nghttp2_option_new(nghttp2_option **option_ptr)
    void nghttp2_option_del(nghttp2_option *option)
    void nghttp2_option_set_max_reserved_remote_streams(nghttp2_option *option, uint32_t val)
    void nghttp2_option_set_max_send_header_block_length(nghttp2_option *option, size_t val)
    void nghttp2_option_set_max_deflate_dynamic_table_size(nghttp2_option *option, size_t val)
    void nghttp2_option_set_max_outbound_ack(nghttp2_option *option, size_t val)
    void nghttp2_option_set_max_settings(nghttp2_option *option, size_t val)
    void nghttp2_option_set_no_closed_streams(nghttp2_option *option, int val)
    # 1.52 as patched for CVE-2023-44487 (Debian 1.52.0-1+deb12u1 and later; upstream 1.57)
    void nghttp2_option_set_stream_reset_rate_limit(nghttp2_option *option, uint64_t burst, uint64_t rate)

    int nghttp2_session_server_new2(nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks,
                                    void *user_data, const nghttp2_option *option)

    # custom allocator (nghttp2_session_server_new3): ext/h2grpc.pyx shares one outbound frame buffer
    ctypedef void *(*nghttp2_malloc)(size_t size, void *mem_user_data) noexcept
    ctypedef void (*nghttp2_free)(void *ptr, void *mem_user_data) noexcept
    ctypedef void *(*nghttp2_calloc)(size_t nmemb, size_t size, void *mem_user_data) noexcept
    ctypedef void *(*nghttp2_realloc)(void *ptr, size_t size, void *mem_user_data) noexcept
    ctypedef struct nghttp2_mem:
        void *mem_user_data
        nghttp2_malloc malloc
        nghttp2_free free
        nghttp2_calloc calloc
        nghttp2_realloc realloc
    int nghttp2_session_server_new3(nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks,
                                    void *user_data, const nghttp2_option *option, nghttp2_mem *mem)
    void nghttp2_session_del(nghttp2_session *session)
    # client sessions (ext/h2client.pyx)
    int nghttp2_session_client_new2(nghttp2_session **session_ptr, const nghttp2_session_callbacks *callbacks,
                                    void *user_data, const nghttp2_option *option)
    int32_t nghttp2_submit_request(nghttp2_session *session, const nghttp2_priority_spec *pri_spec,
                                   const nghttp2_nv *nva, size_t nvlen, const nghttp2_data_provider *data_prd,
                                   void *stream_user_data)
    uint32_t nghttp2_session_get_next_stream_id(nghttp2_session *session)
    ssize_t nghttp2_session_mem_recv(nghttp2_session *session, const uint8_t *data, size_t inlen)
    ssize_t nghttp2_session_mem_send(nghttp2_session *session, const uint8_t **data_ptr)
    int nghttp2_session_want_read(nghttp2_session *session)
    int nghttp2_session_want_write(nghttp2_session *session)
    int nghttp2_session_resume_data(nghttp2_session *session, int32_t stream_id)
    int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *session)
    int nghttp2_session_terminate_session(nghttp2_session *session, uint32_t error_code)
    int nghttp2_session_set_local_window_size(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                                              int32_t window_size)

    int nghttp2_submit_settings(nghttp2_session *session, uint8_t flags, const nghttp2_settings_entry *iv,
                                size_t niv)
    int nghttp2_submit_response(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva,
                                size_t nvlen, const nghttp2_data_provider *data_prd)
    int nghttp2_submit_trailer(nghttp2_session *session, int32_t stream_id, const nghttp2_nv *nva,
                               size_t nvlen)
    int nghttp2_submit_rst_stream(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                                  uint32_t error_code)
    int nghttp2_submit_goaway(nghttp2_session *session, uint8_t flags, int32_t last_stream_id,
                              uint32_t error_code, const uint8_t *opaque_data, size_t opaque_data_len)
    const char *nghttp2_strerror(int lib_error_code)

    # the library linked at run time (not the headers built against): ext/h2grpc.pyx checks it at import
    ctypedef struct nghttp2_info:
        int age
        int version_num
        const char *version_str
        const char *proto_str
    nghttp2_info *nghttp2_version(int least_version)
