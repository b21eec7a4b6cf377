"""Decides by the body: `retry` retries at once, `later` retries after a delay
(the application property `delay-ms`, default 1000), `bad` is dropped,
anything else is acknowledged. `publish:ADDRESS` also sends the body on to
ADDRESS (and answers the message's reply-to, if it has one), published with
the ack; it is dropped if the mount does not grant that."""

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
    elif body is not None and body.startswith("publish:"):
        outcome = publish(d, body[len("publish:") :])
    else:
        outcome = wharf.ack()
    shown = body if body is not None else "<binary>"
    wharf.log.info(f'attempt {d.attempt} of "{shown}": {outcome}')
    return outcome


def publish(d: wharf.Delivery, address: str) -> wharf.Outcome:
    try:
        wharf.send(address, d.body, subject="flaky", properties={"attempt": d.attempt})
        if d.reply_to is not None:
            wharf.reply(f"sent to {address}")
    except wharf.SendError as e:
        wharf.log.warn(str(e))
        return wharf.drop()
    return wharf.ack()


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
