/* A native Nacos 2.x gRPC load generator: libnghttp2 client sessions on one epoll loop.
 *
 * It only frames, sends, receives and counts. Every request body is built by the Python side
 * (bench/load/native_gen.py, from the same builders the Python generator uses) and handed over
 * as finished gRPC messages (5-byte prefix + Payload protobuf), so this file knows no request
 * JSON. Per connection it does what a stock SDK does (docs/protocol.md §2.2): ServerCheck as a
 * unary call, then the bi stream with ConnectionSetupRequest, then it waits for SetupAckRequest.
 * On the stream it answers every server request (ClientDetectionRequest, ...) with a 200
 * response echoing requestId. Then it keeps K unary calls in flight per connection.
 *
 * A response is checked without copying it: only the first HEAD_KEEP bytes of its message are
 * kept (Payload.metadata.type and the start of the JSON body, where resultCode and errorCode
 * are), the rest is counted and dropped; grpc-status comes from the trailers.
 *
 * Commands, one per line on stdin; one JSON line per command on stdout:
 *   connect HOST PORT COUNT HANDSHAKE_FILE LAT_FILE TIMEOUT_S
 *       opens COUNT more connections; HANDSHAKE_FILE holds one "plan" with 2 messages:
 *       ServerCheckRequest, ConnectionSetupRequest. Handshake times go to LAT_FILE (float64).
 *   run PLAN_FILE WINDOW MAX_S LAT_FILE [BATCH [COALESCE_US]]
 *       plan: u32 n_conns, then per connection u32 n_msgs and per message u32 len + bytes
 *       (little endian). Connection i (in connect order) sends its list, WINDOW in flight;
 *       after MAX_S seconds no new call starts (truncated). Latencies go to LAT_FILE.
 *       BATCH (default 1): a connection sends new calls only once BATCH of its WINDOW slots
 *       are free, all in one write (fewer syscalls per call on both sides). COALESCE_US
 *       (default 0): sleep that long after each round of events, so answers pile up and one
 *       wake-up, read and write serve several (fewer context switches per call).
 *   await PORT COUNT TIMEOUT_S PUSH_FILE
 *       a subscriber's side of a push fan-out: every NotifySubscriberRequest a connection reads
 *       (in any command, and between commands) is answered at once and recorded as (connection,
 *       the first "port" in its serviceInfo, -1 without hosts, CLOCK_MONOTONIC time it was read
 *       and its ack queued; the ack is written in the same loop pass). await runs the loop until
 *       COUNT live connections have read a push whose port is PORT (or TIMEOUT_S passed), then
 *       writes every record since the last await to PUSH_FILE (i32 conn, i32 port, f64 time,
 *       little endian) and forgets them.
 *   close
 *       closes every connection (GOAWAY) and answers; EOF on stdin does the same and exits.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <nghttp2/nghttp2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define HEAD_KEEP 384
#define MAX_ERR_KINDS 64
#define PATH_UNARY "/Request/request"
#define PATH_STREAM "/BiRequestStream/requestBiStream"

enum { C_CONNECTING, C_CHECK, C_SETUP, C_READY, C_DEAD };
enum { K_OP, K_CHECK };

typedef struct {
    uint8_t *p;
    size_t len, cap;
} buf_t;

static void buf_put(buf_t *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) { perror("realloc"); exit(2); }
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_drop(buf_t *b, size_t n) {
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

typedef struct {
    const uint8_t *p;
    uint32_t len;
} msg_t;

struct conn;
typedef struct call {
    struct conn *c;
    int kind;
    const uint8_t *req;
    size_t req_len, sent;
    double t0;
    uint8_t head[HEAD_KEEP];
    size_t head_len, total;
    int grpc_status;
    struct call *next_free;
} call_t;

typedef struct conn {
    int fd, state, index;
    nghttp2_session *s;
    buf_t out;        /* bytes nghttp2 produced, not yet written */
    int want_write;   /* EPOLLOUT armed */
    int32_t stream_id;
    buf_t bidi_in, bidi_out;
    size_t bidi_sent;
    double t_start;
    long push_port;   /* the port of the last push this connection read (-2: none yet) */
    /* the run */
    msg_t *ops;
    uint32_t n_ops, cursor;
    int inflight;
} conn_t;

