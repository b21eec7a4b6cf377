//! W3C trace context on AMQP messages: read from wherever a publisher's
//! client put it, and carried on, one new span id per hop, on everything
//! wharf publishes because of a delivery (copies, outputs, replies), so one
//! message's attempts and what it caused read as one trace.
//!
//! Publishers write the context in four places; the first one found wins:
//! 1. message annotations `traceparent` / `tracestate`;
//! 2. the message-annotation map `x-opt-qpid-tracestate` (Qpid Proton C++
//!    and Qpid JMS), with `traceparent` / `tracestate` inside;
//! 3. application properties `traceparent` / `tracestate`, as string or
//!    binary (the W3C AMQP draft, w3c/trace-context-amqp);
//! 4. application property `Diagnostic-Id` (Azure SDKs, in the
//!    `traceparent` format).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::sampler::SAMPLED;

pub mod keys;

pub use keys::{DIAGNOSTIC_ID, QPID_TRACESTATE, TRACEPARENT, TRACESTATE};

use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::primitives::{Symbol, Value};

use crate::message::{AmqpMessage, Property, PropertyValue};

/// The longest `tracestate` carried on (the W3C limit is 32 entries of at
/// most 256 characters; 512 is what implementations must propagate).
const MAX_TRACESTATE: usize = 512;

/// One span's place in a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace, never all zero.
    pub trace_id: [u8; 16],
    /// The span, never all zero.
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
    /// The vendors' `tracestate`, carried on unchanged.
    pub state: Option<String>,
}

/// A context that was there but could not be read: ignored, and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// Where it was found.
    pub place: &'static str,
}

impl TraceContext {
    /// Reads a `traceparent` header value: `00-<trace>-<span>-<flags>` in
    /// lowercase hex. A later version may append fields after the flags;
    /// version `ff` and all-zero ids are invalid.
    pub fn parse(traceparent: &str) -> Option<TraceContext> {
        let text = traceparent.trim();
        let mut parts = text.splitn(5, '-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();
        let [version] = hex::<1>(version)?;
        if version == 0xff || (version == 0 && rest.is_some()) {
            return None;
        }
        let trace_id = hex::<16>(trace)?;
        let span_id = hex::<8>(span)?;
        let [flags] = hex::<1>(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
            state: None,
        })
    }

    /// The `traceparent` value, version `00`.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id);
        out.push('-');
        push_hex(&mut out, &self.span_id);
        out.push('-');
        push_hex(&mut out, &[self.flags]);
        out
    }

    /// The trace id in hex, as logs and trace viewers show it.
    pub fn trace_id_hex(&self) -> String {
        Hex(&self.trace_id).to_string()
    }

    /// The span id in hex.
    pub fn span_id_hex(&self) -> String {
        Hex(&self.span_id).to_string()
    }

    /// The first span of a new trace, with `flags`.
    pub fn root(flags: u8) -> TraceContext {
        let (high, low) = (new_span_id(), new_span_id());
        let mut trace_id = [0; 16];
        trace_id[..8].copy_from_slice(&high);
        trace_id[8..].copy_from_slice(&low);
        TraceContext {
            trace_id,
            span_id: new_span_id(),
            flags,
            state: None,
        }
    }

    /// Whether the trace is recorded (its sampled flag).
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// A new span in the same trace, below this one: the same trace id,
    /// flags and state, a span id of its own.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: new_span_id(),
            ..self.clone()
        }
    }

    /// The publisher's context on `message`, from the first of the four
    /// places that has one (see the module's documentation); `Ok(None)`
    /// when none has, `Err` when the first one found cannot be read.
    pub fn of(message: &AmqpMessage) -> Result<Option<TraceContext>, Malformed> {
        let annotation = |key: &str| {
            message
                .message_annotations
                .as_ref()?
                .0
                .get(&OwnedKey::Symbol(Symbol::from(key)))
        };
        let found = if let Some(parent) = annotation(TRACEPARENT) {
            Some((
                "message annotation `traceparent`",
                text(parent),
                annotation(TRACESTATE).and_then(text),
            ))
        } else if let Some(Value::Map(map)) = annotation(QPID_TRACESTATE) {
            let entry = |key: &str| {
                map.iter()
                    .find(|(k, _)| text(k).as_deref() == Some(key))
                    .map(|(_, v)| v)
            };
            entry(TRACEPARENT).map(|parent| {
                (
                    "message annotation `x-opt-qpid-tracestate`",
                    text(parent),
                    entry(TRACESTATE).and_then(text),
                )
            })
        } else {
            None
        };
        let found = found.or_else(|| {
            message.property(TRACEPARENT).map(|parent| {
                (
                    "application property `traceparent`",
                    text(parent),
                    message.property(TRACESTATE).and_then(text),
                )
            })
        });
        let found = found.or_else(|| {
            message
                .property(DIAGNOSTIC_ID)
                .map(|id| ("application property `Diagnostic-Id`", text(id), None))
        });
        let Some((place, parent, state)) = found else {
            return Ok(None);
        };
        let mut context = parent
            .as_deref()
            .and_then(TraceContext::parse)
            .ok_or(Malformed { place })?;
        context.state = state
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.is_ascii());
        Ok(Some(context))
    }
}

