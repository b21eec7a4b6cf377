/*
 * wharf.h: write wharf message handlers in C.
 *
 * A handler is one function you define, from a delivery to an outcome:
 *
 *     #include "wharf.h"
 *
 *     wharf_outcome_t handle(const wharf_delivery_t *d) {
 *         wharf_info("attempt %u of message %.*s", d->attempt,
 *                    WHARF_STR_ARG(wharf_opt_str(d->message_id)));
 *         if (wharf_str_eq(wharf_body_str(d), "later"))
 *             return wharf_retry_after(2000);
 *         return wharf_ack();
 *     }
 *
 * The host owns the broker: it settles the message by the outcome you
 * return, counts attempts, dead-letters and publishes delayed copies. A trap
 * (abort, __builtin_trap, a bad memory access) counts as retry. wharf_send
 * and wharf_reply publish messages of the handler's own, only if it returns
 * wharf_ack().
 *
 * Everything a delivery points to lives until `handle` returns; copy what
 * you need beyond that. Strings are UTF-8 views, not NUL-terminated: print
 * them with "%.*s" and WHARF_STR_ARG(s).
 *
 * Build with wasi-libc (clang --target=wasm32-wasi -mexec-model=reactor), or
 * with no libc at all (--target=wasm32-unknown-unknown -nostdlib, with
 * -DWHARF_FREESTANDING): then this SDK provides malloc, calloc, realloc,
 * free, memcpy, memmove, memset, memcmp, strlen and abort, and the headers in
 * freestanding/ declare them. Its allocator gives back everything allocated
 * during a delivery when `handle` returns: keep nothing malloc'ed from one
 * delivery to the next (static storage is fine).
 */
#ifndef WHARF_H
#define WHARF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A UTF-8 string view: `len` bytes at `ptr`, not NUL-terminated. */
typedef struct wharf_str {
    const char *ptr;
    size_t len;
} wharf_str_t;

/* A byte view. */
typedef struct wharf_bytes {
    const uint8_t *ptr;
    size_t len;
} wharf_bytes_t;

/* printf arguments for "%.*s". */
#define WHARF_STR_ARG(s) (int)(s).len, (s).ptr

/* The kind of an application property's value. */
typedef enum wharf_value_kind {
    WHARF_VALUE_STRING = 0,    /* AMQP string and symbol: .as.str */
    WHARF_VALUE_INT = 1,       /* AMQP byte, short, int, long: .as.i */
    WHARF_VALUE_UINT = 2,      /* AMQP ubyte, ushort, uint, ulong: .as.u */
    WHARF_VALUE_FLOAT = 3,     /* AMQP float and double: .as.f */
    WHARF_VALUE_BOOL = 4,      /* AMQP boolean: .as.b */
    WHARF_VALUE_BYTES = 5,     /* AMQP binary: .as.bytes */
    WHARF_VALUE_TIMESTAMP = 6, /* AMQP timestamp, ms since the Unix epoch: .as.timestamp_ms */
    WHARF_VALUE_NULL = 7,      /* AMQP null */
    WHARF_VALUE_OTHER = 8,     /* any other AMQP type, rendered as text: .as.other */
} wharf_value_kind_t;

/* The typed value of an application property. */
typedef struct wharf_value {
    uint8_t kind; /* a wharf_value_kind_t */
    union {
        wharf_str_t str;
        int64_t i;
        uint64_t u;
        double f;
        bool b;
        wharf_bytes_t bytes;
        int64_t timestamp_ms;
        wharf_str_t other;
    } as;
} wharf_value_t;

/* One application property. */
typedef struct wharf_property {
    wharf_str_t key;
    wharf_value_t value;
} wharf_property_t;

