//! `wharf send` and `wharf request`: publish a few messages by hand, or
//! one request and wait for its reply.

use std::time::Duration;

use fe2o3_amqp::types::messaging::{
    AmqpValue, ApplicationProperties, Body, Header, Message, MessageAnnotations, MessageId,
    Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, Symbol, Timestamp, Value};
use fe2o3_amqp::{Receiver, Sender};

use super::error::{AttachFailure, PublishFailure};
use super::{BrokerConnection, BrokerError, ConnectOptions};
use wharf_core::endpoint::Endpoint;
use wharf_core::message::Fields;

/// Where and how `wharf send` publishes.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// The broker.
    pub endpoint: Endpoint,
    /// How to connect and log in to it.
    pub connect: ConnectOptions,
    /// The address to publish to.
    pub address: String,
    /// String application properties every message carries.
    pub properties: Vec<(String, String)>,
    /// The header and properties fields every message carries; its
    /// `group-sequence` is the first message's, counting up.
    pub fields: Fields,
    /// String message annotations every message carries.
    pub annotations: Vec<(String, String)>,
    /// How long each publish may take (`wharf request`: the whole exchange).
    pub timeout: Duration,
    /// `wharf request`: where the reply goes, instead of a queue of its own.
    pub reply_to: Option<String>,
}

/// Publishes one durable message per body and waits for the broker to
/// accept each.
pub async fn send(options: &SendOptions, bodies: &[String]) -> Result<(), BrokerError> {
    let mut connection = BrokerConnection::open(&options.endpoint, &options.connect).await?;
    let address = options.address.as_str();
    let publish_error = |source| BrokerError::Publish {
        address: address.to_owned(),
        source,
    };
    let mut session = connection.begin_session().await?;
    let mut sender = Sender::attach(&mut session, "wharf-send", address)
        .await
        .map_err(|e| BrokerError::Attach {
            address: address.to_owned(),
            role: "sender",
            source: AttachFailure::Sender(e),
        })?;
    for (n, body) in bodies.iter().enumerate() {
        let id = format!("wharf-send-{}-{n}", std::process::id());
        let sequence = options
            .fields
            .group_sequence
            .map(|first| first.wrapping_add(n as u32));
        let properties = Properties {
            group_sequence: sequence,
            ..Properties::builder().message_id(id).build()
        };
        let message = message(options, body, properties);
        let sent = tokio::time::timeout(options.timeout, sender.send(message)).await;
        outcome_of(sent, options.timeout).map_err(publish_error)?;
        println!("sent {body:?} to {address}");
    }
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, sender.close()).await;
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
    connection.close(super::CLOSE_TIMEOUT).await;
    Ok(())
}

/// What a send waited for `timeout` came to.
fn outcome_of(
    sent: Result<Result<Outcome, fe2o3_amqp::link::SendError>, tokio::time::error::Elapsed>,
    timeout: Duration,
) -> Result<(), PublishFailure> {
    match sent {
        Ok(Ok(Outcome::Accepted(_))) => Ok(()),
        Ok(Ok(other)) => Err(PublishFailure::outcome(&other)),
        Ok(Err(e)) => Err(PublishFailure::NotSent(e.to_string())),
        Err(_) => Err(PublishFailure::no_answer(timeout)),
    }
}

/// A message with `body` (an `amqp-value` string), `properties` (its
/// group-sequence, ids and reply-to) and the options' fields, application
/// properties and annotations.
fn message(
    options: &SendOptions,
    body: &str,
    properties: Properties,
) -> Message<AmqpValue<String>> {
    let mut app = ApplicationProperties::builder();
    for (key, value) in &options.properties {
        app = app.insert(key.as_str(), value.as_str());
    }
    let fields = &options.fields;
    let time = |ms: Option<i64>| ms.map(Timestamp::from_milliseconds);
    let properties = Properties {
        to: fields.to.clone(),
        user_id: fields.user_id.clone().map(Binary::from),
        group_id: fields.group_id.clone(),
        group_sequence: properties.group_sequence.or(fields.group_sequence),
        reply_to_group_id: fields.reply_to_group_id.clone(),
        creation_time: time(fields.creation_time),
        absolute_expiry_time: time(fields.absolute_expiry_time),
        ..properties
    };
    let mut annotations = MessageAnnotations::builder();
    for (key, value) in &options.annotations {
        annotations = annotations.insert(Symbol::from(key.as_str()), Value::from(value.as_str()));
    }
    let builder = Message::builder()
        .header(Header {
            durable: fields.durable,
            priority: fields.priority.unwrap_or(Fields::DEFAULT_PRIORITY).into(),
            ..Header::default()
        })
        .properties(properties)
        .application_properties(app.build());
    let builder = if options.annotations.is_empty() {
        builder
    } else {
        builder.message_annotations(annotations.build())
    };
    builder.value(body.to_owned()).build()
}

