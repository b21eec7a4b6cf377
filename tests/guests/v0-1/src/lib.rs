//! A handler built against the first contract, `wharf:handler@0.1.0`: it
//! logs through that version's `log` and acks a delivery whose body is
//! `v0.1`, dropping any other.

wit_bindgen::generate!({
    world: "handler",
    path: "../../../wit/v0.1.0",
});

use wharf::handler::log::{Level, log};

struct Handler;

impl Guest for Handler {
    fn handle(d: Delivery) -> Outcome {
        log(
            Level::Info,
            &format!("0.1.0 handler, attempt {}", d.attempt),
        );
        if d.body == b"v0.1" {
            Outcome::Ack
        } else {
            Outcome::Drop
        }
    }
}

export!(Handler);
