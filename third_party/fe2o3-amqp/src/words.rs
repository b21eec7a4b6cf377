//! Errors in words: the condition and description a peer sent, why a
//! session or connection stopped, and SASL outcome codes, written for the
//! person reading the message rather than as `Debug` text.

use std::fmt;

use fe2o3_amqp_types::definitions;
use fe2o3_amqp_types::primitives::Value;
use fe2o3_amqp_types::sasl::SaslCode;

use crate::connection::ConnectionStopReason;
use crate::link::SessionStopReason;

/// An AMQP error as `condition: description` (the condition's symbol,
/// e.g. `amqp:not-found`), or the condition alone.
pub(crate) fn amqp_error(error: &definitions::Error) -> String {
    let condition = match serde_amqp::to_value(&error.condition) {
        Ok(Value::Symbol(symbol)) => symbol.0,
        _ => "an unknown condition".to_owned(),
    };
    match error.description.as_deref().map(str::trim) {
        Some(description) if !description.is_empty() => format!("{condition}: {description}"),
        _ => condition,
    }
}

/// ` (detail)` when there is one.
pub(crate) fn detail(detail: &Option<String>) -> String {
    match detail.as_deref().map(str::trim) {
        Some(text) if !text.is_empty() => format!(" ({text})"),
        _ => String::new(),
    }
}

/// A socket error in words, without the errno's number.
pub(crate) fn io(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::ConnectionReset => "the peer reset the connection".to_owned(),
        ErrorKind::ConnectionAborted => "the connection was aborted".to_owned(),
        ErrorKind::UnexpectedEof => "the peer closed the connection".to_owned(),
        ErrorKind::BrokenPipe => "the connection is broken (the peer is gone)".to_owned(),
        ErrorKind::TimedOut => "the connection timed out".to_owned(),
        _ => {
            let text = error.to_string();
            match text.rfind(" (os error ") {
                Some(at) if text.ends_with(')') => text[..at].to_owned(),
                _ => text,
            }
        }
    }
}

/// A SASL outcome code in words.
pub(crate) fn sasl_code(code: &SaslCode) -> &'static str {
    match code {
        SaslCode::Ok => "ok",
        SaslCode::Auth => "auth: authentication failed",
        SaslCode::Sys => "sys: a system error",
        SaslCode::SysPerm => "sys-perm: a permanent system error",
        SaslCode::SysTemp => "sys-temp: a transient system error",
    }
}

impl fmt::Display for ConnectionStopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionStopReason::Closed => f.write_str("the connection was closed"),
            ConnectionStopReason::ClosedWithError(e) => {
                write!(f, "the connection was closed with {}", amqp_error(e))
            }
            ConnectionStopReason::RemoteClosed => f.write_str("the peer closed the connection"),
            ConnectionStopReason::RemoteClosedWithError(e) => {
                write!(f, "the peer closed the connection: {}", amqp_error(e))
            }
        }
    }
}

impl fmt::Display for SessionStopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionStopReason::Ended => f.write_str("the session ended"),
            SessionStopReason::EndedWithError(e) => {
                write!(f, "the session ended with {}", amqp_error(e))
            }
            SessionStopReason::RemoteEnded => f.write_str("the peer ended the session"),
            SessionStopReason::RemoteEndedWithError(e) => {
                write!(f, "the peer ended the session: {}", amqp_error(e))
            }
            SessionStopReason::ConnectionStopped(reason) => reason.fmt(f),
        }
    }
}
