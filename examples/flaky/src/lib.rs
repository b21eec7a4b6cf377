//! Decides by the body: `retry` retries at once, `later` retries after a
//! delay (the application property `delay-ms`, default 1000), `bad` is
//! dropped, anything else is acknowledged. `mirror:ADDRESS` also sends to
//! ADDRESS a message with the delivery's body, fields and properties, and
//! its `to`, `user-id`, `first-acquirer` and annotations (`annotation:KEY`)
//! as properties: the same in every language.

use std::time::Duration;

use wharf_guest::{Delivery, Message, Outcome, Property, Value, log, outbox};

fn handle(d: Delivery) -> Outcome {
    let outcome = match d.body_str() {
        Some(body) if body.starts_with("mirror:") => mirror(&d, &body["mirror:".len()..]),
        Some("retry") => Outcome::Retry,
        Some("later") => Outcome::retry_after(Duration::from_millis(delay_ms(&d))),
        Some("bad") => Outcome::Drop,
        _ => Outcome::Ack,
    };
    log::info(&format!(
        "attempt {} of {:?}: {outcome:?}",
        d.attempt,
        d.body_str().unwrap_or("<binary>")
    ));
    outcome
}

fn mirror(d: &Delivery, address: &str) -> Outcome {
    let mut message = Message::new(d.body.clone()).with_durable(d.durable);
    message.group_id.clone_from(&d.group_id);
    message.group_sequence = d.group_sequence;
    message.reply_to_group_id.clone_from(&d.reply_to_group_id);
    message.creation_time = d.creation_time;
    message.absolute_expiry_time = d.absolute_expiry_time;
    message.priority = Some(d.priority);
    message.properties.clone_from(&d.properties);
    if let Some(to) = &d.to {
        message = message.with_property("to", Value::String(to.clone()));
    }
    if let Some(user) = &d.user_id {
        message = message.with_property("user-id", Value::Bytes(user.clone()));
    }
    message = message.with_property("first-acquirer", Value::Boolean(d.first_acquirer));
    message.properties.extend(d.annotations.iter().map(|a| Property {
        key: format!("annotation:{}", a.key),
        value: a.value.clone(),
    }));
    match outbox::send(address, message) {
        Ok(()) => Outcome::Ack,
        Err(e) => {
            log::warn(&format!("mirror to {address:?}: {e:?}"));
            Outcome::Drop
        }
    }
}

fn delay_ms(d: &Delivery) -> u64 {
    match d.property("delay-ms") {
        Some(Value::Uint(ms)) => *ms,
        Some(Value::Int(ms)) => u64::try_from(*ms).unwrap_or(0),
        Some(Value::String(ms)) => ms.parse().unwrap_or(1000),
        _ => 1000,
    }
}

wharf_guest::handler!(handle);
