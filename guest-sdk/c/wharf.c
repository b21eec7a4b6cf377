/*
 * wharf.c: the C SDK over the generated bindings in gen/. Compile it with
 * your handler and gen/handler.c (see the README for the commands).
 */
#include "wharf.h"

#include <stdlib.h>
#include <string.h>

#include "gen/handler.h"

/* The SDK's views are laid out like the generated types, so a delivery's
 * strings and property list are handed to the handler without copying. */
#define SAME_LAYOUT(a, b) _Static_assert(sizeof(a) == sizeof(b) && _Alignof(a) == _Alignof(b), #a " differs from " #b)
SAME_LAYOUT(wharf_str_t, handler_string_t);
SAME_LAYOUT(wharf_bytes_t, handler_list_u8_t);
SAME_LAYOUT(wharf_value_t, wharf_handler_types_value_t);
SAME_LAYOUT(wharf_property_t, wharf_handler_types_property_t);
_Static_assert(offsetof(wharf_str_t, len) == offsetof(handler_string_t, len), "string view");
_Static_assert(offsetof(wharf_bytes_t, len) == offsetof(handler_list_u8_t, len), "byte view");
_Static_assert(offsetof(wharf_value_t, as) == offsetof(wharf_handler_types_value_t, val), "value payload");
_Static_assert(offsetof(wharf_property_t, value) == offsetof(wharf_handler_types_property_t, value), "property value");
_Static_assert(WHARF_VALUE_STRING == WHARF_HANDLER_TYPES_VALUE_STRING && WHARF_VALUE_INT == WHARF_HANDLER_TYPES_VALUE_INT &&
                   WHARF_VALUE_UINT == WHARF_HANDLER_TYPES_VALUE_UINT && WHARF_VALUE_FLOAT == WHARF_HANDLER_TYPES_VALUE_FLOAT &&
                   WHARF_VALUE_BOOL == WHARF_HANDLER_TYPES_VALUE_BOOLEAN && WHARF_VALUE_BYTES == WHARF_HANDLER_TYPES_VALUE_BYTES &&
                   WHARF_VALUE_TIMESTAMP == WHARF_HANDLER_TYPES_VALUE_TIMESTAMP && WHARF_VALUE_NULL == WHARF_HANDLER_TYPES_VALUE_NULL &&
                   WHARF_VALUE_OTHER == WHARF_HANDLER_TYPES_VALUE_OTHER,
               "value kinds");
_Static_assert(WHARF_TRACE == WHARF_HANDLER_LOG_LEVEL_TRACE && WHARF_ERROR == WHARF_HANDLER_LOG_LEVEL_ERROR, "log levels");

/* gen/handler.c pulls in the world's type object from wit-bindgen's
 * *_component_type.o; `wharf componentize` embeds the world instead. */
__attribute__((weak)) void __component_type_object_force_link_handler(void) {}

#ifdef WHARF_FREESTANDING
static void heap_release_delivery(void);
#endif

static const wharf_str_t *opt(const handler_option_string_t *o) {
    return o->is_some ? (const wharf_str_t *)&o->val : NULL;
}

static const wharf_bytes_t *opt_bytes(const handler_option_list_u8_t *o) {
    return o->is_some ? (const wharf_bytes_t *)&o->val : NULL;
}

static const uint32_t *opt_u32(const handler_option_u32_t *o) {
    return o->is_some ? &o->val : NULL;
}

static const int64_t *opt_s64(const handler_option_s64_t *o) {
    return o->is_some ? &o->val : NULL;
}

