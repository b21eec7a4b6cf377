//! The AMQP side: connections, receiver links, publishing, and what each
//! broker can do ([`capabilities`]: which settlement paths a mount takes
//! there). Knows nothing of wasm or of the settlement rules themselves; it
//! carries out what it is told.

pub mod capabilities;
mod connection;
mod error;
pub mod management;
mod output_message;
mod outputs;
mod pool;
mod publisher;
mod send;
pub mod socket;
mod subscription;
pub mod tls;
mod transaction;

use std::time::Duration;

pub use capabilities::{BrokerKind, LinkOffers, outputs_in_transactions, policy_for};
pub use connection::{BrokerConnection, BrokerOffers, ConnectOptions};
pub(crate) use error::RABBITMQ_HAS_NO_TOPICS;
pub use error::{AttachFailure, BrokerError, ConnectFailure, PublishFailure, Timed};
pub use output_message::output_message;
pub use outputs::{OutputsOn, SenderTarget};
pub use pool::{BrokerPool, PoolStatus, PooledSession};
pub use publisher::{Offered, Publisher, PublisherTask};
pub use send::{Reply, SendOptions, request, send};
pub use subscription::{
    Inbound, ProbeTarget, Received, ReceiverOptions, Subscription, end_subscription, probe,
};
pub use transaction::{Output, Transactions, TransactionsOn};
pub use wharf_core::endpoint::{Endpoint, redact};
pub use wharf_core::message;

/// How long to wait for the broker to answer a detach, end or close.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