/// A reply `wharf request` received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Its body: the bytes of its `data` sections, or an `amqp-value`
    /// string's.
    pub body: Vec<u8>,
    /// The address it was read from.
    pub reply_to: String,
}

/// Sends `body` to the options' address with a `reply-to` of its own (a
/// queue the broker creates on first use, named after this process) and a
/// fresh message-id, and waits up to the options' time-out for the answer
/// correlated with it; other messages on that queue are left there.
pub async fn request(options: &SendOptions, body: &str) -> Result<Reply, BrokerError> {
    let mut connection = BrokerConnection::open(&options.endpoint, &options.connect).await?;
    let mut session = connection.begin_session().await?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let id = format!("wharf-request-{}-{nanos}", std::process::id());
    let reply_to = match &options.reply_to {
        Some(address) => address.clone(),
        None => id.clone(),
    };
    let attach_error = |address: &str, role, source| BrokerError::Attach {
        address: address.to_owned(),
        role,
        source,
    };
    // Listening before the request goes out, so the reply cannot be missed.
    let mut receiver = Receiver::attach(&mut session, "wharf-request-replies", reply_to.as_str())
        .await
        .map_err(|e| attach_error(&reply_to, "receiver", AttachFailure::Receiver(e)))?;
    let address = options.address.as_str();
    let mut sender = Sender::attach(&mut session, "wharf-request", address)
        .await
        .map_err(|e| attach_error(address, "sender", AttachFailure::Sender(e)))?;
    let properties = Properties {
        reply_to: Some(reply_to.clone()),
        ..Properties::builder().message_id(id.clone()).build()
    };
    let publish_error = |source| BrokerError::Publish {
        address: address.to_owned(),
        source,
    };
    let deadline = tokio::time::Instant::now() + options.timeout;
    let sent = tokio::time::timeout_at(deadline, sender.send(message(options, body, properties)));
    outcome_of(sent.await, options.timeout).map_err(publish_error)?;
    let no_reply = || BrokerError::Publish {
        address: reply_to.clone(),
        source: PublishFailure::Unknown(format!(
            "no reply correlated with `{id}` came within {}",
            humantime::format_duration(options.timeout)
        )),
    };
    let reply = loop {
        let delivery = match tokio::time::timeout_at(deadline, receiver.recv::<Body<Value>>()).await
        {
            Ok(Ok(delivery)) => delivery,
            Ok(Err(_)) | Err(_) => return Err(no_reply()),
        };
        let correlated = delivery
            .message()
            .properties
            .as_ref()
            .and_then(|p| p.correlation_id.as_ref())
            .is_some_and(|c| matches!(c, MessageId::String(c) if *c == id));
        if !correlated {
            let _ = receiver.release(&delivery).await;
            continue;
        }
        let _ = receiver.accept(&delivery).await;
        break delivery.into_message();
    };
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, sender.close()).await;
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, receiver.close()).await;
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
    connection.close(super::CLOSE_TIMEOUT).await;
    let body = match reply.body {
        Body::Data(sections) => sections.iter().flat_map(|d| d.0.to_vec()).collect(),
        Body::Value(value) => match value.0 {
            Value::String(s) => s.into_bytes(),
            Value::Binary(b) => b.to_vec(),
            other => format!("{other:?}").into_bytes(),
        },
        other => format!("{other:?}").into_bytes(),
    };
    Ok(Reply { body, reply_to })
}
