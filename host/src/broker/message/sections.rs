//! Encoding and decoding a message section by section, for messages the
//! typed `Message` of fe2o3 cannot hold (application properties that are
//! lists, maps, arrays or described values).

use bytes::Bytes;
use fe2o3_amqp::types::messaging::{
    AmqpSequence, AmqpValue, Batch, Body, Data, DeliveryAnnotations, Footer, Header,
    MessageAnnotations, Properties,
};
use fe2o3_amqp::types::primitives::{OrderedMap, Value};
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use serde_amqp::lazy::LazyValue;
use serde_amqp::read::{Read as _, SliceReader};

use super::AmqpMessage;

/// A message that is not AMQP: what is wrong with it, for the
/// `amqp:decode-error` the host rejects it with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeFailure(pub String);

const HEADER: u64 = 0x70;
const DELIVERY_ANNOTATIONS: u64 = 0x71;
const MESSAGE_ANNOTATIONS: u64 = 0x72;
const PROPERTIES: u64 = 0x73;
const APPLICATION_PROPERTIES: u64 = 0x74;
const DATA: u64 = 0x75;
const SEQUENCE: u64 = 0x76;
const VALUE: u64 = 0x77;
const FOOTER: u64 = 0x78;

/// The section codes by their symbolic names, which a sender may use instead.
const NAMES: [(&str, u64); 9] = [
    ("amqp:header:list", HEADER),
    ("amqp:delivery-annotations:map", DELIVERY_ANNOTATIONS),
    ("amqp:message-annotations:map", MESSAGE_ANNOTATIONS),
    ("amqp:properties:list", PROPERTIES),
    ("amqp:application-properties:map", APPLICATION_PROPERTIES),
    ("amqp:data:binary", DATA),
    ("amqp:amqp-sequence:list", SEQUENCE),
    ("amqp:amqp-value:*", VALUE),
    ("amqp:footer:map", FOOTER),
];

pub(super) fn decode(payload: &[u8]) -> Result<AmqpMessage, DecodeFailure> {
    let mut message = AmqpMessage {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: None,
        application_properties: None,
        body: Body::Empty,
        footer: None,
    };
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
            DecodeFailure(format!(
                "section {index} is not a described message section"
            ))
        })?;
        let typed = |what: &'static str| move |e: serde_amqp::Error| failure(index, what, e);
        match code {
            HEADER => {
                message.header = Some(typed_section::<Header>(bytes).map_err(typed("header"))?)
            }
            DELIVERY_ANNOTATIONS => {
                message.delivery_annotations = Some(
                    typed_section::<DeliveryAnnotations>(bytes)
                        .map_err(typed("delivery annotations"))?,
                );
            }
            MESSAGE_ANNOTATIONS => {
                message.message_annotations = Some(
                    typed_section::<MessageAnnotations>(bytes)
                        .map_err(typed("message annotations"))?,
                );
            }
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
            FOOTER => {
                message.footer = Some(typed_section::<Footer>(bytes).map_err(typed("footer"))?);
            }
            other => {
                return Err(DecodeFailure(format!(
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
            return Err(DecodeFailure(
                "the body mixes data, amqp-sequence and amqp-value sections".to_owned(),
            ));
        }
    }
    Ok(message)
}

fn failure(index: usize, what: &str, error: serde_amqp::Error) -> DecodeFailure {
    DecodeFailure(format!("section {index} ({what}) does not decode: {error}"))
}

fn typed_section<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_amqp::Error> {
    serde_amqp::from_slice(bytes)
}

/// The descriptor code of a described section (its symbolic name mapped
/// to the code).
fn section_code(bytes: &[u8]) -> Option<u64> {
    match serde_amqp::from_slice::<Value>(bytes).ok()? {
        Value::Described(described) => match described.descriptor {
            Descriptor::Code(code) => Some(code),
            Descriptor::Name(name) => NAMES
                .iter()
                .find(|(known, _)| *known == name.0)
                .map(|(_, code)| *code),
        },
        _ => None,
    }
}

/// Application properties of any type; keys must be strings (or symbols).
fn application_properties(
    index: usize,
    bytes: &[u8],
) -> Result<Vec<(String, Value)>, DecodeFailure> {
    let Ok(Value::Described(described)) = serde_amqp::from_slice::<Value>(bytes) else {
        return Err(DecodeFailure(format!(
            "section {index} (application properties) does not decode"
        )));
    };
    let Value::Map(map) = described.value else {
        return Err(DecodeFailure(format!(
            "section {index} (application properties) is not a map"
        )));
    };
    map.into_iter()
        .map(|(key, value)| match key {
            Value::String(key) => Ok((key, value)),
            Value::Symbol(key) => Ok((key.0, value)),
            other => Err(DecodeFailure(format!(
                "application property key {other:?} is not a string"
            ))),
        })
        .collect()
}

pub(super) fn encode(message: &AmqpMessage) -> Result<Bytes, DecodeFailure> {
    let mut out = Vec::new();
    let mut put = |encoded: Result<Vec<u8>, serde_amqp::Error>| {
        encoded
            .map(|bytes| out.extend_from_slice(&bytes))
            .map_err(|e| DecodeFailure(format!("cannot encode the message: {e}")))
    };
    if let Some(header) = &message.header {
        put(serde_amqp::to_vec(header))?;
    }
    if let Some(annotations) = &message.delivery_annotations {
        put(serde_amqp::to_vec(annotations))?;
    }
    if let Some(annotations) = &message.message_annotations {
        put(serde_amqp::to_vec(annotations))?;
    }
    if let Some(properties) = &message.properties {
        put(serde_amqp::to_vec(properties))?;
    }
    if let Some(application_properties) = &message.application_properties {
        let map: OrderedMap<Value, Value> = application_properties
            .iter()
            .map(|(key, value)| (Value::String(key.clone()), value.clone()))
            .collect();
        let section = Described {
            descriptor: Descriptor::Code(APPLICATION_PROPERTIES),
            value: Value::Map(map),
        };
        put(serde_amqp::to_vec(&section))?;
    }
    put(serde_amqp::to_vec(&message.body))?;
    if let Some(footer) = &message.footer {
        put(serde_amqp::to_vec(footer))?;
    }
    Ok(Bytes::from(out))
}
