//! Decides by the body: `retry` retries at once, `later` retries after a
//! delay (the application property `delay-ms`, default 1000), `bad` is
//! dropped, anything else is acknowledged.

use std::time::Duration;

use wharf_guest::{Delivery, Outcome, Value, log};

fn handle(d: Delivery) -> Outcome {
    let outcome = match d.body_str() {
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

fn delay_ms(d: &Delivery) -> u64 {
    match d.property("delay-ms") {
        Some(Value::Uint(ms)) => *ms,
        Some(Value::Int(ms)) => u64::try_from(*ms).unwrap_or(0),
        Some(Value::String(ms)) => ms.parse().unwrap_or(1000),
        _ => 1000,
    }
}

wharf_guest::handler!(handle);
