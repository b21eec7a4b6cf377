//! Spans of what the host does with each delivery, exported over OTLP.
//!
//! wharf records its spans itself, with the ids it already carries on the
//! messages it publishes (see [`wharf_core::trace`]), writes each in OTLP's
//! protobuf form as it is recorded ([`protobuf`]) and sends batches from a
//! task of its own ([`export`]). A span that finds the queue full is
//! dropped and counted, never waited for, so a slow or absent collector
//! costs deliveries nothing. Off, every call here is a branch on `None`.

mod export;
mod protobuf;

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::logging::{Repeats, Tell};
use crate::sync::Locked;
pub use export::Destination;
pub use protobuf::Attribute;
use wharf_core::config::{ParentMode, Telemetry as TelemetryConfig};
use wharf_core::sampler::{SAMPLED, Sampler};
use wharf_core::trace::TraceContext;

/// The kinds of span wharf records.
pub use opentelemetry::trace::SpanKind as Kind;

/// What became of a host's spans (`wharf_trace_spans_*_total`).
#[derive(Clone, Debug, Default)]
pub struct SpanCounts {
    /// Spans the collector took.
    pub exported: Counter,
    /// Spans dropped: the queue was full, or the collector did not take
    /// them.
    pub dropped: Counter,
}

/// How spans are exported, from `[telemetry]` and the `OTEL_*`
/// environment (a key in the file wins over its variable).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The collector, and how spans are sent to it.
    pub destination: Destination,
    /// The `service.name` resource attribute, when the file names it.
    pub service_name: Option<String>,
    /// Which traces are recorded.
    pub sampler: Sampler,
    /// How a delivery's span joins its publisher's trace.
    pub parent: ParentMode,
    /// Spans waiting for export at most.
    pub max_queue: usize,
    /// Spans in one export at most.
    pub max_batch: usize,
    /// How long a span may wait for a fuller batch.
    pub export_delay: Duration,
    /// How long one export may take before its spans count as dropped.
    pub export_timeout: Duration,
}

impl Settings {
    /// The settings `config` and the environment `env` give, or `None`
    /// when no endpoint is configured (export is off unless asked for) or
    /// `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none` turn it off.
    /// A variable that cannot be read is reported in `warnings` and its
    /// default used, as the OpenTelemetry specification asks.
    pub fn resolve(
        config: &TelemetryConfig,
        env: impl Fn(&str) -> Option<String>,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Settings>, String> {
        let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let exporter = set("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase());
        if exporter.as_deref() == Some("none") {
            return Ok(None);
        }
        if let Some(other) = exporter.as_deref().filter(|e| *e != "otlp") {
            warnings.push(format!(
                "OTEL_TRACES_EXPORTER={other}: wharf exports over OTLP only"
            ));
        }
        let configured = config.endpoint.is_some()
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
            || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || exporter.as_deref() == Some("otlp");
        if !configured {
            return Ok(None);
        }
        let destination = Destination::resolve(config, &set, warnings)?;
        let sampler = match (&config.sampler, config.sampler_ratio) {
            (Some(name), ratio) => Sampler::parse(name, ratio.map(|r| r.to_string()).as_deref())
                .map_err(|e| format!("[telemetry] sampler: {e}"))?,
            (None, Some(ratio)) => {
                Sampler::parse("parentbased_traceidratio", Some(&ratio.to_string()))
                    .map_err(|e| format!("[telemetry] sampler_ratio: {e}"))?
            }
            (None, None) => match set("OTEL_TRACES_SAMPLER") {
                Some(name) => {
                    let arg = set("OTEL_TRACES_SAMPLER_ARG");
                    Sampler::parse(&name, arg.as_deref()).unwrap_or_else(|e| {
                        warnings.push(format!(
                            "OTEL_TRACES_SAMPLER: {e}; sampling with {}",
                            Sampler::default()
                        ));
                        Sampler::default()
                    })
                }
                None => Sampler::default(),
            },
        };
        let mut number = |name: &str, default: u64| match set(name) {
            None => default,
            Some(text) => text.trim().parse().unwrap_or_else(|_| {
                warnings.push(format!(
                    "{name}={text} is not a whole number; using {default}"
                ));
                default
            }),
        };
        // A variable is read (and warned about) only where the file leaves
        // its setting to it.
        let max_queue = config
            .max_queue
            .unwrap_or_else(|| number("OTEL_BSP_MAX_QUEUE_SIZE", 2048) as usize)
            .max(1);
        let max_batch = config
            .max_batch
            .unwrap_or_else(|| number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512) as usize)
            .clamp(1, max_queue);
        let export_delay = config
            .export_delay
            .unwrap_or_else(|| Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)));
        let export_timeout = Duration::from_millis(number("OTEL_BSP_EXPORT_TIMEOUT", 30_000));
        Ok(Some(Settings {
            destination,
            service_name: config.service_name.clone(),
            sampler,
            parent: config.parent,
            max_queue,
            max_batch,
            export_delay,
            export_timeout,
        }))
    }
}

