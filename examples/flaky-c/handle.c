/* Decides by the body: "retry" retries at once, "later" retries after a
 * delay (the application property delay-ms, default 1000), "bad" is
 * dropped, anything else is acknowledged. */
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
    else
        outcome = wharf_ack();
    if (!text)
        body = wharf_str("<binary>");
    char name[32];
    wharf_info("attempt %u of \"%.*s\": %s", d->attempt, WHARF_STR_ARG(body),
               wharf_outcome_name(outcome, name, sizeof name));
    return outcome;
}