/* --- globals ------------------------------------------------------------------------------ */
static int ep;
static conn_t **conns;
static int n_conns, cap_conns;
static char authority[1100];
static msg_t hs_check, hs_setup;
static uint8_t *hs_blob;
static call_t *free_calls;
static int window = 1;
static int batch = 1;          /* refill a connection only when this many of its slots are free */
static int running;            /* a `run` is in progress */
static int stop_new;           /* deadline passed: start no new call */
static uint64_t ops_ok, ops_done;
static double *lat;
static size_t lat_n, lat_cap;
static long detections;
typedef struct { int32_t conn, port; double t; } push_rec_t;
static push_rec_t *pushes;
static size_t push_n, push_cap;
static long push_total;
static struct { char key[48]; long n; } errs[MAX_ERR_KINDS];
static int n_errs;

static double now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void err_count(const char *key) {
    for (int i = 0; i < n_errs; i++)
        if (strcmp(errs[i].key, key) == 0) { errs[i].n++; return; }
    if (n_errs < MAX_ERR_KINDS) {
        snprintf(errs[n_errs].key, sizeof errs[n_errs].key, "%s", key);
        errs[n_errs++].n = 1;
    }
}

static void lat_add(double v) {
    if (lat_n == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 65536;
        lat = realloc(lat, lat_cap * sizeof *lat);
        if (!lat) { perror("realloc"); exit(2); }
    }
    lat[lat_n++] = v;
}

static void lat_write(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    if (lat_n) fwrite(lat, sizeof *lat, lat_n, f);
    fclose(f);
    lat_n = 0;
}

/* --- protobuf: just enough of Payload ---------------------------------------------------- */
static int pb_varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; *i < n && shift < 64; shift += 7) {
        uint8_t b = p[(*i)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *v = r; return 0; }
    }
    return -1;
}

/* Find length-delimited field `field` in p[0..n); the value may be cut short at n (we keep
 * only a message head): out and out_len hold what is there. */
static int pb_field(const uint8_t *p, size_t n, unsigned field, const uint8_t **out, size_t *out_len) {
    size_t i = 0;
    while (i < n) {
        uint64_t tag, len;
        if (pb_varint(p, n, &i, &tag)) return -1;
        unsigned wt = tag & 7;
        if (wt == 2) {
            if (pb_varint(p, n, &i, &len)) return -1;
            if ((tag >> 3) == field) {
                *out = p + i;
                *out_len = (i + len <= n) ? len : n - i;
                return 0;
            }
            i += len;
        } else if (wt == 0) {
            uint64_t skip;
            if (pb_varint(p, n, &i, &skip)) return -1;
        } else if (wt == 1) i += 8;
        else if (wt == 5) i += 4;
        else return -1;
    }
    return -1;
}

/* Payload (field 2 metadata { field 3 type }, field 3 body Any { field 2 value }) */
static void payload_parts(const uint8_t *p, size_t n, const uint8_t **type, size_t *type_len,
                          const uint8_t **body, size_t *body_len) {
    const uint8_t *m, *a;
    size_t ml, al;
    *type = NULL; *type_len = 0; *body = NULL; *body_len = 0;
    if (pb_field(p, n, 2, &m, &ml) == 0) pb_field(m, ml, 3, type, type_len);
    if (pb_field(p, n, 3, &a, &al) == 0) pb_field(a, al, 2, body, body_len);
}

static size_t pb_put_varint(uint8_t *o, uint64_t v) {
    size_t i = 0;
    while (v >= 0x80) { o[i++] = (uint8_t)(v | 0x80); v >>= 7; }
    o[i++] = (uint8_t)v;
    return i;
}