/// Where a host's spans go: nowhere (off), or the export queue.
#[derive(Clone, Default)]
pub struct Telemetry(Option<Arc<Exporting>>);

struct Exporting {
    queue: Queue,
    sampler: Sampler,
    parent: ParentMode,
}

/// Spans waiting for export, already in their wire form: ending spans
/// copy their bytes in (so each span's buffer is freed on the thread that
/// filled it, where a buffer handed to the export task would be freed on
/// another thread's heap arena, under its lock). The export task is not
/// woken per span (a wake-up crosses threads and costs more than
/// recording the span): it sleeps out the export delay and is told early
/// only when a whole batch is waiting.
#[derive(Clone)]
struct Queue(Arc<Waiting>);

struct Waiting {
    batches: Mutex<Batches>,
    batch_full: Notify,
    /// Bytes kept in front of a batch's spans for the request's envelope.
    room: usize,
    max_batch: usize,
    max_queue: usize,
    dropped: Counter,
}

/// The full batches in order, then the one being filled.
#[derive(Default)]
struct Batches {
    full: VecDeque<Batch>,
    filling: Batch,
    /// Spans in all of them.
    queued: usize,
    /// Whether the host is stopping: spans ending now are not exported.
    closed: bool,
    /// The longest batch so far, which the next one is given room for.
    longest: usize,
}

/// Spans as a `ScopeSpans` message's span fields, after room for the
/// request's envelope, so a request is sent without copying them.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    count: usize,
}

impl Queue {
    fn new(settings: &Settings, room: usize, dropped: Counter) -> Queue {
        Queue(Arc::new(Waiting {
            batches: Mutex::default(),
            batch_full: Notify::new(),
            room,
            max_batch: settings.max_batch,
            max_queue: settings.max_queue,
            dropped,
        }))
    }

    fn push(&self, span: &[u8]) {
        let waiting = &*self.0;
        let mut batches = waiting.batches.locked();
        if batches.closed || batches.queued >= waiting.max_queue {
            drop(batches);
            waiting.dropped.inc();
            return;
        }
        batches.queued += 1;
        let longest = batches.longest;
        let filling = &mut batches.filling;
        if filling.bytes.is_empty() {
            filling
                .bytes
                .reserve(longest.max(waiting.room + span.len() + 4));
            filling.bytes.resize(waiting.room, 0);
        }
        protobuf::add_span(&mut filling.bytes, span);
        filling.count += 1;
        if filling.count >= waiting.max_batch {
            let full = std::mem::take(&mut batches.filling);
            batches.longest = batches.longest.max(full.bytes.len());
            batches.full.push_back(full);
            drop(batches);
            waiting.batch_full.notify_one();
        }
    }

    /// The oldest full batch, or when `partial` the one being filled.
    fn take(&self, partial: bool) -> Option<Batch> {
        let mut batches = self.0.batches.locked();
        let batch = match batches.full.pop_front() {
            Some(batch) => batch,
            None if partial && batches.filling.count > 0 => std::mem::take(&mut batches.filling),
            None => return None,
        };
        batches.queued -= batch.count;
        Some(batch)
    }

    /// Takes no more spans.
    fn close(&self) {
        self.0.batches.locked().closed = true;
    }
}

