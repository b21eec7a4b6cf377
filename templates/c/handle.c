/* {{name}}: a wharf message handler. */
#include "wharf.h"

wharf_outcome_t handle(const wharf_delivery_t *d) {
    wharf_info("attempt %u of message \"%.*s\"", d->attempt, WHARF_STR_ARG(wharf_opt_str(d->message_id)));
    /* To publish a message if this delivery is acked (the mount must grant
     * the address, see wharf.toml):
     *   wharf_message_t m = {.body = d->body, .subject = wharf_str("processed")};
     *   wharf_send_error_t e = wharf_send("{{name}}.out", &m);
     *   if (e != WHARF_SEND_OK)
     *       wharf_warn("send: %s", wharf_send_error_name(e));
     */
    return wharf_ack();
}
