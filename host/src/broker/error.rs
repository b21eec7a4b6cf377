//! What can go wrong on the broker side, each error keeping its cause.

use std::time::Duration;

use fe2o3_amqp::connection::OpenError;
use fe2o3_amqp::link::{
    DispositionError, ReceiverAttachError, RecvError, SendError, SenderAttachError,
};
use fe2o3_amqp::session::BeginError;

/// Something the broker refused, or a connection or link that failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The connection could not be opened.
    #[error("cannot connect to broker `{endpoint}`: {source}")]
    Connect {
        /// The node, password hidden.
        endpoint: String,
        /// Why.
        #[source]
        source: ConnectFailure,
    },
    /// A session could not be begun.
    #[error("cannot begin a session: {source}")]
    Begin {
        /// Why.
        #[source]
        source: Timed<BeginError>,
    },
    /// A link could not be attached.
    #[error("address `{address}`: cannot attach a {role} link: {source}")]
    Attach {
        /// The link's address.
        address: String,
        /// `receiver` or `sender`.
        role: &'static str,
        /// Why.
        #[source]
        source: AttachFailure,
    },
    /// An attached receiver failed.
    #[error("address `{address}`: receiver link failed: {source}")]
    Receive {
        /// The link's address.
        address: String,
        /// Why.
        #[source]
        source: RecvError,
    },
    /// A disposition could not be sent.
    #[error("address `{address}`: cannot settle a delivery: {source}")]
    Settle {
        /// The link's address.
        address: String,
        /// Why.
        #[source]
        source: DispositionError,
    },
    /// A publish was not accepted.
    #[error("address `{address}`: publish failed: {source}")]
    Publish {
        /// The target address.
        address: String,
        /// Why.
        #[source]
        source: PublishFailure,
    },
    /// A transaction committing outputs with their inputs failed.
    #[error("transaction failed while {stage}: {reason}")]
    Transaction {
        /// What it was doing.
        stage: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The mount's publisher failed, so its links are going down.
    #[error("address `{address}`: sender link failed: {source}")]
    Sender {
        /// The target address.
        address: String,
        /// Why.
        #[source]
        source: SendError,
    },
}

/// An operation that failed, or did not finish in time.
#[derive(Debug, thiserror::Error)]
pub enum Timed<E: std::error::Error + 'static> {
    /// It failed.
    #[error(transparent)]
    Failed(E),
    /// It did not finish in time.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    /// TCP: refused, unreachable, no answer.
    #[error("{0}")]
    Socket(#[source] std::io::Error),
    /// The TLS handshake failed (the broker's certificate, or ours).
    #[error("{0}")]
    Tls(#[source] std::io::Error),
    /// The TLS files could not be loaded.
    #[error("TLS: {0}")]
    TlsFiles(#[source] super::tls::TlsError),
    /// AMQP or SASL: the broker refused us.
    #[error("{0}")]
    Open(#[source] OpenError),
    /// The whole exchange took too long.
    #[error("no AMQP open within {0:?}")]
    TimedOut(Duration),
    /// The URL asks for something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
}

/// Why a link could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachFailure {
    /// The receiver's attach.
    #[error(transparent)]
    Receiver(ReceiverAttachError),
    /// The sender's attach.
    #[error(transparent)]
    Sender(SenderAttachError),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// Why a publish was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum PublishFailure {
    /// The link could not send it.
    #[error(transparent)]
    Send(SendError),
    /// Posting in a transaction failed.
    #[error(transparent)]
    Post(fe2o3_amqp::transaction::PostError),
    /// The broker settled it with something other than `accepted`.
    #[error("the broker answered {0}")]
    Refused(String),
    /// No credit or no answer in time (a broker that blocks producers).
    #[error("no credit or no answer from the broker within {0:?}")]
    TimedOut(Duration),
    /// The mount's links went down before it was answered.
    #[error("the mount's links went down before the broker answered")]
    LinkDown,
}