/* One delivery of one message to this handler. */
typedef struct wharf_delivery {
    /* The message body: the bytes of its data sections, or for an
     * amqp-value body holding a string or binary, its contents. */
    wharf_bytes_t body;
    /* Message properties; NULL when the message has none. message_id and
     * correlation_id are rendered as text whatever their AMQP type. */
    const wharf_str_t *content_type;
    const wharf_str_t *subject;
    const wharf_str_t *message_id;
    const wharf_str_t *correlation_id;
    const wharf_str_t *reply_to;
    /* The application properties, in the order the message carries them. */
    const wharf_property_t *properties;
    size_t properties_len;
    /* The address the mount subscribes to, the tenant, the mount. */
    wharf_str_t address;
    wharf_str_t tenant;
    wharf_str_t mount;
    /* Which attempt this is; the first delivery of a message is attempt 1.
     * It counts the broker's redeliveries and the host's retry copies. */
    uint32_t attempt;
    /* True when the mount is at-most-once: the broker already let the
     * message go, so ack, drop and retry change nothing on the broker. */
    bool presettled;

    /* More message properties; NULL when the message has none. */
    /* properties.to: the address its publisher wrote on it (not always the
     * address it was delivered from). */
    const wharf_str_t *to;
    /* properties.user-id: the identity its publisher claims (a broker may
     * check it against the publisher's login, or not). */
    const wharf_bytes_t *user_id;
    /* properties.group-id: the group (the broker's message group on Artemis
     * and ActiveMQ Classic) the message belongs to, and group-sequence, its
     * place within its group. */
    const wharf_str_t *group_id;
    const uint32_t *group_sequence;
    /* properties.reply-to-group-id. */
    const wharf_str_t *reply_to_group_id;
    /* properties.creation-time and .absolute-expiry-time, in milliseconds
     * since the Unix epoch. */
    const int64_t *creation_time_ms;
    const int64_t *absolute_expiry_time_ms;
    /* header.priority: 4 when the message carries none. */
    uint8_t priority;
    /* header.durable. */
    bool durable;
    /* header.first-acquirer, as the broker sets it (many leave it false;
     * `attempt` is what counts deliveries). */
    bool first_acquirer;
    /* The message annotations, in the order the message carries them, keys
     * as text (a numeric key as its decimal digits): the broker's (x-opt-*)
     * and wharf's own, such as x-opt-delivery-time on a delayed retry copy
     * and x-opt-wharf-dead-letter-reason on a dead letter. */
    const wharf_property_t *annotations;
    size_t annotations_len;
} wharf_delivery_t;

typedef enum wharf_outcome_kind {
    WHARF_ACK = 0,         /* processed: the message leaves the queue */
    WHARF_RETRY = 1,       /* failed: deliver it again (counts towards the attempt limit) */
    WHARF_RETRY_AFTER = 2, /* failed: deliver it again, not before delay_ms */
    WHARF_DROP = 3,        /* never deliver it again: the dead-letter policy decides */
} wharf_outcome_kind_t;

/* What the handler decided; make one with the constructors below. */
typedef struct wharf_outcome {
    wharf_outcome_kind_t kind;
    uint64_t delay_ms; /* WHARF_RETRY_AFTER only */
} wharf_outcome_t;

/* The handler: define this function in your project. */
wharf_outcome_t handle(const wharf_delivery_t *d);

static inline wharf_outcome_t wharf_ack(void) {
    wharf_outcome_t o = {WHARF_ACK, 0};
    return o;
}
static inline wharf_outcome_t wharf_retry(void) {
    wharf_outcome_t o = {WHARF_RETRY, 0};
    return o;
}
static inline wharf_outcome_t wharf_retry_after(uint64_t delay_ms) {
    wharf_outcome_t o = {WHARF_RETRY_AFTER, delay_ms};
    return o;
}
static inline wharf_outcome_t wharf_drop(void) {
    wharf_outcome_t o = {WHARF_DROP, 0};
    return o;
}

/* Renders an outcome as the other wharf SDKs do in logs: "Ack", "Retry",
 * "RetryAfter(1500)", "Drop". Writes at most `cap` bytes including the NUL
 * into buf and returns buf. 32 bytes are always enough. */
