//! The AMQP side: connections, receiver links and publishing. Knows
//! nothing of wasm or of the settlement rules themselves (which paths a
//! mount takes on each broker is `wharf_core::settlement::policy_for`); it
//! carries out what it is told.

mod connection;
mod error;
pub mod management;
mod outputs;
mod pool;
mod publisher;
mod send;
pub mod socket;
mod subscription;
pub mod tls;
mod transaction;

use std::time::Duration;

pub use connection::{BrokerConnection, BrokerOffers, ConnectOptions};
pub(crate) use error::RABBITMQ_HAS_NO_TOPICS;
pub use error::{AttachFailure, BrokerError, ConnectFailure, PublishFailure, Timed};
pub use outputs::{OutputsOn, SenderTarget};
pub use pool::{BrokerPool, PoolStatus, PooledSession};
pub use publisher::{Offered, Publisher, PublisherTask};
pub use send::{Reply, SendOptions, request, send};
pub use subscription::{
    Inbound, ProbeTarget, Received, ReceiverOptions, Subscription, Unread, end_subscription, probe,
};
pub use transaction::{Output, Transactions, TransactionsOn};

/// How long to wait for the broker to answer a detach, end or close.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
