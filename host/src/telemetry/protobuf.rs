//! OTLP's protobuf messages, written straight from what wharf records.
//!
//! A span is encoded as it is recorded, into a buffer of its own; when it
//! ends its bytes are copied into the batch being filled, and a request
//! is a batch framed by the envelope. Going through the
//! SDK's span type and the generated messages instead cost more than the
//! handling of an `ack` (a `String` per attribute, twice, and a grouping
//! by resource and scope per batch).
//!
//! Field numbers: `opentelemetry/proto/trace/v1/trace.proto`,
//! `common/v1/common.proto`, `resource/v1/resource.proto`.

use opentelemetry::trace::SpanKind;
use opentelemetry::{Array, Value};

use wharf_core::trace::TraceContext;

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LENGTH_DELIMITED: u32 = 2;
const FIXED32: u32 = 5;

/// The span flags' "whether the parent is remote is known" bit.
const HAS_IS_REMOTE: u32 = 0x100;
/// The span flags' "the parent is remote" bit.
const IS_REMOTE: u32 = 0x200;

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    tag(out, field, LENGTH_DELIMITED);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    tag(out, field, FIXED64);
    out.extend_from_slice(&value.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, value: u32) {
    tag(out, field, FIXED32);
    out.extend_from_slice(&value.to_le_bytes());
}

fn number(out: &mut Vec<u8>, field: u32, value: u64) {
    tag(out, field, VARINT);
    varint(out, value);
}

/// A message in field `field`, written by `write`: its length is known
/// only afterwards, so one byte is kept for it and widened when short.
fn nested(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, LENGTH_DELIMITED);
    let at = out.len();
    out.push(0);
    write(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut prefix = Vec::with_capacity(4);
        varint(&mut prefix, len as u64);
        out.splice(at..=at, prefix);
    }
}

/// A value a span attribute can take.
pub trait Attribute {
    /// Writes the `AnyValue` message's one field.
    fn any_value(&self, out: &mut Vec<u8>);
}

/// The longest text a span keeps: a handler's error or the URL it asked
/// for is its own to make long, and a queued span holds it on the host.
const MAX_TEXT: usize = 4096;

/// `text`, cut at [`MAX_TEXT`] bytes (on a character boundary).
fn capped(text: &str) -> &str {
    &text[..text.floor_char_boundary(MAX_TEXT)]
}

impl Attribute for &str {
    fn any_value(&self, out: &mut Vec<u8>) {
        bytes(out, 1, capped(self).as_bytes());
    }
}

impl Attribute for String {
    fn any_value(&self, out: &mut Vec<u8>) {
        self.as_str().any_value(out);
    }
}

impl Attribute for &String {
    fn any_value(&self, out: &mut Vec<u8>) {
        self.as_str().any_value(out);
    }
}

impl Attribute for bool {
    fn any_value(&self, out: &mut Vec<u8>) {
        number(out, 2, u64::from(*self));
    }
}

impl Attribute for i64 {
    fn any_value(&self, out: &mut Vec<u8>) {
        number(out, 3, *self as u64);
    }
}

impl Attribute for Value {
    fn any_value(&self, out: &mut Vec<u8>) {
        match self {
            Value::Bool(value) => value.any_value(out),
            Value::I64(value) => value.any_value(out),
            Value::F64(value) => fixed64(out, 4, value.to_bits()),
            Value::String(value) => value.as_str().any_value(out),
            Value::Array(array) => nested(out, 5, |out| {
                let values: Vec<Value> = match array {
                    Array::Bool(v) => v.iter().map(|&x| Value::Bool(x)).collect(),
                    Array::I64(v) => v.iter().map(|&x| Value::I64(x)).collect(),
                    Array::F64(v) => v.iter().map(|&x| Value::F64(x)).collect(),
                    Array::String(v) => v.iter().map(|x| Value::String(x.clone())).collect(),
                    other => vec![Value::String(other.to_string().into())],
                };
                for value in values {
                    nested(out, 1, |out| value.any_value(out));
                }
            }),
            other => other.as_str().as_ref().any_value(out),
        }
    }
}

/// A `KeyValue` in field `field`.
pub fn attribute(out: &mut Vec<u8>, field: u32, key: &str, value: &impl Attribute) {
    nested(out, field, |out| {
        bytes(out, 1, key.as_bytes());
        nested(out, 2, |out| value.any_value(out));
    });
}

/// A span's attribute: `Span.attributes` is field 9.
pub fn span_attribute(out: &mut Vec<u8>, key: &str, value: &impl Attribute) {
    attribute(out, 9, key, value);
}