const char *wharf_outcome_name(wharf_outcome_t o, char *buf, size_t cap);

/* A view of a NUL-terminated string. */
wharf_str_t wharf_str(const char *s);
/* Whether a view holds exactly the NUL-terminated string s. */
bool wharf_str_eq(wharf_str_t a, const char *s);
/* The view *s, or an empty view when s is NULL (for optional fields). */
wharf_str_t wharf_opt_str(const wharf_str_t *s);

/* The body as a string view (whatever its bytes). */
wharf_str_t wharf_body_str(const wharf_delivery_t *d);
/* Whether the body is valid UTF-8. */
bool wharf_body_is_utf8(const wharf_delivery_t *d);

/* The value of the first application property called key, or NULL. */
const wharf_value_t *wharf_property(const wharf_delivery_t *d, const char *key);
/* The application property key if it is a string: true and *out set. */
bool wharf_property_str(const wharf_delivery_t *d, const char *key, wharf_str_t *out);
/* The value of the first message annotation called key, or NULL. */
const wharf_value_t *wharf_annotation(const wharf_delivery_t *d, const char *key);

/* ---- Publishing ---- */

/* A message to publish with wharf_send or wharf_reply. Zero-initialised
 * fields are not set: an empty view is no such property, a NULL pointer no
 * such field, delay_ms 0 is no delay, and the message is durable unless
 * `transient`. wharf_send and wharf_reply copy what it points to before
 * they return. */
typedef struct wharf_message {
    /* The body, sent as one data section (wharf_text("...") for a string). */
    wharf_bytes_t body;
    /* properties.content-type and .subject. */
    wharf_str_t content_type;
    wharf_str_t subject;
    /* properties.message-id. When empty the host derives one from the
     * delivery's message-id and the output's index, so a redelivered
     * message publishes its outputs with the same ids. */
    wharf_str_t message_id;
    /* properties.correlation-id. When empty wharf_reply takes the
     * delivery's correlation-id, else its message-id. */
    wharf_str_t correlation_id;
    /* Application properties (a delivery's can be passed on as they are). */
    const wharf_property_t *properties;
    size_t properties_len;
    /* The broker may keep it in memory only (header.durable false). */
    bool transient;
    /* Deliver no sooner than this many milliseconds after publishing, on
     * brokers that schedule messages (Artemis); 0: no delay. */
    uint64_t delay_ms;
    /* properties.group-id: on Artemis and ActiveMQ Classic the broker's
     * message group, so one consumer at a time gets the group's messages. */
    wharf_str_t group_id;
    /* properties.group-sequence; NULL: none. */
    const uint32_t *group_sequence;
    /* properties.reply-to-group-id. */
    wharf_str_t reply_to_group_id;
    /* header.priority (brokers order by 0 to 9); NULL: the broker's
     * default, 4. */
    const uint8_t *priority;
    /* properties.creation-time and .absolute-expiry-time (brokers that
     * honour it discard the message after), in milliseconds since the Unix
     * epoch; NULL: none. A delivery's fields can be passed on as they are. */
    const int64_t *creation_time_ms;
    const int64_t *absolute_expiry_time_ms;
} wharf_message_t;

/* What wharf_send and wharf_reply return. On an error nothing of the
 * message was kept. */
typedef enum wharf_send_error {
    WHARF_SEND_OK = 0,
    /* The mount does not grant it: grants.send for the address,
     * grants.reply for a reply. */
    WHARF_SEND_DENIED = 1,
    /* The delivery already has the mount's max_outputs messages. */
    WHARF_SEND_TOO_MANY = 2,
    /* The delivery's messages would exceed the mount's max_output_bytes. */
    WHARF_SEND_TOO_LARGE = 3,
    /* wharf_reply on a delivery without a reply-to. */
    WHARF_SEND_NO_REPLY_TO = 4,
} wharf_send_error_t;