/// The export task of a host, flushed when the host stops.
pub struct Exporter {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Telemetry {
    /// No export: contexts are still carried on, nothing is recorded.
    pub fn off() -> Telemetry {
        Telemetry(None)
    }

    /// Starts the export task `settings` describe, counting in `counts`.
    pub fn start(settings: &Settings, counts: SpanCounts) -> (Telemetry, Exporter) {
        let envelope = Envelope {
            resource: protobuf::resource(
                resource(settings)
                    .iter()
                    .map(|(key, value)| (key.to_string(), value.clone())),
            ),
            scope: protobuf::scope("wharf", env!("CARGO_PKG_VERSION")),
            sender: export::Sender::new(settings.destination.clone()),
        };
        let room = protobuf::envelope_room(
            &envelope.resource,
            &envelope.scope,
            envelope.sender.prefix(),
        );
        let queue = Queue::new(settings, room, counts.dropped.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(export(
            envelope,
            queue.clone(),
            settings.clone(),
            counts,
            stop.clone(),
        ));
        let telemetry = Telemetry(Some(Arc::new(Exporting {
            queue,
            sampler: settings.sampler,
            parent: settings.parent,
        })));
        (telemetry, Exporter { stop, task })
    }

    /// The context of a delivery's handling, and its `process` span when
    /// the trace is recorded. Off, it is a child of `publisher` (and there
    /// is none without one); on, a delivery without a context starts a
    /// trace of its own, and the sampler decides what is recorded.
    pub fn process(
        &self,
        publisher: Option<&TraceContext>,
        name: fmt::Arguments<'_>,
    ) -> (Option<TraceContext>, Option<Span>) {
        let Some(exporting) = &self.0 else {
            return (publisher.map(TraceContext::child), None);
        };
        let (context, parent, link) = match (publisher, exporting.parent) {
            (Some(publisher), ParentMode::Child) => (publisher.child(), Some(publisher), None),
            (publisher, _) => (TraceContext::root(0), None, publisher),
        };
        let sampled = exporting
            .sampler
            .sampled(&context.trace_id, parent.map(TraceContext::sampled));
        let context = TraceContext {
            flags: (context.flags & !SAMPLED) | if sampled { SAMPLED } else { 0 },
            state: parent.and_then(|parent| parent.state.clone()),
            ..context
        };
        if !sampled {
            return (Some(context), None);
        }
        // The publisher's span is another process's.
        let parent = parent.map(|parent| (parent, true));
        let mut span = Span::new(exporting, &context, parent, name, SpanKind::Consumer);
        if let Some(link) = link {
            protobuf::span_link(&mut span.encoded, link);
        }
        (Some(context), Some(span))
    }

    /// A span below `parent` (none without a parent), recorded when the
    /// parent's trace is: its context goes on what the span sends.
    pub fn child(
        &self,
        parent: Option<&TraceContext>,
        name: fmt::Arguments<'_>,
        kind: SpanKind,
    ) -> (Option<TraceContext>, Option<Span>) {
        let Some(parent) = parent else {
            return (None, None);
        };
        let context = parent.child();
        let span = match &self.0 {
            Some(exporting) if parent.sampled() => Some(Span::new(
                exporting,
                &context,
                Some((parent, false)),
                name,
                kind,
            )),
            _ => None,
        };
        (Some(context), span)
    }
}

impl Exporter {
    /// Exports what is queued (within `deadline`) and stops the task.
    pub async fn flush(self, deadline: Duration) {
        self.stop.cancel();
        let _ = tokio::time::timeout(deadline, self.task).await;
    }
}

/// A span being recorded, encoded as it goes; it is queued for export
/// when dropped.
pub struct Span {
    encoded: Vec<u8>,
    queue: Queue,
}

impl Span {
    fn new(
        exporting: &Exporting,
        context: &TraceContext,
        parent: Option<(&TraceContext, bool)>,
        name: fmt::Arguments<'_>,
        kind: SpanKind,
    ) -> Span {
        // Room for a `process` span's attributes without growing.
        let mut encoded = Vec::with_capacity(768);
        protobuf::span_start(&mut encoded, context, parent, name, &kind, now_nanos());
        Span {
            encoded,
            queue: exporting.queue.clone(),
        }
    }

