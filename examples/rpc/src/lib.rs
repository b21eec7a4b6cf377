//! Answers requests: replies `hello, <body>` to the request's `reply-to`,
//! correlated with it. The reply is published only because the handler
//! acks; a request without a `reply-to` is dropped, since no one could
//! read the answer.
//!
//! Its mount must grant `reply`:
//!
//! ```toml
//! [tenant.mount.grants]
//! reply = true
//! ```
//!
//! Try it with `wharf request --address demo.rpc --body world`.

use wharf_guest::{Delivery, Message, Outcome, SendError, log, outbox};

fn handle(d: Delivery) -> Outcome {
    let name = d.body_str().unwrap_or("stranger");
    let reply = Message::new(format!("hello, {name}"))
        .with_content_type("text/plain")
        .with_durable(false);
    match outbox::reply(reply) {
        Ok(()) => Outcome::Ack,
        Err(SendError::NoReplyTo) => {
            log::warn("a request without reply-to: nobody to answer");
            Outcome::Drop
        }
        Err(e) => {
            log::error(&format!("cannot reply: {e:?}"));
            Outcome::Drop
        }
    }
}

wharf_guest::handler!(handle);