/* Publishes *m to `address` (NUL-terminated) if the handler returns
 * wharf_ack(), before the delivery is accepted; any other outcome or a trap
 * discards it. */
wharf_send_error_t wharf_send(const char *address, const wharf_message_t *m);
/* wharf_send with the address as a view. */
wharf_send_error_t wharf_send_str(wharf_str_t address, const wharf_message_t *m);
/* Publishes *m to the delivery's reply-to if the handler returns
 * wharf_ack(); its correlation-id, unless set, is the delivery's
 * correlation-id, else its message-id. */
wharf_send_error_t wharf_reply(const wharf_message_t *m);
/* "ok", "denied", "too-many", "too-large", "no-reply-to". */
const char *wharf_send_error_name(wharf_send_error_t e);

/* The bytes of a NUL-terminated string, e.g. for a message body. */
wharf_bytes_t wharf_text(const char *s);

/* Property values and properties, e.g. for wharf_message_t.properties:
 *     wharf_property_t props[] = {wharf_prop("n", wharf_value_int(3))}; */
static inline wharf_value_t wharf_value_str(wharf_str_t s) {
    wharf_value_t v = {WHARF_VALUE_STRING, {.str = s}};
    return v;
}
static inline wharf_value_t wharf_value_int(int64_t i) {
    wharf_value_t v = {WHARF_VALUE_INT, {.i = i}};
    return v;
}
static inline wharf_value_t wharf_value_uint(uint64_t u) {
    wharf_value_t v = {WHARF_VALUE_UINT, {.u = u}};
    return v;
}
static inline wharf_value_t wharf_value_float(double f) {
    wharf_value_t v = {WHARF_VALUE_FLOAT, {.f = f}};
    return v;
}
static inline wharf_value_t wharf_value_bool(bool b) {
    wharf_value_t v = {WHARF_VALUE_BOOL, {.b = b}};
    return v;
}
static inline wharf_value_t wharf_value_bytes(wharf_bytes_t bytes) {
    wharf_value_t v = {WHARF_VALUE_BYTES, {.bytes = bytes}};
    return v;
}
static inline wharf_value_t wharf_value_timestamp(int64_t ms) {
    wharf_value_t v = {WHARF_VALUE_TIMESTAMP, {.timestamp_ms = ms}};
    return v;
}
static inline wharf_value_t wharf_value_null(void) {
    wharf_value_t v = {WHARF_VALUE_NULL, {.i = 0}};
    return v;
}
/* A property called `key` (NUL-terminated). */
static inline wharf_property_t wharf_prop(const char *key, wharf_value_t value) {
    wharf_property_t p = {wharf_str(key), value};
    return p;
}

/* Log levels of the host's log. */
typedef enum wharf_level {
    WHARF_TRACE = 0,
    WHARF_DEBUG = 1,
    WHARF_INFO = 2,
    WHARF_WARN = 3,
    WHARF_ERROR = 4,
} wharf_level_t;

/* Writes one line into the host's log, tagged with tenant and mount. */
void wharf_log(wharf_level_t level, wharf_str_t message);

/* printf-style logging, with or without libc. The SDK's own formatter knows
 * %d %i %u %x %X %c %s %p %f %% with the length modifiers hh h l ll z j t,
 * a width, the flags - 0 +, and a precision (also .* for strings: pass
 * WHARF_STR_ARG(view) for "%.*s"). */
void wharf_logf(wharf_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void wharf_vlogf(wharf_level_t level, const char *fmt, va_list args);

#define wharf_trace(...) wharf_logf(WHARF_TRACE, __VA_ARGS__)
#define wharf_debug(...) wharf_logf(WHARF_DEBUG, __VA_ARGS__)
#define wharf_info(...) wharf_logf(WHARF_INFO, __VA_ARGS__)
#define wharf_warn(...) wharf_logf(WHARF_WARN, __VA_ARGS__)
#define wharf_error(...) wharf_logf(WHARF_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
