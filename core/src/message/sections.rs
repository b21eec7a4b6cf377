//! Encoding and decoding a message section by section, for messages the
//! typed `Message` of fe2o3 cannot hold (application properties that are
//! lists, maps, arrays or described values).

use bytes::Bytes;
use fe2o3_amqp_types::messaging::{
    AmqpSequence, AmqpValue, Batch, Body, Data, DeliveryAnnotations, Footer, Header,
    MessageAnnotations, Properties,
};
use fe2o3_amqp_types::primitives::{OrderedMap, Value};
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use serde_amqp::lazy::LazyValue;
use serde_amqp::read::{Read as _, SliceReader};

use super::AmqpMessage;
use super::codes::{
    APPLICATION_PROPERTIES, DATA, DELIVERY_ANNOTATIONS, FOOTER, HEADER, MESSAGE_ANNOTATIONS,
    PROPERTIES, SEQUENCE, VALUE, code_of_name,
};
use super::limits::{self, ValueLimits};
use crate::text::{self, DESCRIPTION_BYTES};

/// A message that is not AMQP: what is wrong with it, for the
/// `amqp:decode-error` the host rejects it with. Its words are bounded
/// ([`DESCRIPTION_BYTES`]) and quote the message only through escaped,
/// bounded renderings, so they fit any frame and any log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeFailure(String);

impl DecodeFailure {
    /// A failure saying `why`, cut to [`DESCRIPTION_BYTES`].
    pub fn new(why: String) -> DecodeFailure {
        DecodeFailure(text::bounded(why, DESCRIPTION_BYTES))
    }

    /// What is wrong, in words.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The message, and about how many bytes of memory it takes decoded.
pub(super) fn decode(payload: &[u8]) -> Result<(AmqpMessage, u64), DecodeFailure> {
    // Nothing is decoded until the whole payload is known to be within the
    // limits: decoding recurses once per level of nesting.
    let measured = limits::measure(payload, ValueLimits::DEFAULT)
        .map_err(|e| DecodeFailure::new(e.to_string()))?;
    let mut message = AmqpMessage::empty();
    let mut data = Vec::new();
    let mut sequences = Vec::new();
    let mut reader = SliceReader::new(payload);
    let mut index = 0;
    while reader.peek().is_some() {
        index += 1;
        let section = LazyValue::from_reader(&mut reader)
            .map_err(|e| failure(index, "is not an AMQP value", e))?;
        let bytes = section.as_slice();
        let code = section_code(bytes).ok_or_else(|| {
            DecodeFailure::new(format!(
                "section {index} is not a described message section"
            ))
        })?;
        let typed = |what: &'static str| move |e: serde_amqp::Error| failure(index, what, e);
        match code {
            HEADER => {
                message.header = Some(typed_section::<Header>(bytes).map_err(typed("header"))?)
            }
            DELIVERY_ANNOTATIONS => match typed_section::<DeliveryAnnotations>(bytes) {
                Ok(annotations) => message.delivery_annotations = Some(annotations),
                Err(_) => message.unread.push((code, section.as_bytes().clone())),
            },
            MESSAGE_ANNOTATIONS => match typed_section::<MessageAnnotations>(bytes) {
                Ok(annotations) => message.message_annotations = Some(annotations),
                Err(_) => message.unread.push((code, section.as_bytes().clone())),
            },
            PROPERTIES => {
                message.properties =
                    Some(typed_section::<Properties>(bytes).map_err(typed("properties"))?);
            }
            APPLICATION_PROPERTIES => {
                message.application_properties = Some(application_properties(index, bytes)?);
            }
            DATA => data.push(typed_section::<Data>(bytes).map_err(typed("data"))?),
            SEQUENCE => sequences
                .push(typed_section::<AmqpSequence<Value>>(bytes).map_err(typed("amqp-sequence"))?),
            VALUE => {
                message.body = Body::Value(
                    typed_section::<AmqpValue<Value>>(bytes).map_err(typed("amqp-value"))?,
                );
            }
            FOOTER => match typed_section::<Footer>(bytes) {
                Ok(footer) => message.footer = Some(footer),
                Err(_) => message.unread.push((code, section.as_bytes().clone())),
            },
            other => {
                return Err(DecodeFailure::new(format!(
                    "section {index} has the unknown descriptor {other:#x}"
                )));
            }
        }
    }
    match (data.is_empty(), sequences.is_empty(), &message.body) {
        (true, true, _) => {}
        (false, true, Body::Empty) => message.body = Body::Data(Batch::new(data)),
        (true, false, Body::Empty) => message.body = Body::Sequence(Batch::new(sequences)),
        _ => {
            return Err(DecodeFailure::new(
                "the body mixes data, amqp-sequence and amqp-value sections".to_owned(),
            ));
        }
    }
    Ok((message, measured.decoded_bytes))
}

fn failure(index: usize, what: &str, error: serde_amqp::Error) -> DecodeFailure {
    // A decoder's words may quote what it read.
    DecodeFailure::new(format!(
        "section {index} ({what}) does not decode: {}",
        text::shown(&error.to_string())
    ))
}

fn typed_section<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_amqp::Error> {
    serde_amqp::from_slice(bytes)
}

/// The descriptor code of a described section (its symbolic name mapped
/// to the code), read from its first bytes.
fn section_code(bytes: &[u8]) -> Option<u64> {
    let (&described, rest) = bytes.split_first()?;
    if described != 0x00 {
        return None;
    }
    let (&constructor, rest) = rest.split_first()?;
    let name = match constructor {
        // smallulong, ulong0, ulong
        0x53 => return rest.first().map(|code| u64::from(*code)),
        0x44 => return Some(0),
        0x80 => return Some(u64::from_be_bytes(rest.get(..8)?.try_into().ok()?)),
        // sym8, sym32
        0xa3 => rest.get(1..1 + usize::from(*rest.first()?))?,
        0xb3 => {
            let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
            rest.get(4..4 + usize::try_from(len).ok()?)?
        }
        _ => return None,
    };
    code_of_name(name)
}

/// Application properties of any type; keys must be strings (or symbols).
pub(crate) fn application_properties(
    index: usize,
    bytes: &[u8],
) -> Result<Vec<(String, Value)>, DecodeFailure> {
    let Ok(Value::Described(described)) = serde_amqp::from_slice::<Value>(bytes) else {
        return Err(DecodeFailure::new(format!(
            "section {index} (application properties) does not decode"
        )));
    };
    let Value::Map(map) = described.value else {
        return Err(DecodeFailure::new(format!(
            "section {index} (application properties) is not a map"
        )));
    };
    map.into_iter()
        .enumerate()
        .map(|(at, (key, value))| match key {
            Value::String(key) => Ok((key, value)),
            Value::Symbol(key) => Ok((key.0, value)),
            other => Err(DecodeFailure::new(format!(
                "application property {} has a key of type {}, not a string",
                at + 1,
                type_name(&other)
            ))),
        })
        .collect()
}

/// The AMQP name of a value's type, to say what it is without quoting it.
pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Ubyte(_) => "ubyte",
        Value::Ushort(_) => "ushort",
        Value::Uint(_) => "uint",
        Value::Ulong(_) => "ulong",
        Value::Byte(_) => "byte",
        Value::Short(_) => "short",
        Value::Int(_) => "int",
        Value::Long(_) => "long",
        Value::Float(_) => "float",
        Value::Double(_) => "double",
        Value::Decimal32(_) => "decimal32",
        Value::Decimal64(_) => "decimal64",
        Value::Decimal128(_) => "decimal128",
        Value::Char(_) => "char",
        Value::Timestamp(_) => "timestamp",
        Value::Uuid(_) => "uuid",
        Value::Binary(_) => "binary",
        Value::String(_) => "string",
        Value::Symbol(_) => "symbol",
        Value::Described(_) => "described",
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Array(_) => "array",
    }
}

