//! Copies made from the bytes a broker delivered. Whatever a broker
//! delivers can be copied: the sections a copy keeps travel as they
//! arrived, and the two it changes (message annotations, application
//! properties) are edited entry by entry, each entry it keeps left as it
//! arrived. Nothing is decoded and encoded again, so a value the encoder
//! cannot write back (an array of empty lists) still reaches the copy.

use std::time::SystemTime;

use bytes::Bytes;
use fe2o3_amqp_types::messaging::Header;
use fe2o3_amqp_types::primitives::Value;

use super::codes::{self, APPLICATION_PROPERTIES, MESSAGE_ANNOTATIONS};
use super::limits::{self, ValueLimits};
use super::{
    ARTEMIS_DUPLICATE_ID, AmqpMessage, DELIVERY_TIME_ANNOTATION, DecodeFailure,
    NOT_COPIED_ANNOTATIONS, RETRY_SEAL_PROPERTY, copy_duplicate_id, reserved_property,
};
use crate::retry_key::RetryKey;
use crate::settlement::RETRY_COUNT_PROPERTY;
use crate::trace::{self, TraceContext};

/// What a copy changes of the delivery it copies.
#[derive(Clone, Copy, Default)]
pub struct CopyOf<'a> {
    /// Its retry count.
    pub retry_count: u32,
    /// When a broker that schedules messages should deliver it.
    pub due: Option<SystemTime>,
    /// The trace context it carries in place of the original's.
    pub trace: Option<&'a TraceContext>,
    /// The key its retry count is sealed with.
    pub seal: Option<&'a RetryKey>,
}

/// The copy of `payload`, a delivery as it arrived and decoded as
/// `message`, that [`AmqpMessage::copy`] describes: the header with its
/// delivery count at zero, the message annotations and application
/// properties edited, the properties and body sections byte for byte as
/// they arrived, no delivery annotations, no footer. A payload whose
/// sections cannot be found by their numeric descriptors is copied through
/// its decoded form instead.
pub fn copy_payload(
    payload: &[u8],
    message: &AmqpMessage,
    of: CopyOf<'_>,
) -> Result<Bytes, DecodeFailure> {
    match from_bytes(payload, message, of) {
        Some(copy) => Ok(copy),
        None => {
            let mut copy = message.copy(of.retry_count, of.due);
            if let Some(trace) = of.trace {
                copy.set_trace(trace);
            }
            if let Some(key) = of.seal {
                copy.seal_retry_count(key);
            }
            copy.encode()
        }
    }
}

fn from_bytes(payload: &[u8], message: &AmqpMessage, of: CopyOf<'_>) -> Option<Bytes> {
    let found = limits::sections(payload)?;
    let section = |code: u64| {
        found
            .iter()
            .find(|(found, _)| *found == code)
            .map(|(_, range)| &payload[range.clone()])
    };
    let mut out = Vec::with_capacity(payload.len() + 128);
    if let Some(header) = &message.header {
        let header = Header {
            delivery_count: 0,
            first_acquirer: false,
            ..header.clone()
        };
        out.extend_from_slice(&serde_amqp::to_vec(&header).ok()?);
    }
    // Annotations: the producer's scheduling, the broker's counters and
    // the trace context stay behind; the copy's own due time is added.
    let mut annotations = Vec::new();
    if let Some(due) = of.due {
        let mut scheduled = AmqpMessage::empty();
        scheduled.schedule(due);
        let at = scheduled
            .message_annotations
            .and_then(|a| a.0.into_iter().next())
            .map(|(_, value)| value)?;
        annotations.push((Value::Symbol(DELIVERY_TIME_ANNOTATION.into()), at));
    }
    let dropped_annotation = |key: &Value| match key {
        Value::Symbol(symbol) => {
            NOT_COPIED_ANNOTATIONS.contains(&symbol.0.as_str())
                || (of.trace.is_some() && trace::CONTEXT_ANNOTATIONS.contains(&symbol.0.as_str()))
        }
        _ => false,
    };
    // Annotations that are not a map of entries stay behind, as a broker's
    // unreadable history does on a decoded copy.
    let existing = section(MESSAGE_ANNOTATIONS).filter(|s| map_entries(s).is_some());
    if let Some(edited) = edit_map(
        existing,
        MESSAGE_ANNOTATIONS,
        dropped_annotation,
        &annotations,
    )? {
        out.extend_from_slice(&edited);
    }
    if let Some(properties) = section(codes::PROPERTIES) {
        out.extend_from_slice(properties);
    }
    // Application properties: the retry count (sealed), the duplicate id
    // and the trace context are the copy's own; the broker's reserved
    // ones stay behind.
    let mut added = vec![(
        Value::String(RETRY_COUNT_PROPERTY.to_owned()),
        Value::Uint(of.retry_count),
    )];
    if let Some(original) = message.property(ARTEMIS_DUPLICATE_ID) {
        added.push((
            Value::String(ARTEMIS_DUPLICATE_ID.to_owned()),
            Value::String(copy_duplicate_id(original, of.retry_count)),
        ));
    }
    if let Some(context) = of.trace {
        for (key, value) in trace::context_properties(context) {
            added.push((Value::String(key), value));
        }
    }
    if let Some(key) = of.seal {
        added.push((
            Value::String(RETRY_SEAL_PROPERTY.to_owned()),
            Value::String(message.retry_seal(key, of.retry_count)),
        ));
    }
    let dropped_property = |key: &Value| {
        let key = match key {
            Value::String(key) => key.as_str(),
            Value::Symbol(key) => key.0.as_str(),
            _ => return false,
        };
        key == RETRY_COUNT_PROPERTY
            || key == RETRY_SEAL_PROPERTY
            || reserved_property(key)
            || (of.trace.is_some() && trace::CONTEXT_PROPERTIES.contains(&key))
    };
    let properties = edit_map(
        section(APPLICATION_PROPERTIES),
        APPLICATION_PROPERTIES,
        dropped_property,
        &added,
    )??;
    out.extend_from_slice(&properties);
    for (code, range) in &found {
        if codes::is_body(*code) {
            out.extend_from_slice(&payload[range.clone()]);
        }
    }
    Some(Bytes::from(out))
}

