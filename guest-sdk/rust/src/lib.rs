//! Write [wharf](https://github.com/wharf-rs/wharf) message handlers in Rust.
//!
//! A handler is one plain function from a [`Delivery`] to an [`Outcome`],
//! registered with [`handler!`]. The host owns the broker: it settles the
//! message by the outcome you return, counts attempts, dead-letters and
//! publishes delayed copies.
//!
//! ```no_run
//! use std::time::Duration;
//! use wharf_guest::{log, Delivery, Outcome};
//!
//! fn handle(d: Delivery) -> Outcome {
//!     match d.body_str() {
//!         Some("later") => Outcome::retry_after(Duration::from_secs(2)),
//!         Some("bad") => Outcome::Drop,
//!         _ if d.attempt > 3 => {
//!             log::warn(&format!("giving up on {:?}", d.message_id));
//!             Outcome::Drop
//!         }
//!         _ => Outcome::Ack,
//!     }
//! }
//!
//! wharf_guest::handler!(handle);
//! ```
//!
//! Build it as a `cdylib` for `wasm32-wasip2`:
//! `cargo build --release --target wasm32-wasip2` writes the component to
//! `target/wasm32-wasip2/release/<crate>.wasm`.

use std::time::Duration;

pub mod http;

#[doc(hidden)]
pub mod bindings {
    #![allow(missing_docs, unsafe_code)]
    wit_bindgen::generate!({
        world: "handler",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_handler",
        default_bindings_module: "wharf_guest::bindings",
        additional_derives: [PartialEq],
    });
}

pub use bindings::wharf::handler::outbox::{Message, SendError};
pub use bindings::wharf::handler::types::{Delivery, Outcome, Property, Value};

/// The name of the application property that counts the host's retry copies.
pub const RETRY_COUNT_PROPERTY: &str = "x-ruststream-retry-count";

impl Outcome {
    /// Retry, but not before `delay` has passed. Delays are rounded down to
    /// whole milliseconds.
    pub fn retry_after(delay: Duration) -> Outcome {
        Outcome::RetryAfter(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }
}

impl Delivery {
    /// The body as UTF-8 text, if it is valid UTF-8.
    pub fn body_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    /// The value of the first application property called `key`.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.properties
            .iter()
            .find(|p| p.key == key)
            .map(|p| &p.value)
    }

    /// The value of the first message annotation called `key`.
    pub fn annotation(&self, key: &str) -> Option<&Value> {
        self.annotations
            .iter()
            .find(|p| p.key == key)
            .map(|p| &p.value)
    }