void exports_handler_handle(handler_delivery_t *g, handler_outcome_t *ret) {
    wharf_delivery_t d;
    d.body.ptr = g->body.ptr;
    d.body.len = g->body.len;
    d.content_type = opt(&g->content_type);
    d.subject = opt(&g->subject);
    d.message_id = opt(&g->message_id);
    d.correlation_id = opt(&g->correlation_id);
    d.reply_to = opt(&g->reply_to);
    d.properties = (const wharf_property_t *)g->properties.ptr;
    d.properties_len = g->properties.len;
    d.address = *(const wharf_str_t *)&g->address;
    d.tenant = *(const wharf_str_t *)&g->tenant;
    d.mount = *(const wharf_str_t *)&g->mount;
    d.attempt = g->attempt;
    d.presettled = g->presettled;
    d.to = opt(&g->to);
    d.user_id = opt_bytes(&g->user_id);
    d.group_id = opt(&g->group_id);
    d.group_sequence = opt_u32(&g->group_sequence);
    d.reply_to_group_id = opt(&g->reply_to_group_id);
    d.creation_time_ms = opt_s64(&g->creation_time);
    d.absolute_expiry_time_ms = opt_s64(&g->absolute_expiry_time);
    d.priority = g->priority;
    d.durable = g->durable;
    d.first_acquirer = g->first_acquirer;
    d.annotations = (const wharf_property_t *)g->annotations.ptr;
    d.annotations_len = g->annotations.len;

    wharf_outcome_t o = handle(&d);
    switch (o.kind) {
    case WHARF_ACK:
        ret->tag = WHARF_HANDLER_TYPES_OUTCOME_ACK;
        break;
    case WHARF_RETRY:
        ret->tag = WHARF_HANDLER_TYPES_OUTCOME_RETRY;
        break;
    case WHARF_RETRY_AFTER:
        ret->tag = WHARF_HANDLER_TYPES_OUTCOME_RETRY_AFTER;
        ret->val.retry_after = o.delay_ms;
        break;
    case WHARF_DROP:
        ret->tag = WHARF_HANDLER_TYPES_OUTCOME_DROP;
        break;
    default:
        /* Not an outcome: a bug in the handler, which the host retries. */
        abort();
    }
    handler_delivery_free(g);
#ifdef WHARF_FREESTANDING
    heap_release_delivery();
#endif
}

wharf_str_t wharf_str(const char *s) {
    wharf_str_t v = {s, s ? strlen(s) : 0};
    return v;
}

bool wharf_str_eq(wharf_str_t a, const char *s) {
    size_t n = strlen(s);
    return a.len == n && (n == 0 || memcmp(a.ptr, s, n) == 0);
}

wharf_str_t wharf_opt_str(const wharf_str_t *s) {
    wharf_str_t empty = {"", 0};
    return s ? *s : empty;
}

wharf_str_t wharf_body_str(const wharf_delivery_t *d) {
    wharf_str_t v = {(const char *)d->body.ptr, d->body.len};
    return v;
}

