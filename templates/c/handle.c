/* {{name}}: a wharf message handler. */
#include "wharf.h"

wharf_outcome_t handle(const wharf_delivery_t *d) {
    wharf_info("attempt %u of message \"%.*s\"", d->attempt, WHARF_STR_ARG(wharf_opt_str(d->message_id)));
    return wharf_ack();
}