    /// The application property `key` if it is a string.
    pub fn property_str(&self, key: &str) -> Option<&str> {
        match self.property(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

impl Message {
    /// A durable message with `body` and nothing else set.
    pub fn new(body: impl Into<Vec<u8>>) -> Message {
        Message {
            body: body.into(),
            content_type: None,
            subject: None,
            message_id: None,
            correlation_id: None,
            properties: Vec::new(),
            durable: true,
            delay: None,
            group_id: None,
            group_sequence: None,
            reply_to_group_id: None,
            priority: None,
            creation_time: None,
            absolute_expiry_time: None,
        }
    }

    /// Sets `content-type`.
    pub fn with_content_type(mut self, content_type: &str) -> Message {
        self.content_type = Some(content_type.to_owned());
        self
    }

    /// Sets `subject`.
    pub fn with_subject(mut self, subject: &str) -> Message {
        self.subject = Some(subject.to_owned());
        self
    }

    /// Sets `message-id`; by default the host derives one from the
    /// delivery's, so a redelivery publishes the same ids.
    pub fn with_message_id(mut self, id: &str) -> Message {
        self.message_id = Some(id.to_owned());
        self
    }

    /// Sets `correlation-id`.
    pub fn with_correlation_id(mut self, id: &str) -> Message {
        self.correlation_id = Some(id.to_owned());
        self
    }

    /// Adds an application property.
    pub fn with_property(mut self, key: &str, value: Value) -> Message {
        self.properties.push(Property {
            key: key.to_owned(),
            value,
        });
        self
    }

    /// Whether the broker keeps it on disk (the default).
    pub fn with_durable(mut self, durable: bool) -> Message {
        self.durable = durable;
        self
    }

    /// Delivers it no sooner than `delay` after it is published, on brokers
    /// that schedule messages (Artemis).
    pub fn with_delay(mut self, delay: Duration) -> Message {
        self.delay = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Sets `group-id`: the broker's message group on Artemis and ActiveMQ
    /// Classic, and the key of a mount with `order_by = "group-id"`.
    pub fn with_group_id(mut self, group: &str) -> Message {
        self.group_id = Some(group.to_owned());
        self
    }

    /// Sets `group-sequence`.
    pub fn with_group_sequence(mut self, sequence: u32) -> Message {
        self.group_sequence = Some(sequence);
        self
    }

    /// Sets `reply-to-group-id`.
    pub fn with_reply_to_group_id(mut self, group: &str) -> Message {
        self.reply_to_group_id = Some(group.to_owned());
        self
    }

    /// Sets `header.priority` (brokers order by 0 to 9; 4 when unset).
    pub fn with_priority(mut self, priority: u8) -> Message {
        self.priority = Some(priority);
        self
    }

    /// Sets `creation-time`, milliseconds since the Unix epoch.
    pub fn with_creation_time(mut self, millis: i64) -> Message {
        self.creation_time = Some(millis);
        self
    }

    /// Sets `absolute-expiry-time`, milliseconds since the Unix epoch:
    /// brokers that honour it discard the message after.
    pub fn with_absolute_expiry_time(mut self, millis: i64) -> Message {
        self.absolute_expiry_time = Some(millis);
        self
    }
}

/// Publishing from a handler. What a handler sends is published only if it
/// returns [`Outcome::Ack`], before its delivery is accepted; any other
/// outcome (or a trap) discards it.
///
/// ```no_run
/// use wharf_guest::{outbox, Delivery, Message, Outcome};
///
/// fn handle(d: Delivery) -> Outcome {
///     let receipt = Message::new(d.body.clone()).with_subject("receipt");
///     match outbox::send("audit", receipt) {
///         Ok(()) => Outcome::Ack,
///         Err(_) => Outcome::Drop,
///     }
/// }
/// # wharf_guest::handler!(handle);
/// ```
pub mod outbox {
    use crate::bindings::wharf::handler::outbox;
    use crate::{Message, SendError};

    /// Publishes `message` to `address` if the delivery is acknowledged. The
    /// mount must grant the address (`grants.send`).
    pub fn send(address: &str, message: Message) -> Result<(), SendError> {
        outbox::send(address, &message)
    }

    /// Publishes `message` to the delivery's `reply-to` if the delivery is
    /// acknowledged, with its `correlation-id` (unless set) taken from the
    /// delivery's correlation-id, else its message-id. The mount must grant
    /// `reply`.
    pub fn reply(message: Message) -> Result<(), SendError> {
        outbox::reply(&message)
    }
}

/// Logging into the host's log; every line is tagged with tenant and mount.
pub mod log {
    use crate::bindings::wharf::handler::log::{Level, log};

    /// Log at trace level.
    pub fn trace(message: &str) {
        log(Level::Trace, message);
    }
    /// Log at debug level.
    pub fn debug(message: &str) {
        log(Level::Debug, message);
    }
    /// Log at info level.
    pub fn info(message: &str) {
        log(Level::Info, message);
    }
    /// Log at warn level.
    pub fn warn(message: &str) {
        log(Level::Warn, message);
    }
    /// Log at error level.
    pub fn error(message: &str) {
        log(Level::Error, message);
    }
}

/// Registers `fn(Delivery) -> Outcome` as the component's handler.
///
/// Use it once per crate, at the top level.
#[macro_export]
macro_rules! handler {
    ($handle:path) => {
        struct __WharfHandler;

        impl $crate::bindings::Guest for __WharfHandler {
            fn handle(d: $crate::Delivery) -> $crate::Outcome {
                $handle(d)
            }
        }

        $crate::bindings::export_handler!(__WharfHandler);
    };
}
