//! AMQP messages in and out: a delivery's sections, the counters it carries,
//! what a handler sees of it, and the copies the host publishes.
//!
//! Messages are kept section by section. Application properties are kept as
//! plain AMQP values of any type: the AMQP spec allows only simple types
//! there, but clients send lists and maps anyway, and a message must never
//! be lost because it says more than the spec allows.

mod output;
mod sections;
mod view;

use std::time::{Duration, SystemTime};

use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::messaging::{
    Body, DeliveryAnnotations, Footer, Header, Message, MessageAnnotations, Properties,
};
use fe2o3_amqp::types::primitives::{Symbol, Value};

use crate::settlement::{Counters, RETRY_COUNT_PROPERTY};
pub use output::ARTEMIS_DUPLICATE_ID;
pub use sections::DecodeFailure;
pub use view::{DeliveryContext, to_delivery};

/// The annotation RabbitMQ uses for its redelivery count where the header's
/// `delivery-count` stays empty (quorum queues).
const DELIVERY_COUNT_ANNOTATION: &str = "x-delivery-count";

/// The annotation RabbitMQ 4.1+ counts every earlier acquisition of a
/// message in (redeliveries after a lost link included).
const ACQUIRED_COUNT_ANNOTATION: &str = "x-acquired-count";

/// The annotation Artemis schedules a message by: milliseconds since the
/// Unix epoch, as a long.
pub const DELIVERY_TIME_ANNOTATION: &str = "x-opt-delivery-time";

/// A message, section by section.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpMessage {
    /// The header section.
    pub header: Option<Header>,
    /// Delivery annotations (for one hop only: never copied).
    pub delivery_annotations: Option<DeliveryAnnotations>,
    /// Message annotations.
    pub message_annotations: Option<MessageAnnotations>,
    /// The properties section.
    pub properties: Option<Properties>,
    /// Application properties in the order they arrived; `None` when the
    /// message has no such section.
    pub application_properties: Option<Vec<(String, Value)>>,
    /// The body sections.
    pub body: Body<Value>,
    /// The footer.
    pub footer: Option<Footer>,
    /// Annotation and footer sections whose values do not decode (a
    /// broker's dead-letter history, say), by section code, kept as they
    /// arrived so they travel on unchanged.
    pub unread: Vec<(u64, bytes::Bytes)>,
}

impl From<Message<Body<Value>>> for AmqpMessage {
    fn from(message: Message<Body<Value>>) -> AmqpMessage {
        AmqpMessage {
            header: message.header,
            delivery_annotations: message.delivery_annotations,
            message_annotations: message.message_annotations,
            properties: message.properties,
            application_properties: message.application_properties.map(|p| {
                p.0.into_iter()
                    .map(|(key, value)| (key, Value::from(value)))
                    .collect()
            }),
            body: message.body,
            footer: message.footer,
            unread: Vec::new(),
        }
    }
}

impl AmqpMessage {
    /// Decodes an encoded message, whatever types its application
    /// properties hold.
    pub fn decode(payload: &[u8]) -> Result<AmqpMessage, DecodeFailure> {
        sections::decode(payload)
    }

    /// The message's sections as they go on the wire.
    pub fn encode(&self) -> Result<bytes::Bytes, DecodeFailure> {
        sections::encode(self)
    }

    /// An application property.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.application_properties
            .as_ref()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// `properties.message-id` as text, for logs and handlers.
    pub fn message_id(&self) -> Option<String> {
        self.properties
            .as_ref()?
            .message_id
            .as_ref()
            .map(view::message_id_text)
    }

    /// The broker's redelivery count and the host's retry count.
    pub fn counters(&self) -> Counters {
        let annotation = |key: &str| {
            self.message_annotations
                .as_ref()?
                .0
                .get(&OwnedKey::Symbol(Symbol::from(key)))
                .and_then(as_u32)
        };
        // Quorum queues count failed deliveries, and (4.1+) every acquisition.
        let annotated =
            annotation(DELIVERY_COUNT_ANNOTATION).max(annotation(ACQUIRED_COUNT_ANNOTATION));
        let delivery_count = match (&self.header, annotated) {
            (Some(header), Some(annotated)) => Some(header.delivery_count.max(annotated)),
            (Some(header), None) => Some(header.delivery_count),
            (None, annotated) => annotated,
        };
        Counters {
            delivery_count,
            retry_count: self.property(RETRY_COUNT_PROPERTY).and_then(as_u32),
        }
    }

    /// The copy the host publishes for a retry: the same body, properties,
    /// application properties and message annotations, the retry count set
    /// to `retry_count`, and, when `due` is given, the broker told to hold
    /// it until then. The header is kept (durable, priority and TTL survive
    /// a broker restart) with its delivery count at zero: the retry count
    /// carries the attempts on.
    pub fn copy(&self, retry_count: u32, due: Option<SystemTime>) -> AmqpMessage {
        let mut properties = self.application_properties.clone().unwrap_or_default();
        properties.retain(|(key, _)| key != RETRY_COUNT_PROPERTY);
        properties.push((RETRY_COUNT_PROPERTY.to_owned(), Value::Uint(retry_count)));
        let annotations = self.message_annotations.clone();
        // Unreadable annotations travel on, unless the copy needs a
        // delivery time among them.
        let mut unread: Vec<(u64, bytes::Bytes)> = self
            .unread
            .iter()
            .filter(|(code, _)| *code == sections::MESSAGE_ANNOTATIONS && due.is_none())
            .cloned()
            .collect();
        if due.is_some() {
            unread.clear();
        }
        let mut copy = AmqpMessage {
            header: self.header.as_ref().map(|header| Header {
                delivery_count: 0,
                first_acquirer: false,
                ..header.clone()
            }),
            delivery_annotations: None,
            message_annotations: annotations,
            properties: self.properties.clone(),
            application_properties: Some(properties),
            body: self.body.clone(),
            footer: None,
            unread,
        };
        if let Some(due) = due {
            copy.schedule(due);
        }
        copy
    }

    /// Asks a broker that schedules messages (Artemis) to deliver this one
    /// no sooner than `due`.
    fn schedule(&mut self, due: SystemTime) {
        let millis = due
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis();
        // A long, as JMS clients send it: Artemis ignores a timestamp.
        let at = i64::try_from(millis).unwrap_or(i64::MAX);
        self.message_annotations
            .get_or_insert_with(|| MessageAnnotations::builder().build())
            .0
            .insert(
                OwnedKey::Symbol(Symbol::from(DELIVERY_TIME_ANNOTATION)),
                Value::Long(at),
            );
    }
}

/// A counter, whichever integer type (or decimal text) the sender used.
fn as_u32(value: &Value) -> Option<u32> {
    match value {
        Value::Ubyte(n) => Some(u32::from(*n)),
        Value::Ushort(n) => Some(u32::from(*n)),
        Value::Uint(n) => Some(*n),
        Value::Ulong(n) => u32::try_from(*n).ok(),
        Value::Byte(n) => u32::try_from(*n).ok(),
        Value::Short(n) => u32::try_from(*n).ok(),
        Value::Int(n) => u32::try_from(*n).ok(),
        Value::Long(n) => u32::try_from(*n).ok(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
