//! AMQP messages in and out: a delivery's sections, the counters it carries,
//! what a handler sees of it, and the copies the host publishes.
//!
//! Messages are kept section by section. Application properties are kept as
//! plain AMQP values of any type: the AMQP spec allows only simple types
//! there, but clients send lists and maps anyway, and a message must never
//! be lost because it says more than the spec allows.

pub(crate) mod codes;
mod copy;
pub mod limits;
mod output;
mod seal;
pub(crate) mod sections;
mod view;

use std::time::{Duration, SystemTime};

use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{
    Body, DeliveryAnnotations, Footer, Header, Message, MessageAnnotations, Properties,
};
use fe2o3_amqp_types::primitives::{Symbol, Value};

pub use crate::retry_key::RetryKey;
use crate::settlement::{Counters, RETRY_COUNT_PROPERTY};
pub use copy::{CopyOf, copy_payload};
use limits::ValueLimits;
pub use output::OutputMessage;
pub use seal::RETRY_SEAL_PROPERTY;
pub use sections::DecodeFailure;
pub use view::{Delivery, DeliveryContext, Fields, Property, PropertyValue, to_delivery};

/// The application property Artemis detects duplicates by: a second
/// message with the same value on an address is dropped.
pub const ARTEMIS_DUPLICATE_ID: &str = "_AMQ_DUPL_ID";

/// The annotation RabbitMQ uses for its redelivery count where the header's
/// `delivery-count` stays empty (quorum queues).
const DELIVERY_COUNT_ANNOTATION: &str = "x-delivery-count";

/// The annotation RabbitMQ 4.1+ counts every earlier acquisition of a
/// message in (redeliveries after a lost link included).
const ACQUIRED_COUNT_ANNOTATION: &str = "x-acquired-count";

/// The annotation Artemis schedules a message by: milliseconds since the
/// Unix epoch, as a long.
pub const DELIVERY_TIME_ANNOTATION: &str = "x-opt-delivery-time";

/// The longest message-id an [`AmqpMessage::identity`] shows as it is.
pub const MAX_IDENTITY_ID: usize = 128;

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