    /// Sets an attribute.
    pub fn set(&mut self, key: &str, value: impl Attribute) {
        protobuf::span_attribute(&mut self.encoded, key, &value);
    }

    /// Marks the span failed: `error.type` and an error status.
    pub fn fail(&mut self, error_type: impl Attribute, description: impl AsRef<str>) {
        self.set("error.type", error_type);
        protobuf::span_error(&mut self.encoded, description.as_ref());
    }
}

/// Sets an attribute on a span that may not be recorded.
pub fn set(span: &mut Option<Span>, key: &str, value: impl Attribute) {
    if let Some(span) = span {
        span.set(key, value);
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        protobuf::span_end(&mut self.encoded, now_nanos());
        self.queue.push(&self.encoded);
    }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// The resource of every span: `service.name` from the file, else from
/// `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`, else `wharf`.
fn resource(settings: &Settings) -> Resource {
    let version = KeyValue::new("service.version", env!("CARGO_PKG_VERSION"));
    let detected = Resource::builder().with_attribute(version.clone());
    let name = settings.service_name.clone().or_else(|| {
        let resource = Resource::builder().build();
        let named = resource
            .get(&opentelemetry::Key::from_static_str("service.name"))
            .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
        (!named).then(|| "wharf".to_owned())
    });
    match name {
        Some(name) => detected.with_service_name(name).build(),
        None => detected.build(),
    }
}

/// What a batch is sent with: the envelope's resource and scope, and the
/// connection.
struct Envelope {
    resource: Vec<u8>,
    scope: Vec<u8>,
    sender: export::Sender,
}

/// Exports full batches as they come and the rest every export delay;
/// when stopped, what is left.
async fn export(
    envelope: Envelope,
    queue: Queue,
    settings: Settings,
    counts: SpanCounts,
    stop: CancellationToken,
) {
    let mut failing = Repeats::default();
    loop {
        let partial = tokio::select! {
            () = tokio::time::sleep(settings.export_delay) => true,
            () = queue.0.batch_full.notified() => false,
            () = stop.cancelled() => true,
        };
        let stopping = stop.is_cancelled();
        if stopping {
            queue.close();
        }
        while let Some(batch) = queue.take(partial || stopping) {
            send(
                &envelope,
                batch,
                queue.0.room,
                &settings,
                &counts,
                &mut failing,
            )
            .await;
        }
        if stopping {
            return;
        }
    }
}

async fn send(
    envelope: &Envelope,
    mut batch: Batch,
    room: usize,
    settings: &Settings,
    counts: &SpanCounts,
    failing: &mut Repeats,
) {
    let count = batch.count as u64;
    let start = protobuf::envelope(
        &mut batch.bytes,
        room,
        &envelope.resource,
        &envelope.scope,
        envelope.sender.prefix(),
    );
    let failure = match tokio::time::timeout(
        settings.export_timeout,
        envelope.sender.send(batch.bytes, start),
    )
    .await
    {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!(
            "no answer within {}",
            humantime::format_duration(settings.export_timeout)
        )),
    };
    let Some(failure) = failure else {
        counts.exported.inc_by(count);
        if let Some(lasted) = failing.ended() {
            tracing::info!(
                "spans reach the collector again after {}",
                humantime::format_duration(Duration::from_secs(lasted.as_secs()))
            );
        }
        return;
    };
    counts.dropped.inc_by(count);
    match failing.happened(&failure) {
        Tell::First => tracing::warn!(
            spans = count,
            "spans not exported, dropped (counted in wharf_trace_spans_dropped_total): {failure}"
        ),
        Tell::Again { times, lasting } => tracing::warn!(
            exports = times,
            "spans still not exported after {}: {failure}",
            humantime::format_duration(Duration::from_secs(lasting.as_secs()))
        ),
        Tell::Quiet => tracing::debug!(spans = count, "spans not exported: {failure}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_core::sampler::Decision;

    fn resolve(
        config: &str,
        env: &[(&str, &str)],
    ) -> (Result<Option<Settings>, String>, Vec<String>) {
        let config: TelemetryConfig = toml::from_str(config).expect("a [telemetry] section");
        let mut warnings = Vec::new();
        let settings = Settings::resolve(
            &config,
            |name| {
                env.iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| (*value).to_owned())
            },
            &mut warnings,
        );
        (settings, warnings)
    }

    #[test]
    fn export_is_off_until_an_endpoint_is_configured() {
        assert_eq!(resolve("", &[]).0, Ok(None));
        let (on, _) = resolve("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]);
        assert!(on.expect("valid").is_some());
        let (on, _) = resolve("endpoint = \"http://c:4318\"", &[]);
        assert!(on.expect("valid").is_some());
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            let (settings, _) = resolve("endpoint = \"http://c:4318\"", &[off]);
            assert_eq!(settings, Ok(None), "{off:?}");
        }
    }

    #[test]
    fn the_file_wins_over_the_environment_and_bad_variables_fall_back() {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
        ];
        let (settings, warnings) = resolve("max_batch = 1000", &env);
        let settings = settings.expect("valid").expect("on");
        assert_eq!(settings.sampler.root, Decision::Ratio(0.5));
        assert!(!settings.sampler.parent_based);
        assert_eq!(settings.max_queue, 100);
        assert_eq!(settings.max_batch, 100, "a batch fits the queue");
        assert_eq!(settings.export_delay, Duration::from_secs(5));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("OTEL_BSP_SCHEDULE_DELAY"));

        let (settings, _) = resolve("sampler = \"always_off\"", &env);
        assert_eq!(
            settings.expect("valid").expect("on").sampler.root,
            Decision::AlwaysOff
        );
        let (settings, _) = resolve("sampler_ratio = 0.1", &env);
        let sampler = settings.expect("valid").expect("on").sampler;
        assert_eq!(
            (sampler.root, sampler.parent_based),
            (Decision::Ratio(0.1), true)
        );
        let (settings, _) = resolve("sampler_ratio = 3.0", &env);
        assert!(settings.expect_err("refused").contains("sampler_ratio"));
    }

