//! The AMQP side: connections, receiver links, publishing. Knows nothing of
//! wasm or of the settlement rules; it carries out what it is told.

mod connection;
pub mod message;
mod publisher;
mod send;
mod subscription;

use std::time::Duration;

pub use connection::{BrokerConnection, redact};
pub use publisher::{Publisher, PublisherTask};
pub use send::send;
pub use subscription::{Inbound, Subscription};

/// How long to wait for the broker to answer a detach, end or close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Something the broker refused or a link that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// The connection could not be opened.
    #[error("cannot connect to broker `{url}`: {reason}")]
    Connect {
        /// The broker's URL, password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// A link could not be attached.
    #[error("address `{address}`: cannot attach a {role} link: {reason}")]
    Attach {
        /// The link's address.
        address: String,
        /// `receiver` or `sender`.
        role: &'static str,
        /// Why.
        reason: String,
    },
    /// An attached receiver failed.
    #[error("address `{address}`: receiver link failed: {reason}")]
    Link {
        /// The link's address.
        address: String,
        /// Why.
        reason: String,
    },
    /// A publish was not accepted.
    #[error("address `{address}`: publish failed: {reason}")]
    Publish {
        /// The target address.
        address: String,
        /// Why.
        reason: String,
    },
}
