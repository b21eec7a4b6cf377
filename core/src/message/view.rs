//! What a handler sees of a delivery. Bytes stay bytes; structured AMQP
//! values (an `amqp-value` map, `amqp-sequence` sections, a list-valued
//! property) reach it as JSON text, so every language can read them.

use fe2o3_amqp_types::messaging::{Body, MessageId};
use fe2o3_amqp_types::primitives::Value;
use serde_json::{Map, Value as Json};

use super::AmqpMessage;

/// What the handler sees of a delivery: the WIT `delivery` record, built
/// here and lowered into the sandbox by the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The body's bytes (structured bodies as JSON).
    pub body: Vec<u8>,
    /// `properties.content-type`, or `application/json` for a body
    /// rendered as JSON.
    pub content_type: Option<String>,
    /// `properties.subject`.
    pub subject: Option<String>,
    /// `properties.message-id` as text.
    pub message_id: Option<String>,
    /// `properties.correlation-id` as text.
    pub correlation_id: Option<String>,
    /// `properties.reply-to`.
    pub reply_to: Option<String>,
    /// The AMQP header and properties fields beyond the ones above.
    pub fields: Fields,
    /// Application properties, in the order they arrived.
    pub properties: Vec<Property>,
    /// Message annotations, in the order they arrived, keys as text.
    pub annotations: Vec<Property>,
    /// The subscription address.
    pub address: String,
    /// The tenant's name.
    pub tenant: String,
    /// The mount's name.
    pub mount: String,
    /// The attempt number.
    pub attempt: u32,
    /// Whether the delivery arrived settled.
    pub presettled: bool,
}

/// A message's AMQP header and properties fields that carry no body,
/// identity or routing wharf acts on: what a handler reads of a delivery
/// and (but `to`, `user-id` and `first-acquirer`) sets on an output.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fields {
    /// `properties.to`.
    pub to: Option<String>,
    /// `properties.user-id`.
    pub user_id: Option<Vec<u8>>,
    /// `properties.group-id`.
    pub group_id: Option<String>,
    /// `properties.group-sequence`.
    pub group_sequence: Option<u32>,
    /// `properties.reply-to-group-id`.
    pub reply_to_group_id: Option<String>,
    /// `properties.creation-time`, milliseconds since the Unix epoch.
    pub creation_time: Option<i64>,
    /// `properties.absolute-expiry-time`, milliseconds since the Unix epoch.
    pub absolute_expiry_time: Option<i64>,
    /// `header.priority`; `None` when the message has no header.
    pub priority: Option<u8>,
    /// `header.durable`.
    pub durable: bool,
    /// `header.first-acquirer`.
    pub first_acquirer: bool,
}

impl Fields {
    /// The priority AMQP gives a message that names none.
    pub const DEFAULT_PRIORITY: u8 = 4;

    /// What `message`'s header and properties sections say.
    pub fn of(message: &AmqpMessage) -> Fields {
        let header = message.header.as_ref();
        let properties = message.properties.as_ref();
        let time =
            |t: Option<&fe2o3_amqp_types::primitives::Timestamp>| t.map(|t| t.milliseconds());
        Fields {
            to: properties.and_then(|p| p.to.clone()),
            user_id: properties.and_then(|p| p.user_id.as_ref().map(|b| b.to_vec())),
            group_id: properties.and_then(|p| p.group_id.clone()),
            group_sequence: properties.and_then(|p| p.group_sequence),
            reply_to_group_id: properties.and_then(|p| p.reply_to_group_id.clone()),
            creation_time: time(properties.and_then(|p| p.creation_time.as_ref())),
            absolute_expiry_time: time(properties.and_then(|p| p.absolute_expiry_time.as_ref())),
            priority: header.map(|h| h.priority.0),
            durable: header.is_some_and(|h| h.durable),
            first_acquirer: header.is_some_and(|h| h.first_acquirer),
        }
    }
}

/// One application property as the handler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    /// The key.
    pub key: String,
    /// The value.
    pub value: PropertyValue,
}

