/* Decides by the body: "retry" retries at once, "later" retries after a
 * delay (the application property delay-ms, default 1000), "bad" is
 * dropped, anything else is acknowledged. "publish:ADDRESS" also sends the
 * body on to ADDRESS (and answers the message's reply-to, if it has one),
 * published with the ack; it is dropped if the mount does not grant that. */
#include "wharf.h"

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
    } else
        outcome = wharf_ack();
    if (!text)
        body = wharf_str("<binary>");
    char name[32];
    wharf_info("attempt %u of \"%.*s\": %s", d->attempt, WHARF_STR_ARG(body),
               wharf_outcome_name(outcome, name, sizeof name));
    return outcome;
}
