//! RabbitMQ 4's management node: HTTP requests carried over AMQP on a pair
//! of links named alike (`/management`), answered with an HTTP status in
//! the subject and an `amqp-value` map body. wharf asks it one thing: what
//! kind of queue a mount consumes from, and its arguments.
//!
//! The broker ends the whole session on a request it does not like, so the
//! pair lives on a session of its own, opened per question.

use std::time::Duration;

use fe2o3_amqp::link::delivery::Sendable;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::definitions::{Fields, SenderSettleMode};
use fe2o3_amqp::types::messaging::{Body, Message, Properties, Source, Target};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::{Receiver, Sender};

use super::PooledSession;
use wharf_core::brokers::QueueKind;
use wharf_core::endpoint::percent_decode;

/// The node's address.
const NODE: &str = "/management";

/// What is known of the queue behind a mount's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: QueueKind,
    /// The exchange it dead-letters `rejected` messages to, if any.
    pub dead_letter_exchange: Option<String>,
}

/// The queue a receiver on `address` consumes from, for the address forms
/// that name one: `/queues/NAME` (v2), `/queue/NAME` and `/amq/queue/NAME`
/// (v1), and a plain name (v1: the queue of that name). Exchange and topic
/// addresses give each receiver a queue of its own, so they name none.
pub fn queue_of(address: &str) -> Option<String> {
    let name = if let Some(name) = address.strip_prefix("/queues/") {
        percent_decode(name)?
    } else if let Some(name) = address
        .strip_prefix("/queue/")
        .or_else(|| address.strip_prefix("/amq/queue/"))
    {
        name.to_owned()
    } else if address.starts_with('/') {
        return None;
    } else {
        address.to_owned()
    };
    (!name.is_empty()).then_some(name)
}

/// Asks the management node what `queue` is; `Ok(None)` when there is no
/// such queue. Every step waits at most `timeout`.
pub async fn queue_info(
    mut session: PooledSession,
    queue: &str,
    timeout: Duration,
) -> Result<Option<QueueInfo>, String> {
    let asked = tokio::time::timeout(timeout, ask(&mut session, queue)).await;
    asked.map_err(|_| format!("the management node did not answer within {timeout:?}"))?
}

async fn ask(session: &mut PooledSession, queue: &str) -> Result<Option<QueueInfo>, String> {
    let name = "wharf-management";
    let mut paired = Fields::default();
    paired.insert(Symbol::from("paired"), Value::Bool(true));
    let mut sender = Sender::builder()
        .name(name)
        .target(Target::builder().address(NODE).build())
        .sender_settle_mode(SenderSettleMode::Settled)
        .properties(paired.clone())
        .attach(&mut session.session)
        .await
        .map_err(|e| format!("cannot attach to {NODE}: {e}"))?;
    let mut receiver = Receiver::builder()
        .name(name)
        .source(Source::builder().address(NODE).build())
        .sender_settle_mode(SenderSettleMode::Settled)
        .properties(paired)
        .credit_mode(CreditMode::Auto(1))
        .attach(&mut session.session)
        .await
        .map_err(|e| format!("cannot attach to {NODE}: {e}"))?;
    let request = Message::builder()
        .properties(
            Properties::builder()
                .message_id(format!("wharf-{queue}"))
                .to(format!("/queues/{}", percent_encode(queue)))
                .subject("GET")
                .reply_to("$me")
                .build(),
        )
        .value(Value::Null)
        .build();
    let sendable = Sendable::builder().message(request).settled(true).build();
    sender
        .send(sendable)
        .await
        .map_err(|e| format!("cannot ask {NODE}: {e}"))?;
    let reply = receiver
        .recv::<Body<Value>>()
        .await
        .map_err(|e| format!("no answer from {NODE}: {e}"))?;
    let reply = reply.into_message();
    let status = reply
        .properties
        .as_ref()
        .and_then(|p| p.subject.clone())
        .unwrap_or_default();
    let _ = sender.close().await;
    let _ = receiver.close().await;
    match (status.as_str(), reply.body) {
        ("200", Body::Value(map)) => Ok(Some(read_queue(queue, &map.0))),
        ("404", _) => Ok(None),
        (status, body) => Err(format!("{NODE} answered {status}: {body:?}")),
    }
}

fn read_queue(queue: &str, reply: &Value) -> QueueInfo {
    let field = |map: &Value, key: &str| match map {
        Value::Map(map) => map.get(&Value::String(key.to_owned())).cloned(),
        _ => None,
    };
    let text = |value: Option<Value>| match value {
        Some(Value::String(text)) => Some(text),
        _ => None,
    };
    let arguments = field(reply, "arguments").unwrap_or(Value::Null);
    let kind = match text(field(reply, "type")).as_deref() {
        Some("classic") => QueueKind::Classic,
        Some("quorum") => QueueKind::Quorum {
            delivery_limit: field(&arguments, "x-delivery-limit").and_then(as_u64),
        },
        Some("stream") => QueueKind::Stream,
        other => QueueKind::Other(other.unwrap_or("unknown").to_owned()),
    };
    QueueInfo {
        name: queue.to_owned(),
        kind,
        dead_letter_exchange: text(field(&arguments, "x-dead-letter-exchange")),
    }
}

/// An integer of whichever type the declaring client used.
fn as_u64(value: Value) -> Option<u64> {
    match value {
        Value::Ubyte(n) => Some(n.into()),
        Value::Ushort(n) => Some(n.into()),
        Value::Uint(n) => Some(n.into()),
        Value::Ulong(n) => Some(n),
        Value::Byte(n) => u64::try_from(n).ok(),
        Value::Short(n) => u64::try_from(n).ok(),
        Value::Int(n) => u64::try_from(n).ok(),
        Value::Long(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_their_queue() {
        assert_eq!(queue_of("/queues/a%2Fb%20c").as_deref(), Some("a/b c"));
        assert_eq!(queue_of("/queue/orders").as_deref(), Some("orders"));
        assert_eq!(queue_of("/amq/queue/orders").as_deref(), Some("orders"));
        assert_eq!(queue_of("orders").as_deref(), Some("orders"));
        assert_eq!(queue_of("/exchanges/x/k"), None);
        assert_eq!(queue_of("/topic/k"), None);
        assert_eq!(queue_of("/queues/"), None);
    }

    #[test]
    fn names_are_encoded_for_the_request_path() {
        assert_eq!(percent_encode("a/b c%"), "a%2Fb%20c%25");
        assert_eq!(
            percent_decode(&percent_encode("a/b c%")).as_deref(),
            Some("a/b c%")
        );
    }
}
