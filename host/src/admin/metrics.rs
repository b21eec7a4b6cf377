//! The host's Prometheus metrics, every series labelled with tenant and
//! mount.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

use crate::sandbox::LogTags;
use crate::telemetry::SpanCounts;
use wharf_core::settlement::{Disposition, Outcome};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MountLabels {
    tenant: String,
    mount: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    tenant: String,
    mount: String,
    outcome: &'static str,
    disposition: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    tenant: String,
    mount: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    tenant: String,
    mount: String,
    result: &'static str,
}

/// Every metric of the host.
pub struct Metrics {
    registry: Registry,
    /// The name of every series the registry can hold.
    series: Vec<String>,
    deliveries: Family<DeliveryLabels, Counter>,
    failures: Family<KindLabels, Counter>,
    duration: Family<MountLabels, Histogram>,
    copies_pending: Family<MountLabels, Gauge>,
    ordered_keys: Family<MountLabels, Gauge>,
    ordered_waiting: Family<MountLabels, Gauge>,
    ordered_oldest_wait: Family<MountLabels, Gauge<f64, AtomicU64>>,
    copies_published: Family<ResultLabels, Counter>,
    outputs_published: Family<ResultLabels, Counter>,
    dead_letters: Family<MountLabels, Counter>,
    module_reloads: Family<ResultLabels, Counter>,
    config_reloads: Family<HostResultLabels, Counter>,
    output_dropped: Family<MountLabels, Counter>,
    mounts_running: Gauge,
    links_up: Family<MountLabels, Gauge>,
    paused: Family<MountLabels, Gauge>,
    breaker: Family<MountLabels, Gauge>,
    released_on_pause: Family<MountLabels, Counter>,
    link_failures: Family<MountLabels, Counter>,
    abandoned: Family<MountLabels, Counter>,
    refused: Family<MountLabels, Counter>,
    outputs_undeliverable: Family<MountLabels, Counter>,
    trace_context_malformed: Family<MountLabels, Counter>,
    broker_connections: Family<BrokerLabels, Gauge>,
    broker_connections_lost: Family<BrokerLabels, Counter>,
    log_lines_dropped: Counter,
    spans: SpanCounts,
    /// Every delivery handled, over all mounts: one number to watch.
    handled_total: AtomicU64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BrokerLabels {
    /// The tenant whose own broker it is, or `default` for the host's.
    broker: String,
}

impl Metrics {
    /// Registers every metric, all at zero.
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registering {
            registry: Registry::with_prefix(PREFIX),
            series: Vec::new(),
        };
        let deliveries = registered(
            &mut registry,
            "deliveries",
            "Deliveries handled, by the outcome the plan was made from and the disposition sent (none: at-most-once or not settled)",
        );
        let failures = registered(
            &mut registry,
            "handler_failures",
            "Handler calls that produced no outcome (each settled as retry), by kind",
        );
        let copies_pending = registered(
            &mut registry,
            "copies_pending",
            "Delayed copies waiting for their time",
        );
        let ordered_keys = registered(
            &mut registry,
            "ordered_keys",
            "Keys of an ordered mount with a delivery running or waiting (at most max_keys)",
        );
        let ordered_waiting = registered(
            &mut registry,
            "ordered_waiting",
            "Deliveries of an ordered mount waiting behind the running one of their key",
        );
        let ordered_oldest_wait = registered(
            &mut registry,
            "ordered_oldest_wait_seconds",
            "How long the delivery of an ordered mount waiting longest for its key has waited",
        );
        let copies_published = registered(
            &mut registry,
            "copies_published",
            "Copies the host published to a subscription address, by result",
        );
        let outputs_published = registered(
            &mut registry,
            "outputs_published",
            "Messages handlers sent through their outbox that the host published, by result",
        );
        let dead_letters = registered(
            &mut registry,
            "dead_letters",
            "Deliveries published to a mount's dead-letter address",
        );
        let module_reloads = registered(
            &mut registry,
            "module_reloads",
            "Module files reloaded after a change, by result (error: the old module keeps serving)",
        );
        let config_reloads = registered(
            &mut registry,
            "config_reloads",
            "Config reloads (file change or SIGHUP), by result (error: nothing changed)",
        );
        let build_info = registered::<Family<VersionLabels, Gauge>>(
            &mut registry,
            "build_info",
            "1, labelled with the version of wharf running",
        );
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let log_lines_dropped = registered(
            &mut registry,
            "log_lines_dropped",
            "Log lines dropped because the log's writer was behind (a slow or stalled stderr)",
        );
        let spans = SpanCounts {
            exported: registered(
                &mut registry,
                "trace_spans_exported",
                "Spans the OTLP collector took",
            ),
            dropped: registered(
                &mut registry,
                "trace_spans_dropped",
                "Spans dropped: the export queue was full, or the collector did not take them",
            ),
        };
        let output_dropped = registered(
            &mut registry,
            "handler_output_dropped_bytes",
            "Bytes of handler stdout and stderr over the per-delivery allowance, dropped",
        );
        let duration = Family::<MountLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 4.0, 10))
        });
        registry.registry.register(
            "handler_duration_seconds",
            "Time from the start of a handler call to its outcome, instantiation included",
            duration.clone(),
        );
        registry.named("handler_duration_seconds", MetricType::Histogram);
        let mounts_running = registered(
            &mut registry,
            "mounts_running",
            "Mounts configured and supervised (attached or attaching)",
        );
        let links_up = registered(
            &mut registry,
            "link_up",
            "1 while the mount's links are attached, 0 while it attaches or backs off",
        );
        let paused = registered(
            &mut registry,
            "mount_paused",
            "1 while the mount is paused (its link has no credit), 0 while it runs",
        );
        let breaker = registered(
            &mut registry,
            "breaker_state",
            "The mount's circuit breaker: 0 closed (or none), 1 open, 2 half-open",
        );
        let released_on_pause = registered(
            &mut registry,
            "deliveries_released_on_pause",
            "Deliveries the broker sent as the mount paused, released back to it unhandled (no attempt counted)",
        );
        let link_failures = registered(
            &mut registry,
            "link_failures",
            "Times the mount's links went down (connection lost, link detached, attach failed)",
        );
        let abandoned = registered(
            &mut registry,
            "deliveries_abandoned",
            "Deliveries in flight when their link died, left to the broker to redeliver",
        );
        let refused = registered(
            &mut registry,
            "deliveries_refused",
            "Deliveries rejected without running the handler (undecodable or over max_message_size)",
        );
        let outputs_undeliverable = registered(
            &mut registry,
            "outputs_undeliverable",
            "Acknowledged deliveries whose outputs the broker would not take, counted as failed attempts",
        );
        let trace_context_malformed = registered(
            &mut registry,
            "trace_context_malformed",
            "Deliveries whose publisher's trace context could not be read (ignored)",
        );
        let broker_connections = registered(
            &mut registry,
            "broker_connections",
            "AMQP connections open to the broker",
        );
        let broker_connections_lost = registered(
            &mut registry,
            "broker_connections_lost",
            "AMQP connections to the broker lost without being closed by wharf",
        );
        Arc::new(Metrics {
            registry: registry.registry,
            series: registry.series,
            deliveries,
            failures,
            duration,
            copies_pending,
            ordered_keys,
            ordered_waiting,
            ordered_oldest_wait,
            copies_published,
            outputs_published,
            dead_letters,
            module_reloads,
            config_reloads,
            output_dropped,
            log_lines_dropped,
            spans,
            mounts_running,
            links_up,
            paused,
            breaker,
            released_on_pause,
            link_failures,
            abandoned,
            refused,
            outputs_undeliverable,
            trace_context_malformed,
            broker_connections,
            broker_connections_lost,
            handled_total: AtomicU64::new(0),
        })
    }

    /// The name of every series wharf may expose (a labelled one appears in
    /// `/metrics` once first used), for checking alerts and dashboards.
    pub fn series_names(&self) -> &[String] {
        &self.series
    }

    /// Deliveries handled so far, over all mounts.
    pub fn handled_total(&self) -> u64 {
        self.handled_total.load(Ordering::Relaxed)
    }

    /// Counts a config reload.
    pub fn config_reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.config_reloads
            .get_or_create(&HostResultLabels { result })
            .inc();
    }

    /// Records what a broker pool reports: `broker` is the tenant owning it,
    /// or `default`.
    pub fn broker(&self, broker: &str, connections: usize, lost: u64) {
        let labels = BrokerLabels {
            broker: broker.to_owned(),
        };
        self.broker_connections
            .get_or_create(&labels)
            .set(i64::try_from(connections).unwrap_or(i64::MAX));
        let counter = self.broker_connections_lost.get_or_create(&labels);
        let counted = counter.get();
        if lost > counted {
            counter.inc_by(lost - counted);
        }
    }

    /// The metrics of one mount.
    pub fn mount(self: &Arc<Self>, tags: &LogTags) -> MountMetrics {
        MountMetrics {
            metrics: self.clone(),
            labels: MountLabels {
                tenant: tags.tenant.to_string(),
                mount: tags.mount.to_string(),
            },
            hot: Arc::default(),
        }
    }

    /// Counts mounts starting (`+1`) and stopping (`-1`).
    pub fn mounts_running(&self, change: i64) {
        self.mounts_running.inc_by(change);
    }

    /// The counters trace export counts its spans in.
    pub fn span_counts(&self) -> SpanCounts {
        self.spans.clone()
    }

    /// Everything in the Prometheus text format.
    pub fn encode(&self) -> String {
        let dropped = crate::logging::dropped_lines();
        self.log_lines_dropped
            .inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// What every metric's name starts with.
const PREFIX: &str = "wharf";

/// A registry being filled, with the series names of what it holds.
struct Registering {
    registry: Registry,
    series: Vec<String>,
}

impl Registering {
    /// Notes the series a metric of `kind` named `name` writes.
    fn named(&mut self, name: &str, kind: MetricType) {
        let suffixes: &[&str] = match kind {
            MetricType::Counter => &["_total"],
            MetricType::Histogram => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        self.series.extend(
            suffixes
                .iter()
                .map(|suffix| format!("{PREFIX}_{name}{suffix}")),
        );
    }
}

/// A new metric, registered.
fn registered<M: Metric + TypedMetric + Clone + Default>(
    registry: &mut Registering,
    name: &str,
    help: &str,
) -> M {
    let metric = M::default();
    registry.registry.register(name, help, metric.clone());
    registry.named(name, M::TYPE);
    metric
}

/// The metrics of one mount, labels filled in.
#[derive(Clone)]
pub struct MountMetrics {
    metrics: Arc<Metrics>,
    labels: MountLabels,
    hot: Arc<HotSeries>,
}

/// The series every delivery touches, looked up once: a lookup builds and
/// hashes a label set, which would cost more than the count itself.
#[derive(Default)]
struct HotSeries {
    /// By outcome, then disposition (`None` first).
    deliveries: [[OnceLock<Counter>; 5]; 4],
    duration: OnceLock<Histogram>,
}

const OUTCOMES: [&str; 4] = ["ack", "retry", "retry-after", "drop"];
const DISPOSITIONS: [&str; 5] = ["none", "accepted", "modified", "rejected", "released"];

impl MountMetrics {
    /// One delivery handled.
    pub fn handled(&self, outcome: Outcome, disposition: Option<Disposition>, took: Duration) {
        let o = match outcome {
            Outcome::Ack => 0,
            Outcome::Retry => 1,
            Outcome::RetryAfter(_) => 2,
            Outcome::Drop => 3,
        };
        let d = match disposition {
            None => 0,
            Some(Disposition::Accepted) => 1,
            Some(Disposition::Modified) => 2,
            Some(Disposition::Rejected) => 3,
            Some(Disposition::Released) => 4,
        };
        self.hot.deliveries[o][d]
            .get_or_init(|| {
                let labels = DeliveryLabels {
                    tenant: self.labels.tenant.clone(),
                    mount: self.labels.mount.clone(),
                    outcome: OUTCOMES[o],
                    disposition: DISPOSITIONS[d],
                };
                self.metrics.deliveries.get_or_create(&labels).clone()
            })
            .inc();
        self.hot
            .duration
            .get_or_init(|| self.metrics.duration.get_or_create(&self.labels).clone())
            .observe(took.as_secs_f64());
        self.metrics.handled_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A handler call that failed, by [`crate::sandbox::Failure::kind`].
    pub fn failed(&self, kind: &'static str) {
        let labels = KindLabels {
            tenant: self.labels.tenant.clone(),
            mount: self.labels.mount.clone(),
            kind,
        };
        self.metrics.failures.get_or_create(&labels).inc();
    }

    /// Handler output dropped over the allowance.
    pub fn output_dropped(&self, bytes: u64) {
        if bytes > 0 {
            self.metrics
                .output_dropped
                .get_or_create(&self.labels)
                .inc_by(bytes);
        }
    }

    /// Whether the mount's links are attached.
    pub fn link_up(&self, up: bool) {
        self.metrics
            .links_up
            .get_or_create(&self.labels)
            .set(i64::from(up));
    }

    /// The mount paused (its link's credit withdrawn) or runs again.
    pub fn paused(&self, paused: bool) {
        self.metrics
            .paused
            .get_or_create(&self.labels)
            .set(i64::from(paused));
    }

    /// The mount's circuit breaker is in `state`.
    pub fn breaker(&self, state: wharf_core::breaker::BreakerState) {
        use wharf_core::breaker::BreakerState;
        let value = match state {
            BreakerState::Closed => 0,
            BreakerState::Open { .. } => 1,
            BreakerState::HalfOpen => 2,
        };
        self.metrics.breaker.get_or_create(&self.labels).set(value);
    }

    /// A delivery that arrived while the mount was paused was released.
    pub fn released_on_pause(&self) {
        self.metrics
            .released_on_pause
            .get_or_create(&self.labels)
            .inc();
    }

    /// The mount's links went down.
    pub fn link_down(&self) {
        self.link_up(false);
        self.metrics.link_failures.get_or_create(&self.labels).inc();
    }

    /// Deliveries left to the broker because their link died.
    pub fn abandoned(&self, deliveries: u64) {
        self.metrics
            .abandoned
            .get_or_create(&self.labels)
            .inc_by(deliveries);
    }

    /// A delivery rejected without running the handler.
    pub fn refused(&self) {
        self.metrics.refused.get_or_create(&self.labels).inc();
    }

    /// A delivery whose trace context could not be read.
    pub fn trace_context_malformed(&self) {
        self.metrics
            .trace_context_malformed
            .get_or_create(&self.labels)
            .inc();
    }

    /// An acknowledged delivery whose outputs were not delivered.
    pub fn outputs_undeliverable(&self) {
        self.metrics
            .outputs_undeliverable
            .get_or_create(&self.labels)
            .inc();
    }

    /// A delivery published to the dead-letter address.
    pub fn dead_lettered(&self) {
        self.metrics.dead_letters.get_or_create(&self.labels).inc();
    }

    /// Delayed copies scheduled (`+1`) or published (`-1`).
    pub fn copies_pending(&self, change: i64) {
        self.metrics
            .copies_pending
            .get_or_create(&self.labels)
            .inc_by(change);
    }

    /// An ordered mount's keys, as they are now.
    pub(crate) fn keys(&self, now: &crate::tenants::KeysNow) {
        let gauge = |family: &Family<MountLabels, Gauge>, n: usize| {
            family
                .get_or_create(&self.labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        gauge(&self.metrics.ordered_keys, now.keys);
        gauge(&self.metrics.ordered_waiting, now.waiting);
        self.metrics
            .ordered_oldest_wait
            .get_or_create(&self.labels)
            .set(now.oldest.as_secs_f64());
    }

    /// A copy published, or not.
    pub fn copy_published(&self, ok: bool) {
        self.result(&self.metrics.copies_published, ok);
    }

    /// Outputs of one delivery published (`ok`) or not (`failed`).
    pub fn outputs_published(&self, ok: usize, failed: usize) {
        for (n, result) in [(ok, true), (failed, false)] {
            if n > 0 {
                self.result_by(&self.metrics.outputs_published, result, n as u64);
            }
        }
    }

    /// A module reload, compiled and swapped in or refused.
    pub fn module_reloaded(&self, ok: bool) {
        self.result(&self.metrics.module_reloads, ok);
    }

    fn result(&self, family: &Family<ResultLabels, Counter>, ok: bool) {
        self.result_by(family, ok, 1);
    }

    fn result_by(&self, family: &Family<ResultLabels, Counter>, ok: bool, n: u64) {
        let labels = ResultLabels {
            tenant: self.labels.tenant.clone(),
            mount: self.labels.mount.clone(),
            result: if ok { "ok" } else { "error" },
        };
        family.get_or_create(&labels).inc_by(n);
    }
}