/// An application property's value: simple AMQP types as themselves,
/// anything else as JSON text (`other`).
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyValue {
    /// `string`, `symbol` or `char`.
    String(String),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    Uint(u64),
    /// `float` or `double`.
    Float(f64),
    /// `boolean`.
    Boolean(bool),
    /// `binary`.
    Bytes(Vec<u8>),
    /// Milliseconds since the Unix epoch.
    Timestamp(i64),
    /// `null`.
    Null,
    /// Anything else, as JSON text.
    Other(String),
}

/// The content type a handler sees for a body the host rendered as JSON,
/// when the message names none.
const JSON_CONTENT_TYPE: &str = "application/json";

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

/// What the handler sees of a delivery.
pub fn to_delivery(message: &AmqpMessage, context: DeliveryContext<'_>) -> Delivery {
    let properties = message.properties.as_ref();
    let (body, rendered) = body_bytes(&message.body);
    let content_type = properties
        .and_then(|p| p.content_type.as_ref().map(|s| s.0.clone()))
        .or_else(|| rendered.then(|| JSON_CONTENT_TYPE.to_owned()));
    Delivery {
        body,
        content_type,
        subject: properties.and_then(|p| p.subject.clone()),
        message_id: properties.and_then(|p| p.message_id.as_ref().map(message_id_text)),
        correlation_id: properties.and_then(|p| p.correlation_id.as_ref().map(message_id_text)),
        reply_to: properties.and_then(|p| p.reply_to.clone()),
        fields: Fields::of(message),
        properties: message
            .application_properties
            .iter()
            .flatten()
            .map(|(key, value)| Property {
                key: key.clone(),
                value: property_value(value),
            })
            .collect(),
        annotations: message
            .message_annotations
            .iter()
            .flat_map(|annotations| annotations.0.iter())
            .map(|(key, value)| Property {
                key: annotation_key(key),
                value: property_value(value),
            })
            .collect(),
        address: context.address.to_owned(),
        tenant: context.tenant.to_owned(),
        mount: context.mount.to_owned(),
        attempt: context.attempt,
        presettled: context.presettled,
    }
}

/// The body as the handler gets it, and whether the host rendered it as
/// JSON: `data` sections joined; an `amqp-value` string, symbol or binary as
/// its bytes, null as nothing, anything else as JSON; `amqp-sequence`
/// sections as one JSON array of all their items.
pub(super) fn body_bytes(body: &Body<Value>) -> (Vec<u8>, bool) {
    match body {
        Body::Data(sections) => (
            sections.iter().flat_map(|d| d.0.iter().copied()).collect(),
            false,
        ),
        Body::Value(value) => match &value.0 {
            Value::Binary(bytes) => (bytes.to_vec(), false),
            Value::String(text) => (text.clone().into_bytes(), false),
            Value::Symbol(symbol) => (symbol.0.clone().into_bytes(), false),
            Value::Null => (Vec::new(), false),
            other => (json_text(other).into_bytes(), true),
        },
        Body::Sequence(sections) => {
            let items = sections
                .iter()
                .flat_map(|s| s.0.iter())
                .map(to_json)
                .collect();
            (Json::Array(items).to_string().into_bytes(), true)
        }
        Body::Empty => (Vec::new(), false),
    }
}

/// An annotation's key as text: a symbol as itself, a numeric key as its
/// decimal digits.
fn annotation_key(key: &fe2o3_amqp_types::messaging::annotations::OwnedKey) -> String {
    use fe2o3_amqp_types::messaging::annotations::OwnedKey;
    match key {
        OwnedKey::Symbol(symbol) => symbol.0.clone(),
        OwnedKey::Ulong(n) => n.to_string(),
    }
}

