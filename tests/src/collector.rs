//! An OTLP trace receiver for tests: OTLP/HTTP (protobuf) and OTLP/gRPC on
//! two loopback ports, keeping every span it is sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use tokio::net::TcpListener;

/// A span as the collector received it, its ids in hex.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The trace.
    pub trace_id: String,
    /// The span.
    pub span_id: String,
    /// The parent span, empty for a root.
    pub parent_span_id: String,
    /// Its name, e.g. `process orders`.
    pub name: String,
    /// `consumer`, `producer`, `client`, `server` or `internal`.
    pub kind: &'static str,
    /// Its attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// Whether its status is an error.
    pub failed: bool,
    /// The spans it links to, as `trace-span` in hex.
    pub links: Vec<String>,
    /// The `service.name` of its resource.
    pub service: String,
    /// Start and end, in nanoseconds since the epoch.
    pub start: u64,
    /// End.
    pub end: u64,
}

impl ReceivedSpan {
    /// The attribute `key`, which must be there.
    pub fn attribute(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .unwrap_or_else(|| panic!("span `{}` has no attribute `{key}`: {self:?}", self.name))
    }
}

/// A running collector.
pub struct Collector {
    /// `http://127.0.0.1:<port>` for OTLP over HTTP.
    pub http: String,
    /// `http://127.0.0.1:<port>` for OTLP over gRPC.
    pub grpc: String,
    received: Arc<Received>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Collector {
    /// Listens on two free loopback ports.
    pub async fn start() -> anyhow::Result<Collector> {
        Collector::listen(true).await
    }

    /// Listens as [`Collector::start`] does, but only counts the spans,
    /// walking the wire format without building messages: for measuring
    /// what exporting costs wharf on a machine it shares with the
    /// receiver, where a receiver's own decoding would take CPU from wharf.
    pub async fn start_counting() -> anyhow::Result<Collector> {
        Collector::listen(false).await
    }

    async fn listen(keep: bool) -> anyhow::Result<Collector> {
        let spans = Arc::new(Received {
            keep,
            ..Received::default()
        });
        let http = TcpListener::bind("127.0.0.1:0").await?;
        let grpc = TcpListener::bind("127.0.0.1:0").await?;
        let urls = (url(http.local_addr()?), url(grpc.local_addr()?));
        let tasks = vec![
            tokio::spawn(serve(http, spans.clone(), false)),
            tokio::spawn(serve(grpc, spans.clone(), true)),
        ];
        Ok(Collector {
            http: urls.0,
            grpc: urls.1,
            received: spans,
            tasks,
        })
    }

    /// Every span received so far (none when only counting).
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.spans.lock().expect("spans").clone()
    }

    /// The header `name` of the latest export request.
    pub fn header(&self, name: &str) -> Option<String> {
        let headers = self.received.headers.lock().expect("headers");
        headers
            .get(name)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
    }

    /// How many spans were received so far.
    pub fn count(&self) -> usize {
        self.received.count.load(Ordering::Relaxed)
    }

    /// Waits until `done` holds for the spans received, polling, for at
    /// most `within`.
    pub async fn wait_until(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> anyhow::Result<Vec<ReceivedSpan>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return Ok(spans);
            }
            if tokio::time::Instant::now() > deadline {
                let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
                anyhow::bail!("the spans received did not come to what was expected: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[derive(Default)]
struct Received {
    keep: bool,
    spans: Mutex<Vec<ReceivedSpan>>,
    headers: Mutex<http::HeaderMap>,
    count: AtomicUsize,
}

impl Drop for Collector {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn url(address: SocketAddr) -> String {
    format!("http://{address}")
}

async fn serve(listener: TcpListener, spans: Arc<Received>, grpc: bool) {
    while let Ok((stream, _)) = listener.accept().await {
        let spans = spans.clone();
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            let service = hyper::service::service_fn(move |request| {
                let spans = spans.clone();
                async move { answer(request, &spans, grpc).await }
            });
            let _ = if grpc {
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(io, service)
                    .await
            } else {
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
            };
        });
    }
}

type Answer = http::Response<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>;

async fn answer(
    request: http::Request<Incoming>,
    spans: &Received,
    grpc: bool,
) -> Result<Answer, hyper::Error> {
    let path = request.uri().path().to_owned();
    *spans.headers.lock().expect("headers") = request.headers().clone();
    let body = request.into_body().collect().await?.to_bytes();
    // gRPC frames the message: a compression flag and a 4-byte length.
    let message = if grpc {
        body.get(5..).unwrap_or_default()
    } else {
        &body[..]
    };
    let expected = if grpc {
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
    } else {
        "/v1/traces"
    };
    let status = match (path == expected, spans.keep) {
        (false, _) => 400,
        (true, true) => match ExportTraceServiceRequest::decode(message) {
            Ok(request) => {
                let received = received(&request);
                spans.count.fetch_add(received.len(), Ordering::Relaxed);
                spans.spans.lock().expect("spans").extend(received);
                200
            }
            Err(_) => 400,
        },
        (true, false) => match count_spans(message) {
            Some(count) => {
                spans.count.fetch_add(count, Ordering::Relaxed);
                200
            }
            None => 400,
        },
    };
    if !grpc {
        return Ok(http::Response::builder()
            .status(status)
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::new()).boxed())
            .expect("a response"));
    }
    let grpc_status = if status == 200 { "0" } else { "3" };
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static(grpc_status));
    let frames = futures_util::stream::iter([
        Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
        Ok(Frame::trailers(trailers)),
    ]);
    Ok(http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(StreamBody::new(frames).boxed())
        .expect("a response"))
}

