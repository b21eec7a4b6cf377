"""The handler of {{name}}: called once per delivery, returns its outcome."""

import wharf


@wharf.handler
def handle(d: wharf.Delivery) -> wharf.Outcome:
    wharf.log.info(f"attempt {d.attempt} of {d.text if d.text is not None else '<binary>'!r}")
    # To publish a message if this delivery is acked (the mount must grant
    # the address, see wharf.toml; wharf.SendError says why not in e.code):
    #   wharf.send("{{name}}.out", d.body, subject="processed")
    return wharf.ack()
