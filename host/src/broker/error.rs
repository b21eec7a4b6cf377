//! What can go wrong on the broker side, each error keeping its cause.

use std::time::Duration;

use fe2o3_amqp::connection::OpenError;
use fe2o3_amqp::link::{
    DispositionError, ReceiverAttachError, RecvError, SendError, SenderAttachError,
};
use fe2o3_amqp::session::BeginError;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
use fe2o3_amqp::types::messaging::Outcome;
use wharf_core::text::shown;

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
    #[error(
        "address `{}`: cannot attach a {role} link: {source}{}",
        shown(address),
        attach_hint(source)
    )]
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
    #[error("address `{}`: receiver link failed: {source}", shown(address))]
    Receive {
        /// The link's address.
        address: String,
        /// Why.
        #[source]
        source: RecvError,
    },
    /// A disposition could not be sent.
    #[error("address `{}`: cannot settle a delivery: {source}", shown(address))]
    Settle {
        /// The link's address.
        address: String,
        /// Why.
        #[source]
        source: DispositionError,
    },
    /// A publish was not accepted.
    #[error("address `{}`: publish failed: {source}", shown(address))]
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
    #[error("address `{}`: sender link failed: {source}", shown(address))]
    Sender {
        /// The target address.
        address: String,
        /// Why.
        #[source]
        source: SendError,
    },
}

impl BrokerError {
    /// Whether trying again cannot help until someone changes the config
    /// or the broker: a refused login, a SASL mechanism the broker does not
    /// offer, a certificate refused either way, an address the broker
    /// refuses or does not have. wharf keeps trying (credentials and
    /// certificates get rotated) but says so once, not at every attempt.
    pub fn is_permanent(&self) -> bool {
        use fe2o3_amqp::types::sasl::SaslCode;
        match self {
            BrokerError::Connect { source, .. } => match source {
                ConnectFailure::Open(OpenError::SaslError { code, .. }) => {
                    matches!(code, SaslCode::Auth | SaslCode::SysPerm)
                }
                ConnectFailure::Open(OpenError::NotImplemented(_))
                | ConnectFailure::TlsFiles(_)
                | ConnectFailure::Unsupported(_) => true,
                // What `tls::handshake` says of a certificate.
                ConnectFailure::Tls(e) => matches!(
                    e.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::PermissionDenied
                ),
                ConnectFailure::Socket(_)
                | ConnectFailure::Open(_)
                | ConnectFailure::TimedOut(_) => false,
            },
            BrokerError::Attach { source, .. } => {
                matches!(source, AttachFailure::Unsupported(_)) || source.hint().is_some()
            }
            _ => false,
        }
    }
}

impl AttachFailure {
    /// The condition the broker refused the link with, if it gave one.
    fn condition(&self) -> Option<&ErrorCondition> {
        use fe2o3_amqp::link::SessionStopReason;
        let error = match self {
            AttachFailure::Receiver(ReceiverAttachError::RemoteClosedWithError(e))
            | AttachFailure::Sender(SenderAttachError::RemoteClosedWithError(e))
            | AttachFailure::Receiver(ReceiverAttachError::SessionStopped(
                SessionStopReason::RemoteEndedWithError(e),
            ))
            | AttachFailure::Sender(SenderAttachError::SessionStopped(
                SessionStopReason::RemoteEndedWithError(e),
            )) => e,
            _ => return None,
        };
        Some(&error.condition)
    }

    /// What to do about a refusal that stays until the broker's setup or
    /// the address changes.
    fn hint(&self) -> Option<&'static str> {
        match self.condition()? {
            ErrorCondition::AmqpError(AmqpError::NotFound) => {
                Some("create it on the broker, or correct the address")
            }
            ErrorCondition::AmqpError(AmqpError::UnauthorizedAccess) => Some(
                "the broker's user may not use it: grant the permission on the broker, or log in as another `user`",
            ),
            ErrorCondition::AmqpError(AmqpError::NotAllowed) => {
                Some("the broker does not allow this link there: see its address settings")
            }
            _ => None,
        }
    }
}

