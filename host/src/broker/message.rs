//! AMQP messages in and out: the counters a delivery carries, what a handler
//! sees of it, and the copies the host publishes.

use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message, annotations::OwnedKey};
use fe2o3_amqp::types::primitives::{SimpleValue, Symbol, Value};

use crate::sandbox;
use crate::settlement::{Counters, RETRY_COUNT_PROPERTY};

/// A message as it travels over the wire, body sections and all.
pub type AmqpMessage = Message<Body<Value>>;

/// The annotation RabbitMQ 4 uses for its redelivery count, where the
/// header's `delivery-count` stays empty.
const DELIVERY_COUNT_ANNOTATION: &str = "x-delivery-count";

/// Reads the broker's redelivery count and the host's retry count.
pub fn counters(message: &AmqpMessage) -> Counters {
    let annotated = message
        .message_annotations
        .as_ref()
        .and_then(|a| {
            a.0.get(&OwnedKey::Symbol(Symbol::from(DELIVERY_COUNT_ANNOTATION)))
        })
        .and_then(as_u32);
    let delivery_count = match (&message.header, annotated) {
        (Some(header), Some(annotated)) => Some(header.delivery_count.max(annotated)),
        (Some(header), None) => Some(header.delivery_count),
        (None, annotated) => annotated,
    };
    let retry_count = message
        .application_properties
        .as_ref()
        .and_then(|p| p.0.get(RETRY_COUNT_PROPERTY))
        .and_then(|v| as_u32(&Value::from(v.clone())));
    Counters {
        delivery_count,
        retry_count,
    }
}

/// The copy the host publishes for a retry: same body, properties,
/// application properties and message annotations, no header, and the retry
/// count set to `retry_count`.
pub fn copy(message: &AmqpMessage, retry_count: u32) -> AmqpMessage {
    let mut properties = message
        .application_properties
        .clone()
        .unwrap_or_else(|| ApplicationProperties::builder().build());
    properties.0.insert(
        RETRY_COUNT_PROPERTY.to_owned(),
        SimpleValue::Uint(retry_count),
    );
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: message.message_annotations.clone(),
        properties: message.properties.clone(),
        application_properties: Some(properties),
        body: message.body.clone(),
        footer: None,
    }
}