/// The fields a span has from its start: ids, name, kind, start time and
/// flags (the parent's remoteness is what the flags' upper bits say).
pub fn span_start(
    out: &mut Vec<u8>,
    context: &TraceContext,
    parent: Option<(&TraceContext, bool)>,
    name: std::fmt::Arguments<'_>,
    kind: &SpanKind,
    start_nanos: u64,
) {
    bytes(out, 1, &context.trace_id);
    bytes(out, 2, &context.span_id);
    if let Some(state) = context.state.as_deref().filter(|s| !s.is_empty()) {
        bytes(out, 3, state.as_bytes());
    }
    if let Some((parent, _)) = parent {
        bytes(out, 4, &parent.span_id);
    }
    nested(out, 5, |out| {
        let start = out.len();
        // Writing to a `Vec` cannot fail.
        let _ = std::io::Write::write_fmt(out, name);
        let written = std::str::from_utf8(&out[start..]).map_or(0, |name| capped(name).len());
        out.truncate(start + written);
    });
    let kind = match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    number(out, 6, kind);
    fixed64(out, 7, start_nanos);
    let remote = parent.is_some_and(|(_, remote)| remote);
    fixed32(out, 16, span_flags(context.flags, remote));
}

fn span_flags(trace_flags: u8, remote: bool) -> u32 {
    u32::from(trace_flags) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

/// A link to `to`, another process's span (`Span.links` is field 13).
pub fn span_link(out: &mut Vec<u8>, to: &TraceContext) {
    nested(out, 13, |out| {
        bytes(out, 1, &to.trace_id);
        bytes(out, 2, &to.span_id);
        if let Some(state) = to.state.as_deref().filter(|s| !s.is_empty()) {
            bytes(out, 3, state.as_bytes());
        }
        fixed32(out, 6, span_flags(to.flags, true));
    });
}

/// An error status with `description` (`Span.status` is field 15).
pub fn span_error(out: &mut Vec<u8>, description: &str) {
    nested(out, 15, |out| {
        if !description.is_empty() {
            bytes(out, 2, capped(description).as_bytes());
        }
        number(out, 3, 2);
    });
}

/// The span's end time.
pub fn span_end(out: &mut Vec<u8>, end_nanos: u64) {
    fixed64(out, 8, end_nanos);
}

/// A `Resource` or an `InstrumentationScope` message's fields.
pub fn resource(attributes: impl IntoIterator<Item = (String, Value)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in attributes {
        attribute(&mut out, 1, &key, &value);
    }
    out
}

/// An `InstrumentationScope` named `name` at `version`.
pub fn scope(name: &str, version: &str) -> Vec<u8> {
    let mut out = Vec::new();
    bytes(&mut out, 1, name.as_bytes());
    bytes(&mut out, 2, version.as_bytes());
    out
}

/// Appends `span`, the fields of one `Span` message, to `spans` as a
/// `ScopeSpans` message's span field.
pub fn add_span(spans: &mut Vec<u8>, span: &[u8]) {
    bytes(spans, 2, span);
}

/// The most bytes [`envelope`] writes: `prefix` bytes of room (gRPC's
/// message header), then the fields around the spans.
pub fn envelope_room(resource: &[u8], scope: &[u8], prefix: usize) -> usize {
    const LONGEST_VARINT: usize = 10;
    prefix + 2 * (1 + LONGEST_VARINT) + framed(resource.len()) + framed(scope.len())
}

/// Makes `batch` an `ExportTraceServiceRequest` of one resource and scope
/// without copying its spans: they follow `room` bytes (at least
/// [`envelope_room`]) that the envelope is written into, ending where the
/// spans start. Returns where the request (its prefix first) starts.
pub fn envelope(
    batch: &mut [u8],
    room: usize,
    resource: &[u8],
    scope: &[u8],
    prefix: usize,
) -> usize {
    let scope_spans_len = framed(scope.len()) + batch.len() - room;
    let resource_spans_len = framed(resource.len()) + framed(scope_spans_len);
    let mut head = Vec::with_capacity(room);
    head.resize(prefix, 0);
    tag(&mut head, 1, LENGTH_DELIMITED);
    varint(&mut head, resource_spans_len as u64);
    bytes(&mut head, 1, resource);
    tag(&mut head, 2, LENGTH_DELIMITED);
    varint(&mut head, scope_spans_len as u64);
    bytes(&mut head, 1, scope);
    let start = room - head.len();
    batch[start..room].copy_from_slice(&head);
    start
}

/// The bytes of a length-delimited field of `len` bytes with a one-byte
/// tag.
fn framed(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;

    fn context(span: u8, state: Option<&str>) -> TraceContext {
        TraceContext {
            trace_id: [7; 16],
            span_id: [span; 8],
            flags: 1,
            state: state.map(str::to_owned),
        }
    }

    #[test]
    fn varints_take_the_bytes_they_are_counted_at() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value), "{value}");
            assert_eq!(
                prost::encoding::decode_varint(&mut &out[..]).ok(),
                Some(value)
            );
        }
    }

    #[test]
    fn a_batch_decodes_as_the_generated_messages_read_it() {
        let parent = context(1, None);
        let mut span = Vec::new();
        span_start(
            &mut span,
            &context(2, Some("v=1")),
            Some((&parent, true)),
            format_args!("process {}", "q"),
            &SpanKind::Consumer,
            10,
        );
        span_attribute(&mut span, "s", &"text");
        span_attribute(&mut span, "long", &"x".repeat(300));
        span_attribute(&mut span, "i", &-5i64);
        span_attribute(&mut span, "b", &true);
        span_attribute(&mut span, "huge", &format!("x{}", "é".repeat(3000)));
        span_link(&mut span, &context(3, None));
        span_error(&mut span, "it trapped");
        span_end(&mut span, 20);
        let mut root = Vec::new();
        span_start(
            &mut root,
            &parent,
            None,
            format_args!("send q"),
            &SpanKind::Producer,
            5,
        );
        span_end(&mut root, 6);
        let resource = resource([
            ("service.name".to_owned(), Value::from("wharf")),
            ("n".to_owned(), Value::F64(1.5)),
            ("list".to_owned(), Value::Array(Array::I64(vec![1, 2]))),
        ]);
        let scope = scope("wharf", "1.0");
        let room = envelope_room(&resource, &scope, 5);
        let mut batch = vec![9; room];
        for _ in 0..200 {
            add_span(&mut batch, &span);
        }
        add_span(&mut batch, &root);
        let start = envelope(&mut batch, room, &resource, &scope, 5);
        assert_eq!(&batch[start..start + 5], &[0; 5]);
        let decoded = ExportTraceServiceRequest::decode(&batch[start + 5..]).expect("decodes");

        let resource_spans = &decoded.resource_spans[0];
        let attributes = &resource_spans
            .resource
            .as_ref()
            .expect("a resource")
            .attributes;
        assert_eq!(attributes.len(), 3);
        assert_eq!(
            attributes[1].value.as_ref().and_then(|v| v.value.clone()),
            Some(Any::DoubleValue(1.5))
        );
        let scope_spans = &resource_spans.scope_spans[0];
        assert_eq!(
            scope_spans.scope.as_ref().map(|s| s.version.as_str()),
            Some("1.0")
        );
        assert_eq!(scope_spans.spans.len(), 201);
        let span = &scope_spans.spans[0];
        assert_eq!(span.trace_id, vec![7; 16]);
        assert_eq!(span.span_id, vec![2; 8]);
        assert_eq!(span.parent_span_id, vec![1; 8]);
        assert_eq!(span.trace_state, "v=1");
        assert_eq!((span.name.as_str(), span.kind), ("process q", 5));
        assert_eq!(
            (span.start_time_unix_nano, span.end_time_unix_nano),
            (10, 20)
        );
        assert_eq!(span.flags, 0x301);
        let values: Vec<_> = span
            .attributes
            .iter()
            .map(|a| {
                (
                    a.key.as_str(),
                    a.value.as_ref().and_then(|v| v.value.clone()),
                )
            })
            .collect();
        assert_eq!(values[0], ("s", Some(Any::StringValue("text".into()))));
        assert_eq!(values[1], ("long", Some(Any::StringValue("x".repeat(300)))));
        assert_eq!(values[2], ("i", Some(Any::IntValue(-5))));
        assert_eq!(values[3], ("b", Some(Any::BoolValue(true))));
        let cut = format!("x{}", "é".repeat(2047));
        assert_eq!(
            values[4],
            ("huge", Some(Any::StringValue(cut))),
            "cut at a character"
        );
        assert_eq!(span.links[0].span_id, vec![3; 8]);
        assert_eq!(span.links[0].flags, 0x301);
        let status = span.status.as_ref().expect("a status");
        assert_eq!((status.code, status.message.as_str()), (2, "it trapped"));
        let root = &scope_spans.spans[200];
        assert!(root.parent_span_id.is_empty());
        assert_eq!((root.kind, root.flags), (4, 0x101));
    }
}