impl AmqpMessage {
    /// Carries `context` on this message as the W3C AMQP draft has it:
    /// string application properties `traceparent` (and `tracestate`).
    /// Every other form of a context the message held is removed, so the
    /// next reader finds this one first.
    pub fn set_trace(&mut self, context: &TraceContext) {
        if let Some(annotations) = self.message_annotations.as_mut() {
            annotations
                .0
                .as_inner_mut()
                .retain(|key, _| !context_annotation(key));
            if annotations.0.is_empty() {
                self.message_annotations = None;
            }
        }
        carry(
            self.application_properties.get_or_insert_with(Vec::new),
            context,
        );
    }
}

/// A delivery's application properties as its handler gets them, with
/// `context` (its handling's) as `traceparent` and `tracestate` in place
/// of whatever form of context the publisher sent, so a handler's own
/// telemetry joins the trace below the handling.
pub fn show_to_handler(properties: &mut Vec<Property>, context: &TraceContext) {
    properties.retain(|p| ![TRACEPARENT, TRACESTATE, DIAGNOSTIC_ID].contains(&p.key.as_str()));
    properties.push(Property {
        key: TRACEPARENT.to_owned(),
        value: PropertyValue::String(context.traceparent()),
    });
    if let Some(state) = &context.state {
        properties.push(Property {
            key: TRACESTATE.to_owned(),
            value: PropertyValue::String(state.clone()),
        });
    }
}

/// The application properties a form of trace context travels in.
pub(crate) const CONTEXT_PROPERTIES: [&str; 3] = [TRACEPARENT, TRACESTATE, DIAGNOSTIC_ID];

/// The message annotations a form of trace context travels in.
pub(crate) const CONTEXT_ANNOTATIONS: [&str; 3] = [TRACEPARENT, TRACESTATE, QPID_TRACESTATE];

/// The application properties that carry `context`.
pub(crate) fn context_properties(context: &TraceContext) -> Vec<(String, Value)> {
    let mut properties = vec![(TRACEPARENT.to_owned(), Value::String(context.traceparent()))];
    if let Some(state) = &context.state {
        properties.push((TRACESTATE.to_owned(), Value::String(state.clone())));
    }
    properties
}

/// Puts `context` in application properties, in place of any context
/// they held.
fn carry(properties: &mut Vec<(String, Value)>, context: &TraceContext) {
    properties.retain(|(key, _)| !CONTEXT_PROPERTIES.contains(&key.as_str()));
    properties.extend(context_properties(context));
}

/// Whether a message annotation holds a form of trace context.
fn context_annotation(key: &OwnedKey) -> bool {
    match key {
        OwnedKey::Symbol(symbol) => CONTEXT_ANNOTATIONS.contains(&symbol.0.as_str()),
        OwnedKey::Ulong(_) => false,
    }
}

/// `payload`, a message as it arrived, carrying `context` in its
/// application properties (replacing the `traceparent`, `tracestate` and
/// `Diagnostic-Id` it held there, and dropping the forms of context its
/// message annotations held, which a reader would find first); every other
/// section stays byte for byte as it was. `None` when the payload's
/// sections cannot be found, or the sections to change cannot be read
/// within the limits (then it must travel as it is).
pub fn carried_on_payload(payload: &[u8], context: &TraceContext) -> Option<bytes::Bytes> {
    use crate::message::codes::APPLICATION_PROPERTIES;
    use crate::message::limits::{self, ValueLimits};
    use crate::message::sections::{application_properties, application_properties_section};

    let payload = crate::message::with_annotations(payload, |annotations| {
        let before = annotations.0.len();
        annotations
            .0
            .as_inner_mut()
            .retain(|key, _| !context_annotation(key));
        annotations.0.len() != before
    })?;
    let payload = &payload[..];
    let sections = limits::sections(payload)?;
    let mut properties = match sections
        .iter()
        .enumerate()
        .find(|(_, (code, _))| *code == APPLICATION_PROPERTIES)
    {
        Some((index, (_, range))) => {
            let bytes = &payload[range.clone()];
            limits::check(bytes, ValueLimits::DEFAULT).ok()?;
            application_properties(index, bytes).ok()?
        }
        None => Vec::new(),
    };
    carry(&mut properties, context);
    let encoded = serde_amqp::to_vec(&application_properties_section(&properties)).ok()?;
    Some(crate::message::with_section(
        payload,
        &sections,
        APPLICATION_PROPERTIES,
        &encoded,
    ))
}