bool wharf_body_is_utf8(const wharf_delivery_t *d) {
    const uint8_t *p = d->body.ptr, *end = p + d->body.len;
    while (p < end) {
        uint8_t c = *p++;
        if (c < 0x80)
            continue;
        size_t more;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0) {
            more = 1;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            more = 2;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            more = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if ((size_t)(end - p) < more)
            return false;
        for (size_t i = 0; i < more; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        p += more;
        /* Overlong forms, surrogates and values past U+10FFFF are invalid. */
        if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) || (more == 3 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return false;
    }
    return true;
}

const wharf_value_t *wharf_property(const wharf_delivery_t *d, const char *key) {
    for (size_t i = 0; i < d->properties_len; i++) {
        if (wharf_str_eq(d->properties[i].key, key))
            return &d->properties[i].value;
    }
    return NULL;
}

const wharf_value_t *wharf_annotation(const wharf_delivery_t *d, const char *key) {
    for (size_t i = 0; i < d->annotations_len; i++) {
        if (wharf_str_eq(d->annotations[i].key, key))
            return &d->annotations[i].value;
    }
    return NULL;
}

bool wharf_property_str(const wharf_delivery_t *d, const char *key, wharf_str_t *out) {
    const wharf_value_t *v = wharf_property(d, key);
    if (!v || v->kind != WHARF_VALUE_STRING)
        return false;
    *out = v->as.str;
    return true;
}

void wharf_log(wharf_level_t level, wharf_str_t message) {
    handler_string_t s = {(uint8_t *)message.ptr, message.len};
    wharf_handler_log_log((wharf_handler_log_level_t)level, &s);
}

/* ---- publishing ---- */

_Static_assert(WHARF_SEND_DENIED == WHARF_HANDLER_OUTBOX_SEND_ERROR_DENIED + 1 &&
                   WHARF_SEND_TOO_MANY == WHARF_HANDLER_OUTBOX_SEND_ERROR_TOO_MANY + 1 &&
                   WHARF_SEND_TOO_LARGE == WHARF_HANDLER_OUTBOX_SEND_ERROR_TOO_LARGE + 1 &&
                   WHARF_SEND_NO_REPLY_TO == WHARF_HANDLER_OUTBOX_SEND_ERROR_NO_REPLY_TO + 1,
               "send errors");

static handler_option_string_t opt_out(wharf_str_t s) {
    handler_option_string_t o;
    o.is_some = s.len > 0;
    o.val.ptr = (uint8_t *)s.ptr;
    o.val.len = s.len;
    return o;
}

/* The host copies the message during the call: it is lowered in place. */
static wharf_handler_outbox_message_t lower_message(const wharf_message_t *m) {
    wharf_handler_outbox_message_t g;
    g.body.ptr = (uint8_t *)m->body.ptr;
    g.body.len = m->body.len;
    g.content_type = opt_out(m->content_type);
    g.subject = opt_out(m->subject);
    g.message_id = opt_out(m->message_id);
    g.correlation_id = opt_out(m->correlation_id);
    g.properties.ptr = (wharf_handler_outbox_property_t *)m->properties;
    g.properties.len = m->properties ? m->properties_len : 0;
    g.durable = !m->transient;
    g.group_id = opt_out(m->group_id);
    g.group_sequence.is_some = m->group_sequence != NULL;
    g.group_sequence.val = m->group_sequence ? *m->group_sequence : 0;
    g.reply_to_group_id = opt_out(m->reply_to_group_id);
    g.priority.is_some = m->priority != NULL;
    g.priority.val = m->priority ? *m->priority : 0;
    g.creation_time.is_some = m->creation_time_ms != NULL;
    g.creation_time.val = m->creation_time_ms ? *m->creation_time_ms : 0;
    g.absolute_expiry_time.is_some = m->absolute_expiry_time_ms != NULL;
    g.absolute_expiry_time.val = m->absolute_expiry_time_ms ? *m->absolute_expiry_time_ms : 0;
    g.delay.is_some = m->delay_ms > 0;
    g.delay.val = m->delay_ms;
    return g;
}

wharf_send_error_t wharf_send_str(wharf_str_t address, const wharf_message_t *m) {
    handler_string_t a = {(uint8_t *)address.ptr, address.len};
    wharf_handler_outbox_message_t g = lower_message(m);
    wharf_handler_outbox_send_error_t err;
    if (wharf_handler_outbox_send(&a, &g, &err))
        return WHARF_SEND_OK;
    return (wharf_send_error_t)(err + 1);
}

wharf_send_error_t wharf_send(const char *address, const wharf_message_t *m) {
    return wharf_send_str(wharf_str(address), m);
}

wharf_send_error_t wharf_reply(const wharf_message_t *m) {
    wharf_handler_outbox_message_t g = lower_message(m);
    wharf_handler_outbox_send_error_t err;
    if (wharf_handler_outbox_reply(&g, &err))
        return WHARF_SEND_OK;
    return (wharf_send_error_t)(err + 1);
}

const char *wharf_send_error_name(wharf_send_error_t e) {
    switch (e) {
    case WHARF_SEND_OK:
        return "ok";
    case WHARF_SEND_DENIED:
        return "denied";
    case WHARF_SEND_TOO_MANY:
        return "too-many";
    case WHARF_SEND_TOO_LARGE:
        return "too-large";
    case WHARF_SEND_NO_REPLY_TO:
        return "no-reply-to";
    }
    return "unknown";
}

wharf_bytes_t wharf_text(const char *s) {
    wharf_bytes_t b = {(const uint8_t *)s, s ? strlen(s) : 0};
    return b;
}

/* ---- formatting, the same with wasi-libc and without any libc ---- */

typedef struct sink {
    char *buf;
    size_t len, cap;
} sink_t;

static void put(sink_t *s, const char *p, size_t n) {
    if (n == 0)
        return;
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 128;
        while (cap < s->len + n)
            cap *= 2;
        char *buf = realloc(s->buf, cap);
        if (!buf)
            abort();
        s->buf = buf;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

static void put_repeat(sink_t *s, char c, size_t n) {
    while (n--)
        put(s, &c, 1);
}

typedef struct spec {
    bool left, zero, plus;
    size_t width;
} spec_t;

/* Writes sign/prefix + digits padded to the spec's width. */
static void put_field(sink_t *s, const spec_t *sp, const char *prefix, size_t prefix_len, const char *digits, size_t n) {
    size_t total = prefix_len + n;
    size_t pad = sp->width > total ? sp->width - total : 0;
    if (!sp->left && !sp->zero)
        put_repeat(s, ' ', pad);
    put(s, prefix, prefix_len);
    if (!sp->left && sp->zero)
        put_repeat(s, '0', pad);
    put(s, digits, n);
    if (sp->left)
        put_repeat(s, ' ', pad);
}

/* Digits of v in base 10 or 16, written backwards into the end of buf. */
static size_t utoa(uint64_t v, unsigned base, bool upper, char *end) {
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    size_t n = 0;
    do {
        *--end = digits[v % base];
        v /= base;
        n++;
    } while (v);
    return n;
}

/* Fixed-point digits of v >= 0 (below 1.8e19), written backwards into the
 * end of a buffer of at least 48 bytes; returns how many. */
static size_t fixed(double v, int precision, char *end) {
    uint64_t scale = 1;
    for (int i = 0; i < precision; i++)
        scale *= 10;
    uint64_t ip = (uint64_t)v;
    uint64_t fp = (uint64_t)((v - (double)ip) * (double)scale + 0.5);
    if (fp >= scale) {
        fp -= scale;
        ip++;
    }
    size_t n = 0;
    if (precision > 0) {
        size_t k = utoa(fp, 10, false, end);
        while (k < (size_t)precision)
            end[-(ptrdiff_t)++k] = '0';
        n = k;
        end[-(ptrdiff_t)++n] = '.';
    }
    return n + utoa(ip, 10, false, end - n);
}

static void put_float(sink_t *s, const spec_t *sp, double v, int precision) {
    const char *sign = "";
    if (v != v) {
        put_field(s, sp, "", 0, "nan", 3);
        return;
    }
    if (v < 0) {
        sign = "-";
        v = -v;
    } else if (sp->plus) {
        sign = "+";
    }
    if (v > 1.7976931348623157e308) {
        put_field(s, sp, sign, *sign != 0, "inf", 3);
        return;
    }
    if (precision > 17)
        precision = 17;
    char buf[64], *end = buf + sizeof buf;
    size_t n = 0;
    if (v >= 1.8e19) {
        /* Past the integer path: d.ddddde+NN. */
        unsigned exp = 0;
        while (v >= 10) {
            v /= 10;
            exp++;
        }
        n = utoa(exp, 10, false, end);
        end[-(ptrdiff_t)++n] = '+';
        end[-(ptrdiff_t)++n] = 'e';
    }
    n += fixed(v, precision, end - n);
    put_field(s, sp, sign, *sign != 0, end - n, n);
}

static void format(sink_t *s, const char *fmt, va_list ap) {
    while (*fmt) {
        const char *run = fmt;
        while (*fmt && *fmt != '%')
            fmt++;
        put(s, run, (size_t)(fmt - run));
        if (!*fmt)
            break;
        const char *start = fmt++;
        spec_t sp = {false, false, false, 0};
        for (;; fmt++) {
            if (*fmt == '-')
                sp.left = true;
            else if (*fmt == '0')
                sp.zero = true;
            else if (*fmt == '+')
                sp.plus = true;
            else if (*fmt != ' ' && *fmt != '#')
                break;
        }
        if (*fmt == '*') {
            int w = va_arg(ap, int);
            if (w < 0) {
                sp.left = true;
                w = -w;
            }
            sp.width = (size_t)w;
            fmt++;
        } else {
            while (*fmt >= '0' && *fmt <= '9')
                sp.width = sp.width * 10 + (size_t)(*fmt++ - '0');
        }
        int precision = -1;
        if (*fmt == '.') {
            fmt++;
            precision = 0;
            if (*fmt == '*') {
                precision = va_arg(ap, int);
                fmt++;
            } else {
                while (*fmt >= '0' && *fmt <= '9')
                    precision = precision * 10 + (*fmt++ - '0');
            }
        }
        int longs = 0; /* 1: l, 2: ll/j/z/t-sized */
        int shorts = 0;
        for (;; fmt++) {
            if (*fmt == 'l')
                longs++;
            else if (*fmt == 'h')
                shorts++;
            else if (*fmt == 'z' || *fmt == 't')
                longs = sizeof(size_t) == 8 ? 2 : 1;
            else if (*fmt == 'j')
                longs = 2;
            else if (*fmt != 'L')
                break;
        }
        char buf[32], *end = buf + sizeof buf;
        char conv = *fmt ? *fmt++ : '\0';
        switch (conv) {
        case 'd':
        case 'i': {
            int64_t v = longs >= 2 ? va_arg(ap, long long) : longs == 1 ? va_arg(ap, long) : va_arg(ap, int);
            if (shorts == 1)
                v = (short)v;
            else if (shorts >= 2)
                v = (signed char)v;
            uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            size_t n = utoa(u, 10, false, end);
            const char *sign = v < 0 ? "-" : sp.plus ? "+" : "";
            put_field(s, &sp, sign, *sign != 0, end - n, n);
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            uint64_t v = longs >= 2 ? va_arg(ap, unsigned long long)
                         : longs == 1 ? va_arg(ap, unsigned long)
                                      : va_arg(ap, unsigned);
            if (shorts == 1)
                v = (unsigned short)v;
            else if (shorts >= 2)
                v = (unsigned char)v;
            size_t n = utoa(v, conv == 'u' ? 10 : 16, conv == 'X', end);
            put_field(s, &sp, "", 0, end - n, n);
            break;
        }
        case 'p': {
            uintptr_t v = (uintptr_t)va_arg(ap, void *);
            size_t n = utoa(v, 16, false, end);
            put_field(s, &sp, "0x", 2, end - n, n);
            break;
        }
        case 'c': {
            char c = (char)va_arg(ap, int);
            put_field(s, &sp, "", 0, &c, 1);
            break;
        }
        case 's': {
            const char *str = va_arg(ap, const char *);
            if (!str)
                str = "(null)";
            size_t n = 0;
            while ((precision < 0 || n < (size_t)precision) && str[n])
                n++;
            spec_t plain = sp;
            plain.zero = false;
            put_field(s, &plain, "", 0, str, n);
            break;
        }
        case 'f':
        case 'F':
            put_float(s, &sp, va_arg(ap, double), precision < 0 ? 6 : precision);
            break;
        case '%':
            put(s, "%", 1);
            break;
        default:
            /* Unknown: written as it stands. */
            put(s, start, (size_t)(fmt - start));
            break;
        }
    }
}

void wharf_vlogf(wharf_level_t level, const char *fmt, va_list args) {
    sink_t s = {NULL, 0, 0};
    va_list ap;
    va_copy(ap, args);
    format(&s, fmt, ap);
    va_end(ap);
    wharf_str_t line = {s.buf ? s.buf : "", s.len};
    wharf_log(level, line);
    free(s.buf);
}

void wharf_logf(wharf_level_t level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    wharf_vlogf(level, fmt, ap);
    va_end(ap);
}

const char *wharf_outcome_name(wharf_outcome_t o, char *buf, size_t cap) {
    const char *name;
    switch (o.kind) {
    case WHARF_ACK:
        name = "Ack";
        break;
    case WHARF_RETRY:
        name = "Retry";
        break;
    case WHARF_DROP:
        name = "Drop";
        break;
    case WHARF_RETRY_AFTER: {
        char digits[24], *end = digits + sizeof digits;
        size_t n = utoa(o.delay_ms, 10, false, end);
        size_t i = 0;
        const char *head = "RetryAfter(";
        while (*head && i + 1 < cap)
            buf[i++] = *head++;
        for (size_t k = 0; k < n && i + 1 < cap; k++)
            buf[i++] = (end - n)[k];
        if (i + 1 < cap)
            buf[i++] = ')';
        if (cap)
            buf[i] = '\0';
        return buf;
    }
    default:
        name = "?";
        break;
    }
    size_t i = 0;
    while (name[i] && i + 1 < cap) {
        buf[i] = name[i];
        i++;
    }
    if (cap)
        buf[i] = '\0';
    return buf;
}

/* ---- WHARF_FREESTANDING: the little of libc the bindings and SDK use ---- */
#ifdef WHARF_FREESTANDING

/* A bump allocator over memory.grow. free only gives back the most recent
 * block; everything allocated for and during a delivery (the host's copy of
 * it, the handler's own allocations) is given back when `handle` returns, so
 * an instance the host reuses for many deliveries does not grow. */
extern unsigned char __heap_base;

#define WHARF_ALIGN 16
#define WHARF_PAGE 65536

typedef struct block {
    size_t size;
} block_t;
#define WHARF_HEADER WHARF_ALIGN

static uintptr_t heap_top, heap_end;
static unsigned char *last_block;

static uintptr_t align_up(uintptr_t v, uintptr_t a) {
    return (v + a - 1) & ~(a - 1);
}

static void heap_release_delivery(void) {
    if (heap_top)
        heap_top = align_up((uintptr_t)&__heap_base, WHARF_ALIGN);
    last_block = NULL;
}

static bool reserve(uintptr_t top) {
    if (top <= heap_end)
        return true;
    size_t pages = (size_t)((top - heap_end + WHARF_PAGE - 1) / WHARF_PAGE);
    if (__builtin_wasm_memory_grow(0, pages) == (size_t)-1)
        return false;
    heap_end += (uintptr_t)pages * WHARF_PAGE;
    return true;
}

void *malloc(size_t n) {
    if (!heap_top) {
        heap_top = align_up((uintptr_t)&__heap_base, WHARF_ALIGN);
        heap_end = (uintptr_t)__builtin_wasm_memory_size(0) * WHARF_PAGE;
    }
    size_t body = (size_t)align_up(n ? n : 1, WHARF_ALIGN);
    if (body < n)
        return NULL;
    uintptr_t start = heap_top + WHARF_HEADER;
    if (start + body < start || !reserve(start + body))
        return NULL;
    ((block_t *)heap_top)->size = n;
    heap_top = start + body;
    last_block = (unsigned char *)start;
    return last_block;
}

void free(void *p) {
    if (p && p == last_block) {
        heap_top = (uintptr_t)p - WHARF_HEADER;
        last_block = NULL;
    }
}

void *calloc(size_t count, size_t size) {
    size_t n = count * size;
    if (size && n / size != count)
        return NULL;
    void *p = malloc(n);
    if (p)
        memset(p, 0, n);
    return p;
}

void *realloc(void *p, size_t n) {
    if (!p)
        return malloc(n);
    block_t *b = (block_t *)((unsigned char *)p - WHARF_HEADER);
    if (n <= b->size) {
        return p;
    }
    if (p == last_block) {
        uintptr_t end = (uintptr_t)p + align_up(n, WHARF_ALIGN);
        if (end > (uintptr_t)p && reserve(end)) {
            b->size = n;
            heap_top = end;
            return p;
        }
        return NULL;
    }
    void *q = malloc(n);
    if (q)
        memcpy(q, p, b->size);
    return q;
}

/* no_builtin keeps the compiler from turning these loops back into calls
 * to themselves. */
__attribute__((no_builtin)) void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}

__attribute__((no_builtin)) void *memmove(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d < s) {
        while (n--)
            *d++ = *s++;
    } else {
        while (n--)
            d[n] = s[n];
    }
    return dst;
}

__attribute__((no_builtin)) void *memset(void *dst, int c, size_t n) {
    unsigned char *d = dst;
    while (n--)
        *d++ = (unsigned char)c;
    return dst;
}

__attribute__((no_builtin)) int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++) {
        if (*x != *y)
            return *x - *y;
    }
    return 0;
}

__attribute__((no_builtin)) size_t strlen(const char *s) {
    const char *p = s;
    while (*p)
        p++;
    return (size_t)(p - s);
}

_Noreturn void abort(void) {
    __builtin_trap();
}

#endif