/* a gRPC message (prefix + Payload{metadata{type}, body{value}}) into b */
static void grpc_payload(buf_t *b, const char *type, size_t type_len, const char *json, size_t json_len) {
    uint8_t meta[256], anyh[16], top[32];
    size_t ml = 0, al, tl = 0;
    meta[ml++] = 0x1a;
    ml += pb_put_varint(meta + ml, type_len);
    memcpy(meta + ml, type, type_len);
    ml += type_len;
    anyh[0] = 0x12;
    al = 1 + pb_put_varint(anyh + 1, json_len);
    size_t any_len = al + json_len;
    top[tl++] = 0x12;
    tl += pb_put_varint(top + tl, ml);
    size_t total = tl + ml;
    uint8_t body_tag[16];
    size_t bl = 0;
    body_tag[bl++] = 0x1a;
    bl += pb_put_varint(body_tag + bl, any_len);
    total += bl + any_len;
    uint8_t prefix[5] = {0, (uint8_t)(total >> 24), (uint8_t)(total >> 16), (uint8_t)(total >> 8), (uint8_t)total};
    buf_put(b, prefix, 5);
    buf_put(b, top, tl);
    buf_put(b, meta, ml);
    buf_put(b, body_tag, bl);
    buf_put(b, anyh, al);
    buf_put(b, json, json_len);
}

/* resultCode / errorCode from the head of a JSON body; -1000 when absent */
static long json_int(const uint8_t *p, size_t n, const char *key) {
    size_t kl = strlen(key);
    const uint8_t *k = memmem(p, n, key, kl);
    if (!k) return -1000;
    const uint8_t *v = k + kl, *end = p + n;
    int neg = 0;
    long r = 0;
    if (v < end && *v == '-') { neg = 1; v++; }
    if (v >= end || *v < '0' || *v > '9') return -1000;
    while (v < end && *v >= '0' && *v <= '9') r = r * 10 + (*v++ - '0');
    return neg ? -r : r;
}

/* --- connections ------------------------------------------------------------------------- */
static void conn_fail(conn_t *c, const char *why);
static void conn_flush(conn_t *c);

static call_t *call_new(conn_t *c, int kind, const uint8_t *req, size_t len) {
    call_t *k = free_calls;
    if (k) free_calls = k->next_free;
    else if (!(k = malloc(sizeof *k))) { perror("malloc"); exit(2); }
    k->c = c; k->kind = kind; k->req = req; k->req_len = len; k->sent = 0;
    k->head_len = 0; k->total = 0; k->grpc_status = -1;
    return k;
}

static void call_free(call_t *k) {
    k->next_free = free_calls;
    free_calls = k;
}

