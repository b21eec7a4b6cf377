//! The handler of {{name}}: called once per delivery, returns its outcome.

use wharf_guest::{Delivery, Outcome, log};

fn handle(d: Delivery) -> Outcome {
    log::info(&format!(
        "attempt {} of {:?}",
        d.attempt,
        d.body_str().unwrap_or("<binary>")
    ));
    Outcome::Ack
}

wharf_guest::handler!(handle);
