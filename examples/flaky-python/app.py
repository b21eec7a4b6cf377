"""Decides by the body: `retry` retries at once, `later` retries after a delay
(the application property `delay-ms`, default 1000), `bad` is dropped,
anything else is acknowledged."""

import wharf


@wharf.handler
def handle(d: wharf.Delivery) -> wharf.Outcome:
    body = d.text
    if body == "retry":
        outcome = wharf.retry()
    elif body == "later":
        outcome = wharf.retry_after(delay_ms(d))
    elif body == "bad":
        outcome = wharf.drop()
    else:
        outcome = wharf.ack()
    shown = body if body is not None else "<binary>"
    wharf.log.info(f'attempt {d.attempt} of "{shown}": {outcome}')
    return outcome


def delay_ms(d: wharf.Delivery) -> int:
    value = d.property("delay-ms")
    if isinstance(value, bool) or isinstance(value, (float, wharf.Timestamp)):
        return 1000
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str):
        digits = value[1:] if value.startswith("+") else value
        if digits.isascii() and digits.isdigit() and int(digits) < 2**64:
            return int(digits)
    return 1000