static ssize_t read_unary(nghttp2_session *s, int32_t sid, uint8_t *out, size_t len, uint32_t *flags,
                          nghttp2_data_source *src, void *ud) {
    (void)s; (void)sid; (void)ud;
    call_t *k = src->ptr;
    size_t n = k->req_len - k->sent;
    if (n > len) n = len;
    memcpy(out, k->req + k->sent, n);
    k->sent += n;
    if (k->sent == k->req_len) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static ssize_t read_stream(nghttp2_session *s, int32_t sid, uint8_t *out, size_t len, uint32_t *flags,
                           nghttp2_data_source *src, void *ud) {
    (void)s; (void)sid; (void)ud; (void)flags;
    conn_t *c = src->ptr;
    size_t n = c->bidi_out.len - c->bidi_sent;
    if (n == 0) {
        c->bidi_out.len = c->bidi_sent = 0;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (n > len) n = len;
    memcpy(out, c->bidi_out.p + c->bidi_sent, n);
    c->bidi_sent += n;
    return (ssize_t)n;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, \
                  NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE}

static int32_t submit(conn_t *c, const char *path, size_t path_len, nghttp2_data_provider *prd, void *ud) {
    nghttp2_nv nva[] = {
        NV(":method", "POST"), NV(":scheme", "http"), NV(":path", ""), NV(":authority", ""),
        NV("content-type", "application/grpc"), NV("te", "trailers"),
        NV("user-agent", "shoal-native-load/1"),
    };
    nva[2].value = (uint8_t *)path; nva[2].valuelen = path_len;
    nva[3].value = (uint8_t *)authority; nva[3].valuelen = strlen(authority);
    int32_t id = nghttp2_submit_request(c->s, NULL, nva, sizeof nva / sizeof nva[0], prd, ud);
    if (id < 0) conn_fail(c, "SUBMIT");
    return id;
}

static void submit_unary(conn_t *c, int kind, const uint8_t *req, size_t len) {
    call_t *k = call_new(c, kind, req, len);
    nghttp2_data_provider prd = {.source.ptr = k, .read_callback = read_unary};
    k->t0 = now_mono();
    if (submit(c, PATH_UNARY, sizeof PATH_UNARY - 1, &prd, k) < 0) { call_free(k); return; }
    c->inflight++;
}

static void refill(conn_t *c) {
    if (c->state != C_READY || !running) return;
    if (c->inflight > window - batch) return; /* wait until a batch of slots is free: one write */
    while (c->inflight < window && c->cursor < c->n_ops && !stop_new) {
        msg_t *m = &c->ops[c->cursor++];
        submit_unary(c, K_OP, m->p, m->len);
    }
}

static void on_stream_message(conn_t *c, const uint8_t *msg, size_t n) {
    const uint8_t *type, *body;
    size_t tl, bl;
    payload_parts(msg, n, &type, &tl, &body, &bl);
    if (!type) return;
    if (tl == 15 && memcmp(type, "SetupAckRequest", 15) == 0) {
        if (c->state == C_SETUP) {
            c->state = C_READY;
            lat_add(now_mono() - c->t_start);
        }
        return;
    }
    if (tl < 7 || memcmp(type + tl - 7, "Request", 7) != 0 || tl > 120) return;
    /* a server request: answer 200, echoing requestId */
    const uint8_t *rid = body ? memmem(body, bl, "\"requestId\":\"", 13) : NULL;
    if (!rid) return;
    rid += 13;
    const uint8_t *q = memchr(rid, '"', (size_t)(body + bl - rid));
    if (!q || q - rid > 64) return;
    char rtype[128], json[160];
    memcpy(rtype, type, tl - 7);
    memcpy(rtype + tl - 7, "Response", 8);
    int jl = snprintf(json, sizeof json, "{\"resultCode\":200,\"errorCode\":0,\"requestId\":\"%.*s\",\"success\":true}",
                      (int)(q - rid), rid);
    if (tl == 22 && memcmp(type, "ClientDetectionRequest", 22) == 0) detections++;
    grpc_payload(&c->bidi_out, rtype, tl + 1, json, (size_t)jl);
    nghttp2_session_resume_data(c->s, c->stream_id);
    if (tl == 23 && memcmp(type, "NotifySubscriberRequest", 23) == 0) {
        long port = json_int(body, bl, "\"port\":");
        if (push_n == push_cap) {
            push_cap = push_cap ? push_cap * 2 : 4096;
            pushes = realloc(pushes, push_cap * sizeof *pushes);
            if (!pushes) { perror("realloc"); exit(2); }
        }
        c->push_port = port == -1000 ? -1 : port;
        pushes[push_n++] = (push_rec_t){c->index, (int32_t)c->push_port, now_mono()};
        push_total++;
    }
}

static int cb_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len, void *ud) {
    (void)flags;
    conn_t *c = ud;
    if (sid == c->stream_id) {
        buf_put(&c->bidi_in, data, len);
        while (c->bidi_in.len >= 5) {
            const uint8_t *p = c->bidi_in.p;
            size_t m = ((size_t)p[1] << 24) | ((size_t)p[2] << 16) | ((size_t)p[3] << 8) | p[4];
            if (c->bidi_in.len < 5 + m) break;
            on_stream_message(c, p + 5, m);
            buf_drop(&c->bidi_in, 5 + m);
        }
        return 0;
    }
    call_t *k = nghttp2_session_get_stream_user_data(s, sid);
    if (!k) return 0;
    if (k->head_len < HEAD_KEEP) {
        size_t n = HEAD_KEEP - k->head_len;
        if (n > len) n = len;
        memcpy(k->head + k->head_len, data, n);
        k->head_len += n;
    }
    k->total += len;
    return 0;
}

static int cb_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                     const uint8_t *value, size_t vl, uint8_t flags, void *ud) {
    (void)flags; (void)ud;
    if (nl == 11 && memcmp(name, "grpc-status", 11) == 0) {
        call_t *k = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
        if (k && (void *)k != (void *)ud) {
            int v = 0;
            for (size_t i = 0; i < vl; i++) v = v * 10 + (value[i] - '0');
            k->grpc_status = v;
        }
    }
    return 0;
}

