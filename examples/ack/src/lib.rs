//! Acknowledges every delivery.

use wharf_guest::{Delivery, Outcome};

fn handle(_: Delivery) -> Outcome {
    Outcome::Ack
}

wharf_guest::handler!(handle);
