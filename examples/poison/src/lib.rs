//! Fails every delivery, so each message is retried until the mount's attempt
//! limit sends it to the dead-letter address.

use wharf_guest::{Delivery, Outcome, log};

fn handle(d: Delivery) -> Outcome {
    log::warn(&format!("attempt {}: refusing this message", d.attempt));
    Outcome::Retry
}

wharf_guest::handler!(handle);