/// A map section (`code`) with the entries whose keys `dropped` names
/// taken out and `added` put at its end, every other entry byte for byte
/// as it was; a section only `added` fills when there was none. `Some(None)`
/// when no entry is left; `None` when `section` is not a map section.
fn edit_map(
    section: Option<&[u8]>,
    code: u64,
    dropped: impl Fn(&Value) -> bool,
    added: &[(Value, Value)],
) -> Option<Option<Vec<u8>>> {
    let (descriptor, entries) = match section {
        Some(section) => map_entries(section)?,
        None => (vec![0x00, 0x53, u8::try_from(code).ok()?], Vec::new()),
    };
    let mut content = Vec::new();
    let mut count: u32 = 0;
    for (key, value) in entries {
        // A key that does not read as a value on its own is none of those
        // dropped (they are symbols and strings): it stays as it was.
        let decoded: Option<Value> = serde_amqp::from_slice(key).ok();
        if decoded.is_some_and(|key| dropped(&key)) {
            continue;
        }
        content.extend_from_slice(key);
        content.extend_from_slice(value);
        count += 2;
    }
    for (key, value) in added {
        content.extend_from_slice(&serde_amqp::to_vec(key).ok()?);
        content.extend_from_slice(&serde_amqp::to_vec(value).ok()?);
        count += 2;
    }
    if count == 0 {
        return Some(None);
    }
    let size = u32::try_from(content.len() + 4).ok()?;
    let mut out = descriptor;
    out.push(0xd1);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&content);
    Some(Some(out))
}

/// A map section's descriptor bytes and its entries' key and value bytes.
#[allow(clippy::type_complexity, reason = "read once, right below")]
fn map_entries(section: &[u8]) -> Option<(Vec<u8>, Vec<(&[u8], &[u8])>)> {
    let inner = section.strip_prefix(&[0x00])?;
    let parts = limits::check(inner, ValueLimits::DEFAULT).ok()?;
    let [descriptor, value] = parts.as_slice() else {
        return None;
    };
    let value = &inner[value.clone()];
    let content = match value.first()? {
        0x40 => &[][..],
        0xc1 => value.get(3..)?,
        0xd1 => value.get(9..)?,
        _ => return None,
    };
    let ranges = limits::check(content, ValueLimits::DEFAULT).ok()?;
    if ranges.len() % 2 != 0 {
        return None;
    }
    let entries = ranges
        .chunks(2)
        .map(|pair| (&content[pair[0].clone()], &content[pair[1].clone()]))
        .collect();
    Some((section[..1 + descriptor.end].to_vec(), entries))
}