static void finish_call(conn_t *c, call_t *k, uint32_t h2_error) {
    char key[48];
    const char *bad = NULL;
    const uint8_t *type = NULL, *body = NULL;
    size_t tl = 0, bl = 0;
    if (h2_error) { snprintf(key, sizeof key, "H2_RST_%u", h2_error); bad = key; }
    else if (k->grpc_status > 0) { snprintf(key, sizeof key, "GRPC_STATUS_%d", k->grpc_status); bad = key; }
    else if (k->head_len < 5 || k->head[0] != 0) bad = "NO_MESSAGE";
    else {
        payload_parts(k->head + 5, k->head_len - 5, &type, &tl, &body, &bl);
        if (!body) bad = "NO_BODY";
        else {
            long rc = json_int(body, bl, "\"resultCode\":");
            if (rc != 200) {
                long ec = json_int(body, bl, "\"errorCode\":");
                snprintf(key, sizeof key, "%ld", ec != -1000 ? ec : rc);
                bad = key;
            }
        }
    }
    if (k->kind == K_CHECK) {
        if (!bad && !(tl == 19 && memcmp(type, "ServerCheckResponse", 19) == 0)) bad = "NOT_SERVER_CHECK_RESPONSE";
        if (bad) { err_count(bad); conn_fail(c, NULL); return; }
        /* the bi stream, ConnectionSetupRequest first; SetupAck makes the connection ready */
        c->state = C_SETUP;
        buf_put(&c->bidi_out, hs_setup.p, hs_setup.len);
        nghttp2_data_provider prd = {.source.ptr = c, .read_callback = read_stream};
        c->stream_id = submit(c, PATH_STREAM, sizeof PATH_STREAM - 1, &prd, c);
        return;
    }
    ops_done++;
    if (bad) err_count(bad);
    else {
        ops_ok++;
        lat_add(now_mono() - k->t0);
    }
}

static int cb_close(nghttp2_session *s, int32_t sid, uint32_t error_code, void *ud) {
    conn_t *c = ud;
    if (sid == c->stream_id) {
        if (c->state != C_DEAD) conn_fail(c, "STREAM_CLOSED");
        return 0;
    }
    call_t *k = nghttp2_session_get_stream_user_data(s, sid);
    if (!k) return 0;
    nghttp2_session_set_stream_user_data(s, sid, NULL);
    int kind = k->kind;
    if (kind == K_OP) c->inflight--;
    if (c->state != C_DEAD) finish_call(c, k, error_code);
    call_free(k);
    return 0;
}

static ssize_t cb_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *ud) {
    (void)s; (void)flags;
    conn_t *c = ud;
    buf_put(&c->out, data, len);
    return (ssize_t)len;
}

static nghttp2_session_callbacks *callbacks;

static void conn_fail(conn_t *c, const char *why) {
    if (c->state == C_DEAD) return;
    if (why) err_count(why);
    int was_ready = c->state == C_READY;
    c->state = C_DEAD;
    if (was_ready && running) {
        /* in-flight and unsent ops of a dead connection are errors */
        long lost = c->inflight + (long)(c->n_ops - c->cursor);
        for (long i = 0; i < lost; i++) err_count("CONNECTION_LOST");
        ops_done += lost;
        c->cursor = c->n_ops;
    }
    c->inflight = 0;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
}

static void conn_flush(conn_t *c) {
    if (c->state == C_DEAD) return;
    if (nghttp2_session_send(c->s) != 0) { conn_fail(c, "H2_SEND"); return; }
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t w = write(c->fd, c->out.p + off, c->out.len - off);
        if (w < 0) {
            if (errno == EAGAIN) break;
            if (errno == EINTR) continue;
            conn_fail(c, "WRITE");
            return;
        }
        off += (size_t)w;
    }
    if (off) buf_drop(&c->out, off);
    int want = c->out.len > 0;
    if (want != c->want_write) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_write = want;
    }
}

