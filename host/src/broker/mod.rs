//! The AMQP side: connections, receiver links, publishing. Knows nothing of
//! wasm or of the settlement rules; it carries out what it is told.

mod connection;
mod endpoint;
mod error;
pub mod management;
pub mod message;
mod pool;
mod publisher;
mod send;
pub mod socket;
mod subscription;
pub mod tls;
mod transaction;

use std::time::Duration;

pub use connection::{BrokerConnection, BrokerOffers, ConnectOptions};
pub use endpoint::{Endpoint, redact};
pub use error::{AttachFailure, BrokerError, ConnectFailure, PublishFailure, Timed};
pub use pool::{BrokerPool, PoolStatus, PooledSession};
pub use publisher::{Offered, OutputsOn, Publisher, PublisherTask, SenderTarget};
pub use send::{Reply, SendOptions, request, send};
pub use subscription::{Inbound, Received, ReceiverOptions, Subscription};
pub use transaction::{Output, Transactions, TransactionsOn};

/// How long to wait for the broker to answer a detach, end or close.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
