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

    /// The application property `key` if it is a string.
    pub fn property_str(&self, key: &str) -> Option<&str> {
        match self.property(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
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