/// A string or binary value as text.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Symbol(s) => Some(s.0.clone()),
        Value::Binary(b) => String::from_utf8(b.to_vec()).ok(),
        _ => None,
    }
}

/// `N` bytes from exactly `2 * N` lowercase hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = nibble(digits[2 * i])? << 4 | nibble(digits[2 * i + 1])?;
    }
    Some(out)
}

/// Bytes shown in lowercase hex (an id in a log line), written without
/// a string of their own.
pub struct Hex<'a>(pub &'a [u8]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut digits = [0; 32];
        for chunk in self.0.chunks(16) {
            for (pair, byte) in digits.chunks_exact_mut(2).zip(chunk) {
                pair.copy_from_slice(&hex_pair(*byte));
            }
            let text =
                std::str::from_utf8(&digits[..2 * chunk.len()]).map_err(|_| std::fmt::Error)?;
            f.write_str(text)?;
        }
        Ok(())
    }
}

/// Appends `bytes` in lowercase hex: on every delivery's path, so without
/// the formatting machinery.
fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        let [high, low] = hex_pair(*byte);
        out.push(char::from(high));
        out.push(char::from(low));
    }
}

/// A byte's two lowercase hex digits.
fn hex_pair(byte: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 0x0f)],
    ]
}

/// A span id no other span of this process has: a counter through a
/// SplitMix64 mix, started from the clock and the process id, so two
/// processes (and two runs) do not walk the same ids.
pub fn new_span_id() -> [u8; 8] {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 32)
    });
    loop {
        let mut z = seed.wrapping_add(
            NEXT.fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z != 0 {
            return z.to_be_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::{Body, MessageAnnotations};
    use fe2o3_amqp_types::primitives::{Binary, OrderedMap};

    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn annotated(key: &str, value: Value) -> AmqpMessage {
        let mut annotations = MessageAnnotations::builder().build();
        annotations
            .0
            .insert(OwnedKey::Symbol(Symbol::from(key)), value);
        AmqpMessage {
            message_annotations: Some(annotations),
            ..AmqpMessage::empty()
        }
    }

    fn with_property(key: &str, value: Value) -> AmqpMessage {
        AmqpMessage {
            application_properties: Some(vec![(key.to_owned(), value)]),
            ..AmqpMessage::empty()
        }
    }

    #[test]
    fn hex_shows_every_byte_of_any_length() {
        assert_eq!(Hex(&[]).to_string(), "");
        assert_eq!(Hex(&[0x0f, 0xa0]).to_string(), "0fa0");
        let bytes: Vec<u8> = (0..=20).collect();
        let mut expected = String::new();
        push_hex(&mut expected, &bytes);
        assert_eq!(Hex(&bytes).to_string(), expected);
        assert_eq!(expected.len(), 42);
    }

    #[test]
    fn a_traceparent_reads_and_writes_back_the_same() {
        let context = TraceContext::parse(PARENT).expect("valid");
        assert_eq!(context.traceparent(), PARENT);
        assert_eq!(context.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(context.flags, 1);
        // A later version may add fields; 00 may not.
        assert!(
            TraceContext::parse("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x")
                .is_some()
        );
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_form_a_client_writes_is_read() {
        let state = Value::String("congo=t61rcWkgMzE".to_owned());
        let mut qpid = OrderedMap::new();
        qpid.insert(
            Value::Symbol(Symbol::from(TRACEPARENT)),
            Value::String(PARENT.to_owned()),
        );
        qpid.insert(Value::Symbol(Symbol::from(TRACESTATE)), state.clone());
        let forms = [
            annotated(TRACEPARENT, Value::String(PARENT.to_owned())),
            annotated(QPID_TRACESTATE, Value::Map(qpid)),
            with_property(TRACEPARENT, Value::String(PARENT.to_owned())),
            with_property(
                TRACEPARENT,
                Value::Binary(Binary::from(PARENT.as_bytes().to_vec())),
            ),
            with_property(DIAGNOSTIC_ID, Value::String(PARENT.to_owned())),
        ];
        for form in &forms {
            let context = TraceContext::of(form).expect("readable").expect("found");
            assert_eq!(context.traceparent(), PARENT);
        }
        let read = TraceContext::of(&forms[1])
            .expect("readable")
            .expect("found");
        assert_eq!(read.state.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(TraceContext::of(&AmqpMessage::empty()), Ok(None));
        let malformed = with_property(TRACEPARENT, Value::String("00-nope".to_owned()));
        assert!(TraceContext::of(&malformed).is_err());
        let not_text = with_property(TRACEPARENT, Value::Int(7));
        assert!(TraceContext::of(&not_text).is_err());
    }

    #[test]
    fn the_first_form_found_wins_and_a_carried_context_replaces_them_all() {
        let other = "00-11111111111111111111111111111111-2222222222222222-00";
        let mut message = annotated(TRACEPARENT, Value::String(PARENT.to_owned()));
        message.application_properties = Some(vec![(
            TRACEPARENT.to_owned(),
            Value::String(other.to_owned()),
        )]);
        let found = TraceContext::of(&message)
            .expect("readable")
            .expect("found");
        assert_eq!(found.traceparent(), PARENT);
        let child = found.child();
        assert_eq!(child.trace_id, found.trace_id);
        assert_ne!(child.span_id, found.span_id);
        message.set_trace(&child);
        assert_eq!(message.message_annotations, None);
        let carried = TraceContext::of(&message)
            .expect("readable")
            .expect("found");
        assert_eq!(carried, child);
    }

    #[test]
    fn a_messages_identity_does_not_depend_on_its_trace_context() {
        let context = TraceContext::parse(PARENT).expect("valid");
        let mut first = with_property("k", Value::String("v".to_owned()));
        let mut second = first.clone();
        first.set_trace(&context.child());
        second.set_trace(&context.child());
        assert_ne!(first, second);
        assert_eq!(first.identity(), second.identity());
    }

    #[test]
    fn a_payload_carries_a_context_with_its_other_sections_unchanged() {
        let context = TraceContext::parse(PARENT).expect("valid").child();
        let mut original = annotated("x-opt-other", Value::String("kept".to_owned()));
        original.application_properties = Some(vec![
            ("k".to_owned(), Value::Int(7)),
            (TRACEPARENT.to_owned(), Value::String("00-nope".to_owned())),
        ]);
        original.body = Body::Value(fe2o3_amqp_types::messaging::AmqpValue(Value::String(
            "body".to_owned(),
        )));
        let payload = original.encode().expect("encodes");
        let carried = carried_on_payload(&payload, &context).expect("carried");
        let read = AmqpMessage::decode(&carried).expect("decodes");
        assert_eq!(TraceContext::of(&read), Ok(Some(context.clone())));
        assert_eq!(read.property("k"), Some(&Value::Int(7)));
        assert_eq!(read.body, original.body);
        assert_eq!(read.message_annotations, original.message_annotations);
        // Without application properties, the section is added before
        // the body.
        let bare = AmqpMessage::empty();
        let carried =
            carried_on_payload(&bare.encode().expect("encodes"), &context).expect("carried");
        let read = AmqpMessage::decode(&carried).expect("decodes");
        assert_eq!(TraceContext::of(&read), Ok(Some(context)));
    }

    #[test]
    fn a_payload_whose_annotations_held_the_context_loses_them_for_the_new_one() {
        let context = TraceContext::parse(PARENT).expect("valid").child();
        let mut original = annotated(TRACEPARENT, Value::String(PARENT.to_owned()));
        original
            .message_annotations
            .as_mut()
            .expect("annotations")
            .0
            .insert(
                OwnedKey::Symbol(Symbol::from("x-opt-other")),
                Value::String("kept".to_owned()),
            );
        let payload = original.encode().expect("encodes");
        let carried = carried_on_payload(&payload, &context).expect("carried");
        let read = AmqpMessage::decode(&carried).expect("decodes");
        assert_eq!(TraceContext::of(&read), Ok(Some(context)));
        let annotations = read.message_annotations.expect("the others stay");
        assert_eq!(annotations.0.len(), 1);
    }

    #[test]
    fn the_handler_sees_the_handlings_context_in_place_of_the_publishers() {
        let handling =
            TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01")
                .expect("a context");
        let mut properties = vec![
            Property {
                key: "kept".to_owned(),
                value: PropertyValue::String("yes".to_owned()),
            },
            Property {
                key: DIAGNOSTIC_ID.to_owned(),
                value: PropertyValue::String(PARENT.to_owned()),
            },
        ];
        show_to_handler(&mut properties, &handling);
        let keys: Vec<&str> = properties.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["kept", TRACEPARENT]);
        assert_eq!(
            properties[1].value,
            PropertyValue::String(handling.traceparent())
        );
    }

    #[test]
    fn span_ids_do_not_repeat() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
