//! The AMQP message a handler's output becomes.

use std::time::{Duration, SystemTime};

use fe2o3_amqp_types::messaging::{Batch, Body, Data, Header, MessageId, Properties};
use fe2o3_amqp_types::primitives::{Binary, Symbol, Timestamp, Value};

use super::{ARTEMIS_DUPLICATE_ID, AmqpMessage, Fields, Property, PropertyValue};

/// What a handler sent through its outbox: the WIT outbox `message`
/// record, lifted out of the sandbox by the host.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputMessage {
    /// The body, sent as one `data` section.
    pub body: Vec<u8>,
    /// `properties.content-type`.
    pub content_type: Option<String>,
    /// `properties.subject`.
    pub subject: Option<String>,
    /// `properties.message-id`; derived from the input when absent.
    pub message_id: Option<String>,
    /// `properties.correlation-id`.
    pub correlation_id: Option<String>,
    /// Application properties.
    pub properties: Vec<Property>,
    /// `header.durable`.
    pub durable: bool,
    /// Milliseconds before it is due, on brokers that schedule messages.
    pub delay: Option<u64>,
    /// `properties.group-id`.
    pub group_id: Option<String>,
    /// `properties.group-sequence`.
    pub group_sequence: Option<u32>,
    /// `properties.reply-to-group-id`.
    pub reply_to_group_id: Option<String>,
    /// `header.priority`.
    pub priority: Option<u8>,
    /// `properties.creation-time`, milliseconds since the Unix epoch.
    pub creation_time: Option<i64>,
    /// `properties.absolute-expiry-time`, milliseconds since the Unix epoch.
    pub absolute_expiry_time: Option<i64>,
}

impl OutputMessage {
    /// The message for output `index` of the delivery whose identity is
    /// `input_id`. Its message-id, unless the handler chose one, is derived
    /// from both, so an input handled twice publishes outputs with the same
    /// ids; `duplicate_id` sets Artemis's duplicate-detection property to
    /// that derived id whatever the handler chose: a handler may not pick
    /// the ids the broker drops other messages by.
    pub fn to_amqp(&self, input_id: &str, index: usize, duplicate_id: bool) -> AmqpMessage {
        let derived = format!("{input_id}/out/{index}");
        let id = self.message_id.clone().unwrap_or_else(|| derived.clone());
        let mut properties: Vec<(String, Value)> = self
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
                durable: self.durable,
                priority: self.priority.unwrap_or(Fields::DEFAULT_PRIORITY).into(),
                ..Header::default()
            }),
            delivery_annotations: None,
            message_annotations: None,
            properties: Some(Properties {
                message_id: Some(MessageId::String(id)),
                correlation_id: self.correlation_id.clone().map(MessageId::String),
                content_type: self.content_type.clone().map(Symbol::from),
                subject: self.subject.clone(),
                group_id: self.group_id.clone(),
                group_sequence: self.group_sequence,
                reply_to_group_id: self.reply_to_group_id.clone(),
                creation_time: self.creation_time.map(Timestamp::from_milliseconds),
                absolute_expiry_time: self.absolute_expiry_time.map(Timestamp::from_milliseconds),
                ..Properties::default()
            }),
            application_properties: (!properties.is_empty()).then_some(properties),
            body: Body::Data(Batch::new(vec![Data(Binary::from(self.body.clone()))])),
            footer: None,
            unread: Vec::new(),
        };
        if let Some(ms) = self.delay.filter(|ms| *ms > 0) {
            output.schedule(SystemTime::now() + Duration::from_millis(ms));
        }
        output
    }
}

fn amqp_value(value: &PropertyValue) -> Value {
    match value {
        PropertyValue::String(s) | PropertyValue::Other(s) => Value::String(s.clone()),
        PropertyValue::Int(n) => Value::Long(*n),
        PropertyValue::Uint(n) => Value::Ulong(*n),
        PropertyValue::Float(f) => Value::Double((*f).into()),
        PropertyValue::Boolean(b) => Value::Bool(*b),
        PropertyValue::Bytes(b) => Value::Binary(Binary::from(b.clone())),
        PropertyValue::Timestamp(ms) => Value::Timestamp(Timestamp::from_milliseconds(*ms)),
        PropertyValue::Null => Value::Null,
    }
}
