//! What can go wrong on the broker side, each error keeping its cause.

use std::time::Duration;

use fe2o3_amqp::connection::OpenError;
use fe2o3_amqp::link::{
    DispositionError, ReceiverAttachError, RecvError, SendError, SenderAttachError,
};
use fe2o3_amqp::session::BeginError;
use fe2o3_amqp::types::messaging::Outcome;

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
    /// The broker cannot give the link what the mount asks for.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Why a publish was not accepted, told apart by what the broker may hold
/// of it: that decides what becomes of the delivery it was owed for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishFailure {
    /// The broker said no (its outcome, a refused link, a message too
    /// large for the link).
    #[error("the broker {0}")]
    Refused(String),
    /// It never went out: the broker holds nothing of it.
    #[error("not sent: {0}")]
    NotSent(String),
    /// It went out and no answer came: the broker may hold it.
    #[error("sent, but {0}")]
    Unknown(String),
}

impl PublishFailure {
    /// The broker's outcome, when it was not `accepted`.
    pub fn outcome(outcome: &Outcome) -> PublishFailure {
        PublishFailure::Refused(wharf_core::words::outcome(outcome))
    }

    /// No credit (a broker blocking producers) before `deadline` passed.
    pub fn no_credit(timeout: Duration) -> PublishFailure {
        PublishFailure::NotSent(format!(
            "the broker gave no credit within {} (`publish_timeout`)",
            humantime::format_duration(timeout)
        ))
    }

    /// Sent, and no outcome before the deadline.
    pub fn no_answer(timeout: Duration) -> PublishFailure {
        PublishFailure::Unknown(format!(
            "no answer came within {} (`publish_timeout`)",
            humantime::format_duration(timeout)
        ))
    }

    /// The links went down before the message went out.
    pub fn links_down() -> PublishFailure {
        PublishFailure::NotSent("the mount's links went down".to_owned())
    }
}
