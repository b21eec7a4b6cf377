"""The handler of {{name}}: called once per delivery, returns its outcome."""

import wharf


@wharf.handler
def handle(d: wharf.Delivery) -> wharf.Outcome:
    wharf.log.info(f"attempt {d.attempt} of {d.text if d.text is not None else '<binary>'!r}")
    return wharf.ack()