impl AmqpMessage {
    /// A message without any section, to build one up from.
    pub fn empty() -> AmqpMessage {
        AmqpMessage {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: None,
            application_properties: None,
            body: Body::Empty,
            footer: None,
            unread: Vec::new(),
        }
    }
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
        sections::decode(payload).map(|(message, _)| message)
    }

    /// Decodes an encoded message as [`AmqpMessage::decode`] does, and says
    /// about how many bytes of memory the decoded message takes (see
    /// [`limits::Measured::decoded_bytes`]).
    pub fn decode_measured(payload: &[u8]) -> Result<(AmqpMessage, u64), DecodeFailure> {
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

    /// The `correlation-id` property, as text.
    pub fn correlation_id(&self) -> Option<String> {
        self.properties
            .as_ref()?
            .correlation_id
            .as_ref()
            .map(view::message_id_text)
    }

    /// The bytes of the body, when it holds bytes or text (`data`
    /// sections, or a binary or string `amqp-value`).
    pub fn body_size(&self) -> Option<usize> {
        match &self.body {
            Body::Data(sections) => Some(sections.iter().map(|d| d.0.len()).sum()),
            Body::Value(value) => match &value.0 {
                Value::Binary(bytes) => Some(bytes.len()),
                Value::String(text) => Some(text.len()),
                _ => None,
            },
            Body::Empty => Some(0),
            Body::Sequence(_) => None,
        }
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
            in_place: 0,
        }
    }

    /// The copy the host publishes for a retry: the same body, properties,
    /// application properties and message annotations, the retry count set
    /// to `retry_count`, and, when `due` is given, the broker told to hold
    /// it until then. The header is kept (durable, priority and TTL survive
    /// a broker restart) with its delivery count at zero: the retry count
    /// carries the attempts on.
    ///
    /// A copy is a new message, so what a broker or producer said of the
    /// original alone stays behind: the broker's reserved properties
    /// (Artemis would drop a copy carrying the original's `_AMQ_DUPL_ID` as
    /// a duplicate), the producer's scheduling and the broker's delivery
    /// counters among the annotations, and annotations the host cannot
    /// read. A duplicate-detection id the original carried becomes one of
    /// the copy's own, the same for every copy of that original at that
    /// retry count: a copy published twice (a crash between publishing it
    /// and settling its original) is still dropped once.
    pub fn copy(&self, retry_count: u32, due: Option<SystemTime>) -> AmqpMessage {
        let mut properties = self.application_properties.clone().unwrap_or_default();
        let duplicate_id = properties
            .iter()
            .find(|(key, _)| key == ARTEMIS_DUPLICATE_ID)
            .map(|(_, value)| copy_duplicate_id(value, retry_count));
        properties.retain(|(key, _)| {
            key != RETRY_COUNT_PROPERTY && key != RETRY_SEAL_PROPERTY && !reserved_property(key)
        });
        properties.push((RETRY_COUNT_PROPERTY.to_owned(), Value::Uint(retry_count)));
        if let Some(id) = duplicate_id {
            properties.push((ARTEMIS_DUPLICATE_ID.to_owned(), Value::String(id)));
        }
        let annotations = self
            .message_annotations
            .clone()
            .and_then(|mut annotations| {
                annotations.0.as_inner_mut().retain(|key, _| match key {
                    OwnedKey::Symbol(symbol) => {
                        !NOT_COPIED_ANNOTATIONS.contains(&symbol.0.as_str())
                    }
                    OwnedKey::Ulong(_) => true,
                });
                (!annotations.0.is_empty()).then_some(annotations)
            });
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
            unread: Vec::new(),
        };
        if let Some(due) = due {
            copy.schedule(due);
        }
        copy
    }

    /// What tells this message from any other, the same on every
    /// redelivery: its message-id (if any) and a digest of its bare
    /// message (properties, application properties, body). Two messages
    /// that reuse a message-id for different content differ; two that are
    /// the same in every section but the header are one. Its trace context
    /// is not part of it: a copy published twice (a crash between
    /// publishing it and settling its original) carries two span ids but
    /// is one message. A message-id over [`MAX_IDENTITY_ID`] bytes is
    /// digested with the rest, so an identity is at most about 150 bytes.
    pub fn identity(&self) -> String {
        use sha2::{Digest as _, Sha256};
        let mut digest = Sha256::new();
        let application_properties = self.application_properties.as_ref().map(|properties| {
            properties
                .iter()
                .filter(|(key, _)| {
                    key != crate::trace::keys::TRACEPARENT && key != crate::trace::keys::TRACESTATE
                })
                .cloned()
                .collect()
        });
        let bare = AmqpMessage {
            properties: self.properties.clone(),
            application_properties,
            ..AmqpMessage::empty()
        };
        // The body is the large part: digested as encoded, not copied.
        for part in [
            bare.encode().ok(),
            serde_amqp::to_vec(&self.body).ok().map(Into::into),
        ] {
            match part {
                Some(encoded) => digest.update(&encoded),
                None => digest.update(view::body_bytes(&self.body).0),
            }
        }
        // A long id is digested too: what is made of the identity (output
        // ids, keys of maps) stays short whatever the publisher chose.
        let id = self.message_id();
        let long_id = id.as_ref().filter(|id| id.len() > MAX_IDENTITY_ID);
        if let Some(id) = long_id {
            digest.update(id.as_bytes());
        }
        let hex: String = digest.finalize()[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        match id {
            Some(id) if long_id.is_none() => format!("{id}#{hex}"),
            _ => format!("sha256:{hex}"),
        }
    }

    /// Asks a broker that schedules messages (Artemis) to deliver this one
    /// no sooner than `due`.
    pub fn schedule(&mut self, due: SystemTime) {
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

/// An application property's value as text, for logs and spans: a string
/// as it is, anything else as JSON.
pub fn property_text(value: &Value) -> String {
    view::json_text(value)
}

/// The message-id of `payload` read from its properties section alone, as
/// a bounded, escaped rendering: for reports about a message whose other
/// sections do not decode. `None` when it has none, or the section does
/// not decode.
pub fn message_id_of(payload: &[u8]) -> Option<String> {
    let found = limits::sections(payload)?;
    let (_, range) = found.iter().find(|(code, _)| *code == codes::PROPERTIES)?;
    let bytes = &payload[range.clone()];
    limits::check(bytes, ValueLimits::DEFAULT).ok()?;
    let properties: Properties = serde_amqp::from_slice(bytes).ok()?;
    let id = properties.message_id.as_ref().map(view::message_id_text)?;
    Some(crate::text::shown(&id).to_string())
}

/// `payload`, a message as it arrived, with the message annotation `key`
/// set to the string `value`: every other section stays byte for byte as
/// it was. `None` when the payload's sections cannot be found, or its
/// annotations cannot be read within the limits (then it must travel as it
/// is).
pub fn annotate(payload: &[u8], key: &str, value: &str) -> Option<bytes::Bytes> {
    with_annotations(payload, |annotations| {
        annotations.0.insert(
            OwnedKey::Symbol(Symbol::from(key)),
            Value::String(value.to_owned()),
        );
        true
    })
}

/// `payload` with its message annotations as `edit` leaves them (`edit`
/// says whether it changed them; unchanged, the payload stays byte for
/// byte as it was); `None` when they cannot be read within the limits.
pub(crate) fn with_annotations(
    payload: &[u8],
    edit: impl FnOnce(&mut MessageAnnotations) -> bool,
) -> Option<bytes::Bytes> {
    let sections = limits::sections(payload)?;
    let existing = sections
        .iter()
        .find(|(code, _)| *code == codes::MESSAGE_ANNOTATIONS);
    let mut annotations = match existing {
        Some((_, range)) => {
            let bytes = &payload[range.clone()];
            limits::check(bytes, ValueLimits::DEFAULT).ok()?;
            serde_amqp::from_slice::<MessageAnnotations>(bytes).ok()?
        }
        None => MessageAnnotations::builder().build(),
    };
    if !edit(&mut annotations) {
        return Some(bytes::Bytes::copy_from_slice(payload));
    }
    let encoded = serde_amqp::to_vec(&annotations).ok()?;
    Some(with_section(
        payload,
        &sections,
        codes::MESSAGE_ANNOTATIONS,
        &encoded,
    ))
}

/// `payload` with its section `code` (as `sections` found them) replaced
/// by `encoded`, or `encoded` put where that section goes (before the
/// first section of a higher code) when it has none; every other section
/// stays byte for byte as it was.
pub(crate) fn with_section(
    payload: &[u8],
    sections: &[(u64, std::ops::Range<usize>)],
    code: u64,
    encoded: &[u8],
) -> bytes::Bytes {
    let (at, skip) = match sections.iter().find(|(found, _)| *found == code) {
        Some((_, range)) => (range.start, range.len()),
        None => (
            sections
                .iter()
                .find(|(found, _)| *found > code)
                .map_or(payload.len(), |(_, range)| range.start),
            0,
        ),
    };
    let mut out = Vec::with_capacity(payload.len() + encoded.len());
    out.extend_from_slice(&payload[..at]);
    out.extend_from_slice(encoded);
    out.extend_from_slice(&payload[at + skip..]);
    bytes::Bytes::from(out)
}

/// Message annotations a copy does not carry: the producer's scheduling
/// (Artemis, ActiveMQ Classic, Qpid Broker-J) and the broker's delivery
/// counters (RabbitMQ). A copy is due when the host says, and counted by
/// its retry count.
pub const NOT_COPIED_ANNOTATIONS: &[&str] = &[
    DELIVERY_TIME_ANNOTATION,
    "x-opt-delivery-delay",
    "x-opt-delivery-repeat",
    "x-opt-delivery-period",
    "x-qpid-not-valid-before",
    DELIVERY_COUNT_ANNOTATION,
    ACQUIRED_COUNT_ANNOTATION,
    "x-first-acquirer",
];

/// Whether `key` is an application property a broker reserves for itself
/// (Artemis's `_AMQ_` and `_HQ_` properties: duplicate detection, routing,
/// last-value and scheduling keys). Handlers may not set them, and copies
/// do not carry the original's.
pub fn reserved_property(key: &str) -> bool {
    key.starts_with("_AMQ_") || key.starts_with("_HQ_")
}

/// The duplicate-detection id of a copy at `retry_count` of a message
/// whose own id was `original` (itself perhaps a copy's).
fn copy_duplicate_id(original: &Value, retry_count: u32) -> String {
    let text = match original {
        Value::String(s) => s.clone(),
        Value::Symbol(s) => s.0.clone(),
        Value::Binary(b) => b.iter().map(|byte| format!("{byte:02x}")).collect(),
        other => view::to_json(other).to_string(),
    };
    let base = match text.rsplit_once("#retry-") {
        Some((base, n)) if n.parse::<u32>().is_ok() => base,
        _ => &text,
    };
    format!("{base}#retry-{retry_count}")
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