fn property_value(value: &Value) -> PropertyValue {
    use PropertyValue as V;
    match value {
        Value::Null => V::Null,
        Value::Bool(b) => V::Boolean(*b),
        Value::Ubyte(n) => V::Uint(u64::from(*n)),
        Value::Ushort(n) => V::Uint(u64::from(*n)),
        Value::Uint(n) => V::Uint(u64::from(*n)),
        Value::Ulong(n) => V::Uint(*n),
        Value::Byte(n) => V::Int(i64::from(*n)),
        Value::Short(n) => V::Int(i64::from(*n)),
        Value::Int(n) => V::Int(i64::from(*n)),
        Value::Long(n) => V::Int(*n),
        Value::Float(f) => V::Float(f64::from(f.into_inner())),
        Value::Double(f) => V::Float(f.into_inner()),
        Value::Timestamp(t) => V::Timestamp(t.milliseconds()),
        Value::Binary(bytes) => V::Bytes(bytes.to_vec()),
        Value::String(s) => V::String(s.clone()),
        Value::Symbol(s) => V::String(s.0.clone()),
        Value::Char(c) => V::String(c.to_string()),
        Value::Uuid(uuid) => V::Other(uuid_text(uuid.as_inner())),
        other => V::Other(json_text(other)),
    }
}

/// An AMQP value as JSON text: see [`to_json`].
pub(super) fn json_text(value: &Value) -> String {
    match to_json(value) {
        // A bare string is shown without quotes, as `other(text)` reads.
        Json::String(text) => text,
        json => json.to_string(),
    }
}

/// An AMQP value as JSON: numbers as numbers, binary as lowercase hex,
/// uuids in their usual text form, decimals as the hex of their bytes,
/// timestamps as milliseconds since the Unix epoch, lists and arrays as
/// arrays, maps with string keys as objects (other maps as arrays of
/// `[key, value]` pairs), described values as
/// `{"descriptor": ..., "value": ...}`.
pub(super) fn to_json(value: &Value) -> Json {
    match value {
        Value::Null => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Ubyte(n) => Json::from(*n),
        Value::Ushort(n) => Json::from(*n),
        Value::Uint(n) => Json::from(*n),
        Value::Ulong(n) => Json::from(*n),
        Value::Byte(n) => Json::from(*n),
        Value::Short(n) => Json::from(*n),
        Value::Int(n) => Json::from(*n),
        Value::Long(n) => Json::from(*n),
        Value::Float(f) => Json::from(f64::from(f.into_inner())),
        Value::Double(f) => Json::from(f.into_inner()),
        Value::Decimal32(d) => Json::String(hex(d.as_inner())),
        Value::Decimal64(d) => Json::String(hex(d.as_inner())),
        Value::Decimal128(d) => Json::String(hex(d.as_inner())),
        Value::Char(c) => Json::String(c.to_string()),
        Value::Timestamp(t) => Json::from(t.milliseconds()),
        Value::Uuid(uuid) => Json::String(uuid_text(uuid.as_inner())),
        Value::Binary(bytes) => Json::String(hex(bytes)),
        Value::String(s) => Json::String(s.clone()),
        Value::Symbol(s) => Json::String(s.0.clone()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Array(items) => Json::Array(items.0.iter().map(to_json).collect()),
        Value::Map(map) => {
            let string_keys = map
                .iter()
                .all(|(k, _)| matches!(k, Value::String(_) | Value::Symbol(_)));
            if string_keys {
                let object: Map<String, Json> = map
                    .iter()
                    .map(|(k, v)| (json_text(k), to_json(v)))
                    .collect();
                Json::Object(object)
            } else {
                Json::Array(
                    map.iter()
                        .map(|(k, v)| Json::Array(vec![to_json(k), to_json(v)]))
                        .collect(),
                )
            }
        }
        Value::Described(described) => {
            let descriptor = match &described.descriptor {
                serde_amqp::descriptor::Descriptor::Name(name) => Json::String(name.0.clone()),
                serde_amqp::descriptor::Descriptor::Code(code) => Json::from(*code),
            };
            let mut object = Map::new();
            object.insert("descriptor".to_owned(), descriptor);
            object.insert("value".to_owned(), to_json(&described.value));
            Json::Object(object)
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A message id (or correlation id) as text, whatever its AMQP type.
pub(super) fn message_id_text(id: &MessageId) -> String {
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(uuid) => uuid_text(uuid.as_inner()),
        MessageId::Binary(bytes) => hex(bytes),
    }
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = hex(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}