/// The hint for an attach failure, as `; hint`.
fn attach_hint(failure: &AttachFailure) -> String {
    failure.hint().map(|h| format!("; {h}")).unwrap_or_default()
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
    #[error("{}", socket_words(.0))]
    Socket(std::io::Error),
    /// The TLS handshake failed (the broker's certificate, or ours).
    #[error("{0}")]
    Tls(#[source] std::io::Error),
    /// The TLS files could not be loaded.
    #[error("TLS: {0}")]
    TlsFiles(#[source] wharf_core::tls::TlsError),
    /// AMQP or SASL: the broker refused us.
    #[error("{}", open_words(.0))]
    Open(OpenError),
    /// The whole exchange took too long.
    #[error("no AMQP open within {0:?}")]
    TimedOut(Duration),
    /// The URL asks for something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
}

/// A socket error as a person reads it: what happened and what to check,
/// without the errno's number.
fn socket_words(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::ConnectionRefused => {
            "connection refused: nothing listens there (is the broker running, and is the port right?)"
                .to_owned()
        }
        ErrorKind::ConnectionReset => "the broker reset the connection".to_owned(),
        ErrorKind::ConnectionAborted => "the connection was aborted".to_owned(),
        ErrorKind::TimedOut => "no answer: the connection timed out".to_owned(),
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
            "the broker's host cannot be reached from here (no route)".to_owned()
        }
        ErrorKind::UnexpectedEof => "the broker closed the connection".to_owned(),
        _ => wharf_core::words::io(error),
    }
}

/// Why the AMQP or SASL exchange failed, in words, with what to check.
fn open_words(error: &OpenError) -> String {
    use fe2o3_amqp::types::sasl::SaslCode;
    match error {
        OpenError::Io(e) => socket_words(e),
        OpenError::SaslError { code, .. } => match code {
            SaslCode::Auth => "the broker refused the login (SASL `auth`): check `user` and `password_file` (or the URL's user and password) and the mechanism (`sasl`)".to_owned(),
            SaslCode::SysPerm => "the broker's login failed and will not recover by itself (SASL `sys-perm`): see the broker's log".to_owned(),
            SaslCode::Sys | SaslCode::SysTemp => "the broker's login failed for a reason of its own (SASL `sys`); it may pass on a retry".to_owned(),
            SaslCode::Ok => "the SASL exchange ended without a connection".to_owned(),
        },
        OpenError::NotImplemented(Some(what)) if what.starts_with("the peer does not offer") => {
            format!(
                "{}: set `sasl` to one of those (SASL EXTERNAL, the default with a client certificate and no user, needs a certificate login on the broker's acceptor)",
                what.replacen("the peer", "the broker", 1)
            )
        }
        OpenError::NotImplemented(what) => format!(
            "the broker could not complete the SASL exchange{}: does it offer the mechanism set in `sasl` (SASL EXTERNAL needs a certificate login on the broker's acceptor)?",
            what.as_deref().map(|w| format!(" ({w})")).unwrap_or_default()
        ),
        other => other.to_string(),
    }
}

/// Why a topic mount cannot attach to RabbitMQ, and what to do instead.
pub(crate) const RABBITMQ_HAS_NO_TOPICS: &str = "RabbitMQ has no topic source over AMQP 1.0: bind a queue to the exchange and mount the queue (`node = \"queue\"`); that queue is the durable, shared subscription";

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

#[cfg(test)]
mod tests {
    use fe2o3_amqp::types::sasl::SaslCode;

    use super::*;

    #[test]
    fn socket_errors_read_as_words_without_errno_numbers() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let text = ConnectFailure::Socket(refused).to_string();
        assert!(
            text.starts_with("connection refused: nothing listens there"),
            "{text}"
        );
        let reset = OpenError::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(
            ConnectFailure::Open(reset).to_string(),
            "the broker reset the connection"
        );
    }

    #[test]
    fn a_refused_login_names_what_to_check_and_no_debug_text() {
        let refused = OpenError::SaslError {
            code: SaslCode::Auth,
            additional_data: None,
        };
        let text = ConnectFailure::Open(refused).to_string();
        assert!(
            text.contains("refused the login") && text.contains("password_file"),
            "{text}"
        );
        assert!(!text.contains("None") && !text.contains("Auth,"), "{text}");
    }
}