/// The application-properties section holding `properties`, string keys.
pub(crate) fn application_properties_section(properties: &[(String, Value)]) -> Described<Value> {
    let map: OrderedMap<Value, Value> = properties
        .iter()
        .map(|(key, value)| (Value::String(key.clone()), value.clone()))
        .collect();
    Described {
        descriptor: Descriptor::Code(APPLICATION_PROPERTIES),
        value: Value::Map(map),
    }
}

pub(super) fn encode(message: &AmqpMessage) -> Result<Bytes, DecodeFailure> {
    fn put(out: &mut Vec<u8>, section: &impl serde::Serialize) -> Result<(), DecodeFailure> {
        let bytes = serde_amqp::to_vec(section)
            .map_err(|e| DecodeFailure::new(format!("cannot encode the message: {e}")))?;
        out.extend_from_slice(&bytes);
        Ok(())
    }
    let put_unread = |out: &mut Vec<u8>, code: u64| {
        for (_, bytes) in message.unread.iter().filter(|(c, _)| *c == code) {
            out.extend_from_slice(bytes);
        }
    };
    let mut out = Vec::new();
    if let Some(header) = &message.header {
        put(&mut out, header)?;
    }
    if let Some(annotations) = &message.delivery_annotations {
        put(&mut out, annotations)?;
    }
    put_unread(&mut out, DELIVERY_ANNOTATIONS);
    if let Some(annotations) = &message.message_annotations {
        put(&mut out, annotations)?;
    }
    put_unread(&mut out, MESSAGE_ANNOTATIONS);
    if let Some(properties) = &message.properties {
        put(&mut out, properties)?;
    }
    if let Some(application_properties) = &message.application_properties {
        put(
            &mut out,
            &application_properties_section(application_properties),
        )?;
    }
    put(&mut out, &message.body)?;
    if let Some(footer) = &message.footer {
        put(&mut out, footer)?;
    }
    put_unread(&mut out, FOOTER);
    // The encoder has cases it cannot read back (an array of empty lists):
    // what the host could not read itself, it does not publish.
    limits::check(&out, ValueLimits::DEFAULT).map_err(|e| {
        DecodeFailure::new(format!("the message cannot be read back once encoded: {e}"))
    })?;
    Ok(Bytes::from(out))
}