    fn settings(parent: ParentMode, sampler: &str) -> Settings {
        let (settings, _) = resolve(
            &format!("endpoint = \"http://127.0.0.1:9\"\nsampler = \"{sampler}\""),
            &[],
        );
        Settings {
            parent,
            ..settings.expect("valid").expect("on")
        }
    }

    const PUBLISHER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    /// The span as the collector would read it.
    fn decoded(span: &Span) -> opentelemetry_proto::tonic::trace::v1::Span {
        prost::Message::decode(&span.encoded[..]).expect("a span")
    }

    #[tokio::test]
    async fn a_delivery_is_a_child_of_its_publisher_or_a_trace_linked_to_it() {
        let publisher = TraceContext::parse(PUBLISHER).expect("a context");
        let (child, _) = Telemetry::start(
            &settings(ParentMode::Child, "always_on"),
            SpanCounts::default(),
        );
        let (context, span) = child.process(Some(&publisher), format_args!("process q"));
        let (context, span) = (context.expect("a context"), span.expect("a span"));
        assert_eq!(context.trace_id, publisher.trace_id);
        let data = decoded(&span);
        assert_eq!(data.parent_span_id, publisher.span_id);
        assert_ne!(data.flags & 0x200, 0, "the parent is remote");

        let (linked, _) = Telemetry::start(
            &settings(ParentMode::Link, "always_on"),
            SpanCounts::default(),
        );
        let (context, span) = linked.process(Some(&publisher), format_args!("process q"));
        let (context, span) = (context.expect("a context"), span.expect("a span"));
        assert_ne!(context.trace_id, publisher.trace_id, "a trace of its own");
        let data = decoded(&span);
        assert!(data.parent_span_id.is_empty());
        assert_eq!(data.links[0].span_id, publisher.span_id);

        let (off, _) = Telemetry::start(
            &settings(ParentMode::Child, "always_off"),
            SpanCounts::default(),
        );
        let (context, span) = off.process(None, format_args!("process q"));
        assert!(span.is_none(), "nothing recorded");
        assert!(
            !context.expect("a context").sampled(),
            "the decision goes on with the context"
        );
        let (context, span) = Telemetry::off().process(None, format_args!("process q"));
        assert!(
            context.is_none() && span.is_none(),
            "off, no trace starts here"
        );
    }
}