/// What the handler sees of a delivery.
pub fn to_delivery(message: &AmqpMessage, context: DeliveryContext<'_>) -> sandbox::Delivery {
    let properties = message.properties.as_ref();
    sandbox::Delivery {
        body: body_bytes(&message.body),
        content_type: properties.and_then(|p| p.content_type.as_ref().map(|s| s.0.clone())),
        subject: properties.and_then(|p| p.subject.clone()),
        message_id: properties.and_then(|p| p.message_id.as_ref().map(message_id_text)),
        correlation_id: properties.and_then(|p| p.correlation_id.as_ref().map(message_id_text)),
        reply_to: properties.and_then(|p| p.reply_to.clone()),
        properties: message
            .application_properties
            .as_ref()
            .map(|p| {
                p.0.iter()
                    .map(|(key, value)| sandbox::Property {
                        key: key.clone(),
                        value: property_value(value),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        address: context.address.to_owned(),
        tenant: context.tenant.to_owned(),
        mount: context.mount.to_owned(),
        attempt: context.attempt,
        presettled: context.presettled,
    }
}

/// Where a delivery arrived and what the host knows of it.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryContext<'a> {
    /// The subscription address.
    pub address: &'a str,
    /// The tenant's name.
    pub tenant: &'a str,
    /// The mount's name.
    pub mount: &'a str,
    /// The attempt number.
    pub attempt: u32,
    /// Whether the delivery arrived settled.
    pub presettled: bool,
}

/// `properties.message-id` as text, for logs and handlers.
pub fn message_id(message: &AmqpMessage) -> Option<String> {
    message
        .properties
        .as_ref()?
        .message_id
        .as_ref()
        .map(message_id_text)
}

fn body_bytes(body: &Body<Value>) -> Vec<u8> {
    match body {
        Body::Data(sections) => sections.iter().flat_map(|d| d.0.iter().copied()).collect(),
        Body::Value(value) => match &value.0 {
            Value::Binary(bytes) => bytes.to_vec(),
            Value::String(text) => text.clone().into_bytes(),
            Value::Symbol(symbol) => symbol.0.clone().into_bytes(),
            Value::Null => Vec::new(),
            other => format!("{other:?}").into_bytes(),
        },
        Body::Sequence(sections) => format!("{:?}", sections).into_bytes(),
        Body::Empty => Vec::new(),
    }
}

fn message_id_text(id: &fe2o3_amqp::types::messaging::MessageId) -> String {
    use fe2o3_amqp::types::messaging::MessageId;
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(uuid) => uuid_text(uuid.as_inner()),
        MessageId::Binary(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn property_value(value: &SimpleValue) -> sandbox::Value {
    use sandbox::Value as V;
    match value {
        SimpleValue::Null => V::Null,
        SimpleValue::Bool(b) => V::Boolean(*b),
        SimpleValue::Ubyte(n) => V::Uint(u64::from(*n)),
        SimpleValue::Ushort(n) => V::Uint(u64::from(*n)),
        SimpleValue::Uint(n) => V::Uint(u64::from(*n)),
        SimpleValue::Ulong(n) => V::Uint(*n),
        SimpleValue::Byte(n) => V::Int(i64::from(*n)),
        SimpleValue::Short(n) => V::Int(i64::from(*n)),
        SimpleValue::Int(n) => V::Int(i64::from(*n)),
        SimpleValue::Long(n) => V::Int(*n),
        SimpleValue::Float(f) => V::Float(f64::from(f.into_inner())),
        SimpleValue::Double(f) => V::Float(f.into_inner()),
        SimpleValue::Timestamp(t) => V::Timestamp(t.milliseconds()),
        SimpleValue::Binary(bytes) => V::Bytes(bytes.to_vec()),
        SimpleValue::String(s) => V::String(s.clone()),
        SimpleValue::Symbol(s) => V::String(s.0.clone()),
        SimpleValue::Uuid(uuid) => V::Other(uuid_text(uuid.as_inner())),
        other => V::Other(format!("{other:?}")),
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
mod tests {
    use fe2o3_amqp::types::messaging::{Header, MessageAnnotations};

    use super::*;

    fn message() -> AmqpMessage {
        Message::builder()
            .application_properties(ApplicationProperties::builder().insert("k", "v").build())
            .body(Body::Value(fe2o3_amqp::types::messaging::AmqpValue(
                Value::String("hello".into()),
            )))
            .build()
    }

    #[test]
    fn no_header_no_counter() {
        assert_eq!(counters(&message()), Counters::default());
    }

    #[test]
    fn header_counter_and_retry_count() {
        let mut m = copy(&message(), 2);
        m.header = Some(Header {
            delivery_count: 3,
            ..Header::default()
        });
        let c = counters(&m);
        assert_eq!(c.delivery_count, Some(3));
        assert_eq!(c.retry_count, Some(2));
        assert_eq!(c.attempt(), 6);
    }

    #[test]
    fn annotation_counter_fills_an_empty_header() {
        let mut m = message();
        m.header = Some(Header::default());
        m.message_annotations = Some(
            MessageAnnotations::builder()
                .insert(Symbol::from(DELIVERY_COUNT_ANNOTATION), Value::Long(4))
                .build(),
        );
        assert_eq!(counters(&m).delivery_count, Some(4));
    }

    #[test]
    fn copy_keeps_everything_but_the_header() {
        let mut m = message();
        m.header = Some(Header {
            delivery_count: 5,
            ..Header::default()
        });
        let c = copy(&m, 1);
        assert!(c.header.is_none());
        assert_eq!(c.body, m.body);
        let props = c.application_properties.expect("properties");
        assert_eq!(props.0.get("k"), Some(&SimpleValue::String("v".into())));
        assert_eq!(
            props.0.get(RETRY_COUNT_PROPERTY),
            Some(&SimpleValue::Uint(1))
        );
    }

    #[test]
    fn handler_sees_body_and_properties() {
        let d = to_delivery(
            &message(),
            DeliveryContext {
                address: "q",
                tenant: "t",
                mount: "m",
                attempt: 1,
                presettled: false,
            },
        );
        assert_eq!(d.body, b"hello");
        assert_eq!(d.properties.len(), 1);
        assert_eq!(d.properties[0].key, "k");
        assert!(matches!(&d.properties[0].value, sandbox::Value::String(s) if s == "v"));
    }
}
