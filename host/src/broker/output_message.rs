//! The AMQP message a handler's output becomes.

use std::time::{Duration, SystemTime};

use fe2o3_amqp::types::messaging::{Batch, Body, Data, Header, MessageId, Properties};
use fe2o3_amqp::types::primitives::{Binary, Symbol, Timestamp, Value};

use super::message::{ARTEMIS_DUPLICATE_ID, AmqpMessage};
use crate::sandbox::{self, OutboxMessage};

/// The message for output `index` of the delivery whose identity is
/// `input_id`. Its message-id, unless the handler chose one, is derived
/// from both, so an input handled twice publishes outputs with the same
/// ids; `duplicate_id` sets Artemis's duplicate-detection property to that
/// derived id whatever the handler chose: a handler may not pick the ids
/// the broker drops other messages by.
pub fn output_message(
    message: &OutboxMessage,
    input_id: &str,
    index: usize,
    duplicate_id: bool,
) -> AmqpMessage {
    let derived = format!("{input_id}/out/{index}");
    let id = message
        .message_id
        .clone()
        .unwrap_or_else(|| derived.clone());
    let mut properties: Vec<(String, Value)> = message
        .properties
        .iter()
        .map(|p| (p.key.clone(), amqp_value(&p.value)))
        .collect();
    if duplicate_id {
        properties.retain(|(key, _)| key != ARTEMIS_DUPLICATE_ID);
        properties.push((ARTEMIS_DUPLICATE_ID.to_owned(), Value::String(derived)));
    }
    let mut output = AmqpMessage {
        header: Some(Header {
            durable: message.durable,
            ..Header::default()
        }),
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            message_id: Some(MessageId::String(id)),
            correlation_id: message.correlation_id.clone().map(MessageId::String),
            content_type: message.content_type.clone().map(Symbol::from),
            subject: message.subject.clone(),
            ..Properties::default()
        }),
        application_properties: (!properties.is_empty()).then_some(properties),
        body: Body::Data(Batch::new(vec![Data(Binary::from(message.body.clone()))])),
        footer: None,
        unread: Vec::new(),
    };
    if let Some(ms) = message.delay.filter(|ms| *ms > 0) {
        output.schedule(SystemTime::now() + Duration::from_millis(ms));
    }
    output
}

fn amqp_value(value: &sandbox::Value) -> Value {
    match value {
        sandbox::Value::String(s) | sandbox::Value::Other(s) => Value::String(s.clone()),
        sandbox::Value::Int(n) => Value::Long(*n),
        sandbox::Value::Uint(n) => Value::Ulong(*n),
        sandbox::Value::Float(f) => Value::Double((*f).into()),
        sandbox::Value::Boolean(b) => Value::Bool(*b),
        sandbox::Value::Bytes(b) => Value::Binary(Binary::from(b.clone())),
        sandbox::Value::Timestamp(ms) => Value::Timestamp(Timestamp::from_milliseconds(*ms)),
        sandbox::Value::Null => Value::Null,
    }
}