static void conn_start_h2(conn_t *c) {
    nghttp2_session_client_new(&c->s, callbacks, c);
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 24},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 1 << 16},
    };
    nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, iv, 3);
    nghttp2_session_set_local_window_size(c->s, NGHTTP2_FLAG_NONE, 0, 1 << 26);
    c->state = C_CHECK;
    submit_unary(c, K_CHECK, hs_check.p, hs_check.len);
    c->inflight = 0; /* the check is not an op */
}

static void conn_readable(conn_t *c) {
    static uint8_t rbuf[1 << 18];
    for (;;) {
        ssize_t n = read(c->fd, rbuf, sizeof rbuf);
        if (n == 0) { conn_fail(c, "EOF"); return; }
        if (n < 0) {
            if (errno == EAGAIN) break;
            if (errno == EINTR) continue;
            conn_fail(c, "READ");
            return;
        }
        ssize_t r = nghttp2_session_mem_recv(c->s, rbuf, (size_t)n);
        if (r < 0) { conn_fail(c, "H2_RECV"); return; }
        if (c->state == C_DEAD) return;
        if ((size_t)n < sizeof rbuf) break;
    }
    refill(c);
    conn_flush(c);
}

static void on_event(conn_t *c, uint32_t events) {
    if (c->state == C_DEAD) return;
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err) { conn_fail(c, "CONNECT"); return; }
        conn_start_h2(c);
        conn_flush(c);
        return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) conn_readable(c);
    if (c->state != C_DEAD && (events & EPOLLOUT)) conn_flush(c);
}

/* --- the loop ------------------------------------------------------------------------------ */
static void poll_once(int timeout_ms) {
    struct epoll_event evs[256];
    int n = epoll_wait(ep, evs, 256, timeout_ms);
    for (int i = 0; i < n; i++) on_event(evs[i].data.ptr, evs[i].events);
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(n ? (size_t)n : 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(2); }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static uint32_t rd32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

/* plan -> per connection message lists (pointing into blob) */
static msg_t **parse_plan(const uint8_t *blob, size_t len, uint32_t *n_out, uint32_t **counts) {
    size_t i = 4;
    uint32_t n = rd32(blob);
    msg_t **lists = calloc(n ? n : 1, sizeof *lists);
    *counts = calloc(n ? n : 1, sizeof **counts);
    for (uint32_t ci = 0; ci < n; ci++) {
        uint32_t m = rd32(blob + i);
        i += 4;
        lists[ci] = calloc(m ? m : 1, sizeof(msg_t));
        for (uint32_t j = 0; j < m; j++) {
            uint32_t l = rd32(blob + i);
            i += 4;
            if (i + l > len) { fprintf(stderr, "plan truncated\n"); exit(2); }
            lists[ci][j].p = blob + i;
            lists[ci][j].len = l;
            i += l;
        }
        (*counts)[ci] = m;
    }
    *n_out = n;
    return lists;
}

static void print_errors(FILE *o) {
    fputs("{", o);
    for (int i = 0; i < n_errs; i++) fprintf(o, "%s\"%s\":%ld", i ? "," : "", errs[i].key, errs[i].n);
    fputs("}", o);
    n_errs = 0;
}

static void cmd_connect(const char *host, int port, int count, const char *hs_path, const char *lat_path,
                        double timeout_s) {
    size_t len;
    uint32_t n, *counts;
    free(hs_blob);
    hs_blob = read_file(hs_path, &len);
    msg_t **l = parse_plan(hs_blob, len, &n, &counts);
    if (n != 1 || counts[0] != 2) { fprintf(stderr, "handshake file needs 1 x 2 messages\n"); exit(2); }
    hs_check = l[0][0];
    hs_setup = l[0][1];
    free(l[0]); free(l); free(counts);
    snprintf(authority, sizeof authority, "%s:%d", host, port);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) { /* a name: its first IPv4 address */
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
        if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) {
            printf("{\"error\":\"cannot resolve %s\"}\n", host);
            fflush(stdout);
            return;
        }
        sa.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    }
    double t_wall = now_wall(), deadline = now_mono() + timeout_s;
    int first = n_conns;
    lat_n = 0;
    for (int i = 0; i < count; i++) {
        if (n_conns == cap_conns) {
            cap_conns = cap_conns ? cap_conns * 2 : 256;
            conns = realloc(conns, cap_conns * sizeof *conns);
        }
        conn_t *c = calloc(1, sizeof *c);
        c->index = n_conns;
        c->push_port = -2;
        conns[n_conns++] = c;
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->t_start = now_mono();
        c->state = C_CONNECTING;
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
            conn_fail(c, "CONNECT");
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
        c->want_write = 1;
    }
    for (;;) {
        int pending = 0;
        for (int i = first; i < n_conns; i++) pending += conns[i]->state != C_READY && conns[i]->state != C_DEAD;
        if (!pending || now_mono() > deadline) break;
        poll_once(50);
    }
    int opened = 0, failed = 0;
    for (int i = first; i < n_conns; i++) {
        if (conns[i]->state == C_READY) opened++;
        else { if (conns[i]->state != C_DEAD) conn_fail(conns[i], "HANDSHAKE_TIMEOUT"); failed++; }
    }
    lat_write(lat_path);
    printf("{\"opened\":%d,\"failed\":%d,\"start\":%.6f,\"end\":%.6f,\"errors\":", opened, failed, t_wall, now_wall());
    print_errors(stdout);
    printf("}\n");
    fflush(stdout);
}

