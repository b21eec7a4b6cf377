/* Decides by the body: "retry" retries at once, "later" retries after a
 * delay (the application property delay-ms, default 1000), "bad" is
 * dropped, anything else is acknowledged. "publish:ADDRESS" also sends the
 * body on to ADDRESS (and answers the message's reply-to, if it has one),
 * published with the ack; it is dropped if the mount does not grant that.
 * "mirror:ADDRESS" sends one message to ADDRESS that mirrors the delivery:
 * its body, group-id, group-sequence, reply-to-group-id, creation-time,
 * absolute-expiry-time, priority and durable, and as application properties
 * the delivery's own, then "to" (string) and "user-id" (bytes) when it has
 * them, "first-acquirer" (boolean), and "annotation:KEY" for each message
 * annotation (at most MIRROR_MAX_PROPERTIES in all: the rest are left out);
 * acknowledged if that is sent, else dropped. */
#include "wharf.h"

#include <stdlib.h>
#include <string.h>

static uint64_t delay_ms(const wharf_delivery_t *d) {
    const wharf_value_t *v = wharf_property(d, "delay-ms");
    if (!v)
        return 1000;
    switch (v->kind) {
    case WHARF_VALUE_UINT:
        return v->as.u;
    case WHARF_VALUE_INT:
        return v->as.i < 0 ? 0 : (uint64_t)v->as.i;
    case WHARF_VALUE_STRING: {
        /* A whole decimal number, else the default. */
        uint64_t ms = 0;
        if (v->as.str.len == 0 || v->as.str.len > 19)
            return 1000;
        for (size_t i = 0; i < v->as.str.len; i++) {
            char c = v->as.str.ptr[i];
            if (c < '0' || c > '9')
                return 1000;
            ms = ms * 10 + (uint64_t)(c - '0');
        }
        return ms;
    }
    default:
        return 1000;
    }
}

static bool starts_with(wharf_str_t s, const char *prefix) {
    size_t i = 0;
    for (; prefix[i]; i++) {
        if (i >= s.len || s.ptr[i] != prefix[i])
            return false;
    }
    return true;
}

static wharf_outcome_t publish(const wharf_delivery_t *d, wharf_str_t address) {
    wharf_property_t props[] = {wharf_prop("attempt", wharf_value_int(d->attempt))};
    wharf_message_t m = {
        .body = d->body,
        .subject = wharf_str("flaky"),
        .properties = props,
        .properties_len = 1,
    };
    wharf_send_error_t e = wharf_send_str(address, &m);
    if (e == WHARF_SEND_OK && d->reply_to) {
        /* "sent to " and the address, in a buffer of the handler's own. */
        char text[256];
        size_t n = 0;
        for (const char *p = "sent to "; *p; p++)
            text[n++] = *p;
        for (size_t i = 0; i < address.len && n < sizeof text; i++)
            text[n++] = address.ptr[i];
        wharf_message_t answer = {.body = {(const uint8_t *)text, n}};
        e = wharf_reply(&answer);
    }
    if (e != WHARF_SEND_OK) {
        wharf_warn("publish to \"%.*s\": %s", WHARF_STR_ARG(address), wharf_send_error_name(e));
        return wharf_drop();
    }
    return wharf_ack();
}

#define MIRROR_MAX_PROPERTIES 64
#define ANNOTATION_PREFIX "annotation:"
#define ANNOTATION_PREFIX_LEN (sizeof ANNOTATION_PREFIX - 1)

static wharf_outcome_t mirror(const wharf_delivery_t *d, wharf_str_t address) {
    wharf_property_t props[MIRROR_MAX_PROPERTIES];
    size_t n = 0;
    for (size_t i = 0; i < d->properties_len && n < MIRROR_MAX_PROPERTIES; i++)
        props[n++] = d->properties[i];
    if (d->to && n < MIRROR_MAX_PROPERTIES)
        props[n++] = wharf_prop("to", wharf_value_str(*d->to));
    if (d->user_id && n < MIRROR_MAX_PROPERTIES)
        props[n++] = wharf_prop("user-id", wharf_value_bytes(*d->user_id));
    if (n < MIRROR_MAX_PROPERTIES)
        props[n++] = wharf_prop("first-acquirer", wharf_value_bool(d->first_acquirer));

    /* "annotation:" + key for the annotations that fit, in one block. */
    size_t annotations = d->annotations_len;
    if (annotations > MIRROR_MAX_PROPERTIES - n)
        annotations = MIRROR_MAX_PROPERTIES - n;
    size_t text_len = 0;
    for (size_t i = 0; i < annotations; i++) {
        size_t key_len = ANNOTATION_PREFIX_LEN + d->annotations[i].key.len;
        if (key_len < ANNOTATION_PREFIX_LEN || text_len + key_len < text_len)
            abort(); /* cannot happen: the keys are in memory */
        text_len += key_len;
    }
    char *text = NULL;
    if (text_len > 0) {
        text = malloc(text_len);
        if (!text)
            abort(); /* out of memory: a trap, which the host retries */
    }
    char *next = text;
    for (size_t i = 0; i < annotations; i++) {
        const wharf_property_t *a = &d->annotations[i];
        memcpy(next, ANNOTATION_PREFIX, ANNOTATION_PREFIX_LEN);
        if (a->key.len > 0)
            memcpy(next + ANNOTATION_PREFIX_LEN, a->key.ptr, a->key.len);
        props[n].key.ptr = next;
        props[n].key.len = ANNOTATION_PREFIX_LEN + a->key.len;
        props[n].value = a->value;
        next += props[n].key.len;
        n++;
    }

    wharf_message_t m = {
        .body = d->body,
        .group_id = wharf_opt_str(d->group_id),
        .group_sequence = d->group_sequence,
        .reply_to_group_id = wharf_opt_str(d->reply_to_group_id),
        .creation_time_ms = d->creation_time_ms,
        .absolute_expiry_time_ms = d->absolute_expiry_time_ms,
        .priority = &d->priority,
        .transient = !d->durable,
        .properties = props,
        .properties_len = n,
    };
    wharf_send_error_t e = wharf_send_str(address, &m);
    free(text);
    if (e != WHARF_SEND_OK) {
        wharf_warn("mirror to \"%.*s\": %s", WHARF_STR_ARG(address), wharf_send_error_name(e));
        return wharf_drop();
    }
    return wharf_ack();
}

wharf_outcome_t handle(const wharf_delivery_t *d) {
    wharf_str_t body = wharf_body_str(d);
    bool text = wharf_body_is_utf8(d);
    wharf_outcome_t outcome;
    if (text && wharf_str_eq(body, "retry"))
        outcome = wharf_retry();
    else if (text && wharf_str_eq(body, "later"))
        outcome = wharf_retry_after(delay_ms(d));
    else if (text && wharf_str_eq(body, "bad"))
        outcome = wharf_drop();
    else if (text && starts_with(body, "publish:")) {
        wharf_str_t address = {body.ptr + 8, body.len - 8};
        outcome = publish(d, address);
    } else if (text && starts_with(body, "mirror:")) {
        wharf_str_t address = {body.ptr + 7, body.len - 7};
        outcome = mirror(d, address);
    } else
        outcome = wharf_ack();
    if (!text)
        body = wharf_str("<binary>");
    char name[32];
    wharf_info("attempt %u of \"%.*s\": %s", d->attempt, WHARF_STR_ARG(body),
               wharf_outcome_name(outcome, name, sizeof name));
    return outcome;
}
