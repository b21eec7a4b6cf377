//! A handler built against the second contract, `wharf:handler@0.2.0`: it
//! logs through that version's `log`, sends a copy of a delivery whose body
//! is `v0.2:ADDRESS` to ADDRESS through that version's `outbox` (with the
//! application properties it saw) and acks it; it drops any other.

wit_bindgen::generate!({
    world: "handler",
    path: "../../../wit/v0.2.0",
});

use wharf::handler::log::{Level, log};
use wharf::handler::outbox::{Message, send};

struct Handler;

impl Guest for Handler {
    fn handle(d: Delivery) -> Outcome {
        log(
            Level::Info,
            &format!("0.2.0 handler, attempt {}", d.attempt),
        );
        let Some(address) = d.body.strip_prefix(b"v0.2:") else {
            return Outcome::Drop;
        };
        let message = Message {
            body: d.body.clone(),
            content_type: None,
            subject: Some("v0.2".to_owned()),
            message_id: None,
            correlation_id: None,
            properties: d.properties.clone(),
            durable: true,
            delay: None,
        };
        match send(&String::from_utf8_lossy(address), &message) {
            Ok(()) => Outcome::Ack,
            Err(_) => Outcome::Drop,
        }
    }
}

export!(Handler);