static void cmd_run(const char *plan_path, int win, double max_s, const char *lat_path, int bat, int coalesce_us) {
    size_t len;
    uint32_t n, *counts;
    uint8_t *blob = read_file(plan_path, &len);
    msg_t **lists = parse_plan(blob, len, &n, &counts);
    window = win < 1 ? 1 : win;
    batch = bat < 1 ? 1 : bat > window ? window : bat;
    ops_ok = ops_done = 0;
    lat_n = 0;
    uint64_t planned = 0;
    for (int i = 0; i < n_conns; i++) {
        conn_t *c = conns[i];
        c->ops = i < (int)n ? lists[i] : NULL;
        c->n_ops = i < (int)n ? counts[i] : 0;
        c->cursor = 0;
        if (c->state != C_READY) {
            for (uint32_t j = 0; j < c->n_ops; j++) err_count("CONNECTION_LOST");
            ops_done += c->n_ops;
            c->cursor = c->n_ops;
        }
        planned += c->n_ops;
    }
    double cpu0 = cpu_self(), t_wall = now_wall(), t0 = now_mono(), deadline = t0 + max_s;
    int truncated = 0;
    running = 1;
    stop_new = 0;
    for (int i = 0; i < n_conns; i++) { refill(conns[i]); conn_flush(conns[i]); }
    double drain_until = 0;
    for (;;) {
        int busy = 0;
        for (int i = 0; i < n_conns; i++) {
            conn_t *c = conns[i];
            if (c->state == C_READY && (c->inflight > 0 || (!stop_new && c->cursor < c->n_ops))) { busy = 1; break; }
        }
        if (!busy) break;
        double t = now_mono();
        if (!stop_new && t > deadline) {
            stop_new = 1;
            truncated = 1;
            drain_until = t + 30.0;
        }
        if (stop_new && t > drain_until) {
            for (int i = 0; i < n_conns; i++) if (conns[i]->state == C_READY && conns[i]->inflight) conn_fail(conns[i], "DRAIN_TIMEOUT");
            break;
        }
        poll_once(100);
        if (coalesce_us > 0) {
            struct timespec ts = {.tv_sec = coalesce_us / 1000000, .tv_nsec = (coalesce_us % 1000000) * 1000L};
            nanosleep(&ts, NULL);
        }
    }
    running = 0;
    double t_end = now_wall(), cpu = cpu_self() - cpu0;
    uint64_t unsent = 0;
    for (int i = 0; i < n_conns; i++) {
        conn_t *c = conns[i];
        unsent += c->n_ops - c->cursor;
        c->ops = NULL; c->n_ops = c->cursor = 0;
    }
    lat_write(lat_path);
    printf("{\"ops\":%llu,\"planned\":%llu,\"unsent\":%llu,\"start\":%.6f,\"end\":%.6f,\"client_cpu_s\":%.6f,"
           "\"truncated\":%s,\"detections\":%ld,\"errors\":",
           (unsigned long long)ops_ok, (unsigned long long)planned, (unsigned long long)unsent, t_wall, t_end, cpu,
           truncated ? "true" : "false", detections);
    print_errors(stdout);
    printf("}\n");
    fflush(stdout);
    for (uint32_t i = 0; i < n; i++) free(lists[i]);
    free(lists); free(counts); free(blob);
}

