//! The handler of {{name}}: called once per delivery, returns its outcome.

use wharf_guest::{Delivery, Outcome, log};

fn handle(d: Delivery) -> Outcome {
    log::info(&format!(
        "attempt {} of {:?}",
        d.attempt,
        d.body_str().unwrap_or("<binary>")
    ));
    // To publish a message if this delivery is acked (the mount must grant
    // the address, see wharf.toml; a refusal is a `SendError` saying why):
    //   let out = wharf_guest::Message::new(d.body.clone()).with_subject("processed");
    //   if let Err(e) = wharf_guest::outbox::send("{{name}}.out", out) {
    //       log::warn(&format!("not sent: {e:?}"));
    //       return Outcome::Drop;
    //   }
    Outcome::Ack
}

wharf_guest::handler!(handle);
