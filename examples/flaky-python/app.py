"""Decides by the body: `retry` retries at once, `later` retries after a delay
(the application property `delay-ms`, default 1000), `bad` is dropped,
anything else is acknowledged. `publish:ADDRESS` also sends the body on to
ADDRESS (and answers the message's reply-to, if it has one), published with
the ack; it is dropped if the mount does not grant that. `mirror:ADDRESS`
sends one message to ADDRESS that mirrors the delivery: its body, group-id,
group-sequence, reply-to-group-id, creation-time, absolute-expiry-time,
priority and durable; its application properties, then `to` and `user-id`
(when it has them), `first-acquirer`, and each message annotation as a
property `annotation:KEY`. Acknowledged when the send is taken, dropped (with
a warning) when not."""

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
    elif body is not None and body.startswith("mirror:"):
        outcome = mirror(d, body[len("mirror:") :])
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


def mirror(d: wharf.Delivery, address: str) -> wharf.Outcome:
    properties = list(d.properties)
    if d.to is not None:
        properties.append(wharf.Property("to", d.to))
    if d.user_id is not None:
        properties.append(wharf.Property("user-id", d.user_id))
    properties.append(wharf.Property("first-acquirer", d.first_acquirer))
    properties.extend(wharf.Property(f"annotation:{key}", value) for key, value in d.annotations)
    try:
        wharf.send(
            address,
            d.body,
            group_id=d.group_id,
            group_sequence=d.group_sequence,
            reply_to_group_id=d.reply_to_group_id,
            creation_time=d.creation_time,
            absolute_expiry_time=d.absolute_expiry_time,
            priority=d.priority,
            durable=d.durable,
            properties=properties,
        )
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