static void cmd_await(long port, int count, double timeout_s, const char *path) {
    double t0 = now_mono(), deadline = t0 + timeout_s;
    int seen = 0, live = 0;
    for (;;) {
        seen = live = 0;
        for (int i = 0; i < n_conns; i++) {
            if (conns[i]->state != C_READY) continue;
            live++;
            seen += conns[i]->push_port == port;
        }
        if (seen >= count || now_mono() > deadline) break;
        poll_once(20);
    }
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    if (push_n) fwrite(pushes, sizeof *pushes, push_n, f);
    fclose(f);
    printf("{\"seen\":%d,\"live\":%d,\"records\":%zu,\"pushes_total\":%ld,\"timed_out\":%s,"
           "\"waited_s\":%.6f,\"detections\":%ld,\"errors\":",
           seen, live, push_n, push_total, seen >= count ? "false" : "true", now_mono() - t0, detections);
    push_n = 0;
    print_errors(stdout);
    printf("}\n");
    fflush(stdout);
}

static void cmd_close(void) {
    int closed = 0;
    for (int i = 0; i < n_conns; i++) {
        conn_t *c = conns[i];
        if (c->state != C_DEAD) {
            nghttp2_session_terminate_session(c->s, NGHTTP2_NO_ERROR);
            conn_flush(c);
            c->state = C_READY; /* conn_fail below must not count a lost run */
            running = 0;
            conn_fail(c, NULL);
            closed++;
        }
        if (c->s) nghttp2_session_del(c->s);
        free(c->out.p); free(c->bidi_in.p); free(c->bidi_out.p);
        free(c);
    }
    n_conns = 0;
    printf("{\"closed\":%d}\n", closed);
    fflush(stdout);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_send_callback(callbacks, cb_send);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, cb_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, cb_close);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, cb_header);
    /* stdin: commands. Between commands the loop keeps the connections answering pings and
     * server requests. */
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
    char line[4096];
    size_t have = 0;
    for (;;) {
        struct epoll_event evs[256];
        int n = epoll_wait(ep, evs, 256, 1000);
        int input = 0;
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) input = 1;
            else on_event(evs[i].data.ptr, evs[i].events);
        }
        if (!input) continue;
        ssize_t r = read(0, line + have, sizeof line - 1 - have);
        if (r <= 0) { cmd_close(); return 0; }
        have += (size_t)r;
        line[have] = 0;
        char *nl;
        while ((nl = memchr(line, '\n', have))) {
            *nl = 0;
            char a[1024], b[1024], c[1024];
            int port, count, win, bat = 1, co = 0;
            double t;
            if (sscanf(line, "connect %1023s %d %d %1023s %1023s %lf", a, &port, &count, b, c, &t) == 6)
                cmd_connect(a, port, count, b, c, t);
            else if (sscanf(line, "run %1023s %d %lf %1023s %d %d", a, &win, &t, b, &bat, &co) >= 4)
                cmd_run(a, win, t, b, bat, co);
            else if (sscanf(line, "await %d %d %lf %1023s", &port, &count, &t, a) == 4)
                cmd_await(port, count, t, a);
            else if (strncmp(line, "close", 5) == 0)
                cmd_close();
            else { printf("{\"error\":\"unknown command\"}\n"); fflush(stdout); }
            size_t used = (size_t)(nl - line) + 1;
            memmove(line, nl + 1, have - used);
            have -= used;
            line[have] = 0;
        }
    }
}