/// The spans in an `ExportTraceServiceRequest`: its `resource_spans` (1),
/// their `scope_spans` (2), their `spans` (2); `None` when the bytes are
/// not well-formed protobuf.
fn count_spans(request: &[u8]) -> Option<usize> {
    let mut count = 0;
    for resource_spans in fields(request, 1) {
        for scope_spans in fields(resource_spans?, 2) {
            for span in fields(scope_spans?, 2) {
                span?;
                count += 1;
            }
        }
    }
    Some(count)
}

/// The length-delimited fields numbered `wanted` in `message`, skipping
/// the others; an `Err`-like `None` item ends a malformed message.
fn fields(mut message: &[u8], wanted: u64) -> impl Iterator<Item = Option<&[u8]>> {
    std::iter::from_fn(move || {
        loop {
            if message.is_empty() {
                return None;
            }
            let Some(field) = (|| {
                let key = varint(&mut message)?;
                let value = match key & 7 {
                    0 => varint(&mut message).map(|_| &[][..])?,
                    1 => take(&mut message, 8)?,
                    2 => {
                        let len = usize::try_from(varint(&mut message)?).ok()?;
                        take(&mut message, len)?
                    }
                    5 => take(&mut message, 4)?,
                    _ => return None,
                };
                Some((key >> 3, key & 7, value))
            })() else {
                message = &[];
                return Some(None);
            };
            if field.0 == wanted && field.1 == 2 {
                return Some(Some(field.2));
            }
        }
    })
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

fn take<'a>(bytes: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    if bytes.len() < len {
        return None;
    }
    let (taken, rest) = bytes.split_at(len);
    *bytes = rest;
    Some(taken)
}

fn received(request: &ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in &request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(text)
            .unwrap_or_default();
        for scope in &resource_spans.scope_spans {
            for span in &scope.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: match span.kind {
                        1 => "internal",
                        2 => "server",
                        3 => "client",
                        4 => "producer",
                        5 => "consumer",
                        _ => "unspecified",
                    },
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(a)))
                        .collect(),
                    failed: span.status.as_ref().is_some_and(|s| s.code == 2),
                    links: span
                        .links
                        .iter()
                        .map(|l| format!("{}-{}", hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    service: service.clone(),
                    start: span.start_time_unix_nano,
                    end: span.end_time_unix_nano,
                });
            }
        }
    }
    out
}

fn text(attribute: &KeyValue) -> String {
    match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `spans` as an indented tree, children under their parent in start
/// order, each with its kind, duration and the attributes that say what
/// happened: a picture of one message's trace.
pub fn tree(spans: &[ReceivedSpan]) -> String {
    let mut out = String::new();
    let known = |id: &str| spans.iter().any(|s| s.span_id == id);
    let mut roots: Vec<&ReceivedSpan> =
        spans.iter().filter(|s| !known(&s.parent_span_id)).collect();
    roots.sort_by_key(|s| s.start);
    for root in roots {
        if !root.parent_span_id.is_empty() {
            out.push_str(&format!("(publisher span {})\n", root.parent_span_id));
        }
        branch(spans, root, 1, &mut out);
    }
    out
}

fn branch(spans: &[ReceivedSpan], span: &ReceivedSpan, depth: usize, out: &mut String) {
    let shown = [
        "wharf.attempt",
        "wharf.outcome",
        "wharf.disposition",
        "error.type",
        "messaging.operation.name",
        "wharf.retry_count",
        "wharf.delay_ms",
        "wharf.dead_letter",
        "http.response.status_code",
    ];
    let details: Vec<String> = shown
        .iter()
        .filter_map(|key| Some(format!("{key}={}", span.attributes.get(*key)?)))
        .collect();
    let took = span.end.saturating_sub(span.start) / 1_000;
    out.push_str(&format!(
        "{}{} [{}] {}.{:03} ms {}\n",
        "  ".repeat(depth),
        span.name,
        span.kind,
        took / 1000,
        took % 1000,
        details.join(" ")
    ));
    let mut children: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id == span.span_id)
        .collect();
    children.sort_by_key(|s| s.start);
    for child in children {
        branch(spans, child, depth + 1, out);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    use super::*;

    #[test]
    fn counting_walks_to_every_span_and_refuses_a_cut_message() {
        let scope = |spans: usize| ScopeSpans {
            spans: vec![
                Span {
                    name: "process q".into(),
                    start_time_unix_nano: 1 << 60,
                    ..Span::default()
                };
                spans
            ],
            ..ScopeSpans::default()
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![scope(3), scope(0)],
                    ..ResourceSpans::default()
                },
                ResourceSpans {
                    scope_spans: vec![scope(2)],
                    ..ResourceSpans::default()
                },
            ],
        };
        let bytes = request.encode_to_vec();
        assert_eq!(count_spans(&bytes), Some(5));
        assert_eq!(count_spans(&bytes[..bytes.len() - 1]), None);
        assert_eq!(count_spans(&[]), Some(0));
    }
}
