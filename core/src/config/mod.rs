//! The `wharf.toml` file: brokers, tenants and their mounts.
//!
//! Loading refuses anything it does not understand, naming the file, the line
//! and the key: unknown keys, bad durations or sizes, duplicate names, missing
//! modules, dead-letter addresses that would loop back to the subscription.

mod security;
mod units;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::backoff::BackoffPolicy;
use crate::brokers::BrokerKind;
use crate::grants::{
    AddressOwners, AddressPattern, Grants, HttpGrants, HttpPattern, Output, OutputLimits,
    ReplyGrant,
};
use crate::retry_key::RetryKey;
use crate::text;
pub use security::{Credentials, SaslMechanism, Secret, TlsFiles};
pub use units::{parse_cpu, parse_duration, parse_size};

/// Whether an instance serves one delivery or several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InstancePolicy {
    /// A fresh instance per delivery: nothing a handler leaves in memory
    /// reaches the next delivery.
    #[default]
    PerDelivery,
    /// Keep an instance after a successful call and give it later deliveries
    /// of the same mount. Saves instantiation (large for JS and Python) at
    /// the cost of isolation between those deliveries.
    Reuse {
        /// Deliveries one instance serves before it is replaced.
        max_uses: u32,
        /// How long an unused instance is kept.
        max_idle: Duration,
    },
}

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file `{path}`: {}", crate::words::io(source))]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not fit the schema.
    #[error("config file `{path}`: {message}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The parser's report, with line and column.
        message: String,
    },
    /// The file parses but says something wharf refuses.
    #[error("config file `{path}`, line {line}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The line of the offending key.
        line: usize,
        /// What is wrong and where (tenant, mount, key).
        message: String,
    },
}

/// How a mount's receiver settles deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Settle {
    /// Deliveries stay unsettled until the handler's outcome is known.
    #[default]
    AtLeastOnce,
    /// Deliveries arrive settled; the broker forgets them on sending.
    AtMostOnce,
}

impl fmt::Display for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Settle::AtLeastOnce => "at-least-once",
            Settle::AtMostOnce => "at-most-once",
        })
    }
}

/// The most severe level a tenant's handlers may log at; a line logged
/// above it is logged at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// `error`, the most severe.
    Error,
    /// `warn`: the default cap, so `error` lines are the host's own.
    Warn,
    /// `info`.
    Info,
    /// `debug`.
    Debug,
    /// `trace`, the least severe.
    Trace,
}

/// What kind of node a mount's address is, when the broker should be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Node {
    /// Competing consumers: each message goes to one receiver.
    Queue,
    /// Publish/subscribe: every receiver link gets its own subscription.
    Topic,
}

impl Node {
    /// The AMQP terminus capability that asks for this kind of node
    /// (honoured by Artemis; brokers that do not know it ignore it).
    pub fn capability(self) -> &'static str {
        match self {
            Node::Queue => "queue",
            Node::Topic => "topic",
        }
    }
}

/// The subscription a `node = "topic"` mount consumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSubscription {
    /// Whether it outlives the mount's links, and who shares it.
    pub kind: SubscriptionKind,
    /// Its name: the same in every replica and across restarts.
    pub name: String,
    /// Where `retry-after` copies go.
    pub retry_copies_to: RetryCopiesTo,
}

/// How long a topic subscription lives and who consumes from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubscriptionKind {
    /// Kept while no replica runs (messages wait for it), consumed by every
    /// replica of the mount as competing consumers.
    #[default]
    DurableShared,
    /// Kept while no replica runs, consumed by one link at a time: a second
    /// replica's attach is refused (and retried) while the first consumes.
    Durable,
    /// Made for each link and gone with it: messages published while the
    /// mount is detached are not kept, and each replica gets every message.
    Volatile,
}

impl SubscriptionKind {
    /// The name the config uses.
    pub fn as_str(self) -> &'static str {
        match self {
            SubscriptionKind::DurableShared => "durable-shared",
            SubscriptionKind::Durable => "durable",
            SubscriptionKind::Volatile => "volatile",
        }
    }
}

/// Where a topic mount's `retry-after` copies go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryCopiesTo {
    /// The mount's address: every subscription of the topic receives the
    /// copy, as the settlement contract says.
    #[default]
    Address,
    /// Only this subscription's queue, addressed as `address::queue`
    /// (Artemis).
    Subscription,
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (reloads read it again).
    pub path: PathBuf,
    /// The default broker connection.
    pub broker: Broker,
    /// Host-wide settings.
    pub host: HostSettings,
    /// The admin listener, if any.
    pub admin: Option<Admin>,
    /// Trace export: off unless an endpoint is configured here or in the
    /// `OTEL_*` environment.
    pub telemetry: Telemetry,
    /// Every tenant, in file order.
    pub tenants: Vec<Tenant>,
    /// The key copies' retry counts are sealed with, and checked by: a
    /// count without a valid seal is not believed. `None` believes every
    /// count, as other runtimes using `x-ruststream-retry-count` expect.
    pub retry_key: Option<RetryKey>,
}

/// The `[telemetry]` section: spans exported over OTLP. Each key wins
/// over the `OTEL_*` variable that sets the same thing; what neither sets
/// takes the OpenTelemetry default.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    /// The collector: `http://host:4318` (OTLP over HTTP/protobuf; the
    /// exporter adds `/v1/traces`) or `http://host:4317` (gRPC).
    pub endpoint: Option<String>,
    /// `http/protobuf` or `grpc`.
    pub protocol: Option<OtlpProtocol>,
    /// The `service.name` of the spans; `wharf` when nothing sets it.
    pub service_name: Option<String>,
    /// The sampler, by its `OTEL_TRACES_SAMPLER` name.
    #[serde(default, deserialize_with = "sampler")]
    pub sampler: Option<String>,
    /// The ratio of the `traceidratio` samplers.
    pub sampler_ratio: Option<f64>,
    /// How a delivery's span joins its publisher's trace.
    #[serde(default)]
    pub parent: ParentMode,
    /// Spans waiting for export at most; past it a span is dropped (and
    /// counted), never waited for.
    pub max_queue: Option<usize>,
    /// Spans in one export at most.
    pub max_batch: Option<usize>,
    /// How long a span may wait for a fuller batch.
    #[serde(default, deserialize_with = "units::optional_duration")]
    pub export_delay: Option<Duration>,
}

/// The OTLP transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (port 4318).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// gRPC (port 4317).
    #[serde(rename = "grpc")]
    Grpc,
}

/// How a delivery's `process` span relates to the context its publisher
/// sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParentMode {
    /// A child of the publisher's span, in its trace.
    #[default]
    Child,
    /// The first span of a trace of its own, linked to the publisher's
    /// (for publishers whose traces should not grow with every consumer).
    Link,
}

/// A sampler name, checked as it is read.
fn sampler<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = String::deserialize(d)?;
    crate::sampler::Sampler::parse(&name, None).map_err(serde::de::Error::custom)?;
    Ok(Some(name))
}

/// The HTTP listener for `/metrics`, `/healthz` and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// Where to listen, e.g. `127.0.0.1:9090`.
    pub listen: SocketAddr,
    /// The bearer token every request but `/healthz` must carry; required
    /// to listen anywhere but on loopback.
    pub token: Option<Secret>,
}

/// Where the broker is and how to stay connected to it.
#[derive(Clone, PartialEq, Eq)]
pub struct Broker {
    /// `amqp://user:password@host:port`: one node, or several of a cluster
    /// in the order to try them; a reconnect moves on to the next.
    pub urls: Vec<String>,
    /// The container id wharf announces when it opens the connection; by
    /// default `wharf-<host>-<pid>`, unique per process as brokers may refuse
    /// a second connection with the same id.
    pub container_id: String,
    /// How long opening a connection (TCP, SASL, AMQP open) may take.
    pub connect_timeout: Duration,
    /// The AMQP idle time-out wharf announces: the broker must send a frame
    /// (heartbeats included) at least this often, or the connection counts
    /// as lost. It finds half-open connections.
    pub idle_timeout: Duration,
    /// How long beginning a session or attaching a link may take.
    pub attach_timeout: Duration,
    /// How long a publish (a copy, a dead letter) may wait for link credit
    /// and the broker's answer before it counts as failed.
    pub publish_timeout: Duration,
    /// The waits between reconnect attempts.
    pub reconnect: BackoffPolicy,
    /// How wharf logs in.
    pub credentials: Credentials,
    /// TLS, for `amqps://` URLs.
    pub tls: Option<TlsFiles>,
}

impl Broker {
    /// Default `connect_timeout`.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `idle_timeout`.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default `attach_timeout`.
    pub const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `publish_timeout`.
    pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default first wait between reconnect attempts.
    pub const DEFAULT_RECONNECT_INITIAL: Duration = Duration::from_millis(100);
    /// Default longest wait between reconnect attempts.
    pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(30);

    /// The broker at `url` with every other setting at its default.
    pub fn at(url: &str) -> Broker {
        Broker {
            urls: vec![url.to_owned()],
            container_id: default_container_id(),
            connect_timeout: Broker::DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: Broker::DEFAULT_IDLE_TIMEOUT,
            attach_timeout: Broker::DEFAULT_ATTACH_TIMEOUT,
            publish_timeout: Broker::DEFAULT_PUBLISH_TIMEOUT,
            reconnect: BackoffPolicy {
                initial: Broker::DEFAULT_RECONNECT_INITIAL,
                max: Broker::DEFAULT_RECONNECT_MAX,
            },
            credentials: Credentials::from_url(url),
            tls: url.starts_with("amqps://").then(TlsFiles::default),
        }
    }

    /// The broker's nodes as one line for logs, passwords hidden.
    pub fn display(&self) -> String {
        self.urls
            .iter()
            .map(|url| crate::endpoint::redact(url))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Passwords in URLs hidden, as everywhere else.
impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Broker")
            .field("urls", &self.display())
            .field("container_id", &self.container_id)
            .field("credentials", &self.credentials)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Settings for the whole process.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSettings {
    /// On SIGINT/SIGTERM, how long in-flight handlers may still run before
    /// their deliveries are left to the broker to redeliver.
    #[serde(default = "default_grace", deserialize_with = "units::duration")]
    pub shutdown_grace: Duration,
    /// The most handler instances (running or kept for reuse) the host holds
    /// at once, over all mounts. The instance pool is sized from the mounts'
    /// `concurrency` up to this; deliveries beyond it wait for a free
    /// instance (back-pressure), never fail.
    #[serde(
        default = "default_max_instances",
        deserialize_with = "units::at_least_one"
    )]
    pub max_instances: u32,
    /// Bytes of deliveries the host holds at once, over all tenants: from
    /// when a delivery is taken off its link until it is settled. Past it,
    /// no mount takes another delivery (their credit is not renewed).
    #[serde(default = "default_max_buffered", deserialize_with = "units::size")]
    pub max_buffered: u64,
    /// The file holding the key retry counts are sealed with (see
    /// [`Config::retry_key`]).
    #[serde(default)]
    pub retry_key_file: Option<Spanned<PathBuf>>,
    /// Or the environment variable holding it.
    #[serde(default)]
    pub retry_key_env: Option<Spanned<String>>,
    /// Whether a wildcard HTTP grant reaches private addresses (loopback,
    /// RFC 1918, CGNAT, ULA); without it only a grant naming the host does.
    #[serde(default)]
    pub allow_private_networks: bool,
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings {
            shutdown_grace: default_grace(),
            max_instances: default_max_instances(),
            max_buffered: default_max_buffered(),
            retry_key_file: None,
            retry_key_env: None,
            allow_private_networks: false,
        }
    }
}

fn default_max_buffered() -> u64 {
    1 << 30
}

fn default_max_instances() -> u32 {
    1000
}

/// A team sharing the host: a name, its limits and its mounts.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Unique among tenants.
    pub name: String,
    /// The tenant's own broker connection; `None` shares the host's.
    pub broker: Option<Broker>,
    /// What the tenant's mounts may use together.
    pub budget: TenantBudget,
    /// The tenant's subscriptions, in file order.
    pub mounts: Vec<Mount>,
}

/// Limits on all of a tenant's mounts together, on top of each mount's own.
/// Reaching one slows the tenant's links down; it never fails a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantBudget {
    /// Handlers running at once.
    pub max_running: Option<u32>,
    /// Instance memory, in bytes: each running or reusable instance counts
    /// its mount's `memory`.
    pub max_memory: Option<u64>,
    /// Deliveries in flight plus delayed copies waiting for their time.
    pub max_pending_copies: Option<u32>,
    /// Bytes of the tenant's deliveries held at once, from when each is
    /// taken off its link until it is settled.
    pub max_buffered: u64,
    /// Deliveries a second the tenant's mounts start, together.
    pub max_rate: Option<u32>,
    /// Thousandths of a core the tenant's handlers may use together,
    /// averaged over 100 ms; `None` leaves them every core.
    pub max_cpu: Option<u32>,
    /// Outbound HTTP connections the tenant's handlers hold at once.
    pub max_http_connections: u32,
    /// Bytes per second the tenant's handlers may log (stdout, stderr and
    /// `log` together); the rest is dropped and counted.
    pub log_rate: u64,
    /// The most severe level its handlers' lines are logged at.
    pub log_level: LogLevel,
}

impl TenantBudget {
    /// Default `max_buffered` of a tenant.
    pub const DEFAULT_MAX_BUFFERED: u64 = 256 << 20;
    /// Default `max_http_connections` of a tenant.
    pub const DEFAULT_MAX_HTTP_CONNECTIONS: u32 = 64;
    /// Default `log_rate` of a tenant, bytes per second.
    pub const DEFAULT_LOG_RATE: u64 = 64 << 10;
    /// Default `log_level` of a tenant.
    pub const DEFAULT_LOG_LEVEL: LogLevel = LogLevel::Warn;
}

impl Default for TenantBudget {
    fn default() -> TenantBudget {
        TenantBudget {
            max_running: None,
            max_memory: None,
            max_pending_copies: None,
            max_buffered: TenantBudget::DEFAULT_MAX_BUFFERED,
            max_rate: None,
            max_cpu: None,
            max_http_connections: TenantBudget::DEFAULT_MAX_HTTP_CONNECTIONS,
            log_rate: TenantBudget::DEFAULT_LOG_RATE,
            log_level: TenantBudget::DEFAULT_LOG_LEVEL,
        }
    }
}

/// One subscription: a broker address whose deliveries run one module.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    /// Unique within its tenant.
    pub name: String,
    /// The handler component, resolved against the config file's folder.
    pub module: PathBuf,
    /// The broker node the receiver attaches to and copies are published to.
    pub address: String,
    /// Whether to ask the broker for a queue or a topic at `address`; `None`
    /// leaves it to the broker (and to how the address was created).
    pub node: Option<Node>,
    /// With `node = "topic"`, the subscription consumed from.
    pub subscription: Option<TopicSubscription>,
    /// How deliveries are settled.
    pub settle: Settle,
    /// The attempt at which a failing message stops being retried.
    pub max_attempts: Option<u32>,
    /// Where messages go when they stop being retried.
    pub dead_letter: Option<String>,
    /// Link credit: how many deliveries the broker may send ahead.
    pub credit: u32,
    /// How many handlers of this mount may run at once.
    pub concurrency: u32,
    /// How long one handler call may run.
    pub timeout: Duration,
    /// How much linear memory one handler instance may grow to, in bytes.
    pub memory: u64,
    /// The longest `retry-after` delay honoured; longer ones are shortened.
    pub max_retry_delay: Duration,
    /// Fresh instance per delivery, or reuse.
    pub instance: InstancePolicy,
    /// What the handler may use beyond its delivery.
    pub grants: Grants,
    /// The largest message taken, in bytes; a larger one is rejected with
    /// `amqp:link:message-size-exceeded` without being read.
    pub max_message_size: u64,
    /// How `retry` asks for another attempt; `None` decides from what the
    /// broker says.
    pub retry: Option<RetryChoice>,
    /// Where `retry-after` copies wait; `None` decides from what the broker
    /// offers.
    pub delay: Option<DelayChoice>,
    /// How outputs commit with their input's acknowledgement; `None`
    /// decides from what the broker offers.
    pub outputs: Option<OutputsChoice>,
    /// How the original of a `retry-after` is settled once its copy is
    /// accepted; `None` decides from the broker.
    pub retry_after_original: Option<RetryAfterOriginal>,
}

/// How a mount's `retry` asks for another attempt, when the config says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryChoice {
    /// `modified`: the broker redelivers and counts.
    Modified,
    /// A copy with the host's retry count: for queues that count nothing.
    Copy,
}

/// Where a mount's `retry-after` copies wait, when the config says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelayChoice {
    /// Published at once with a delivery time, scheduled by the broker.
    Scheduled,
    /// Held by the host with the original unsettled until the delay is over.
    Held,
}

/// How a mount's outputs commit with their input's acknowledgement, when
/// the config says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputsChoice {
    /// Posted and the input accepted in one AMQP transaction: all or
    /// nothing. The mount does not attach on a broker without transactions.
    Transaction,
    /// Published and confirmed, then the input accepted: at least once.
    Confirm,
}

/// How the original of a `retry-after` is settled once its copy is
/// accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryAfterOriginal {
    /// `rejected`, as the contract says (on a broker whose dead-letter
    /// policy catches `rejected`, the original also lands in its DLQ).
    Rejected,
    /// `accepted`: the copy carries the message on; nothing reaches a DLQ.
    Accepted,
}

impl Mount {
    /// Default `max_message_size`.
    pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 1 << 20;
    /// Default link credit.
    pub const DEFAULT_CREDIT: u32 = 64;
    /// Default number of handlers running at once.
    pub const DEFAULT_CONCURRENCY: u32 = 8;
    /// Default time budget per delivery.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default memory budget per instance.
    pub const DEFAULT_MEMORY: u64 = 64 << 20;
    /// The largest `memory`: all a 32-bit linear memory can address.
    pub const MAX_MEMORY: u64 = 4 << 30;
    /// Default ceiling for `retry-after` delays.
    pub const DEFAULT_MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);
    /// Default number of deliveries a reused instance serves.
    pub const DEFAULT_INSTANCE_MAX_USES: u32 = 1000;
    /// Default time a reusable instance is kept unused.
    pub const DEFAULT_INSTANCE_MAX_IDLE: Duration = Duration::from_secs(30);
}

/// How a mount asks for instances, as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum InstanceMode {
    PerDelivery,
    Reuse,
}

fn default_container_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    format!("wharf-{host}-{}", std::process::id())
}

/// A tenant's broker, its container id made unique to the tenant when left
/// at the default: brokers may refuse a second connection with the same id.
fn own_connection(mut broker: Broker, tenant: &str) -> Broker {
    if broker.container_id == default_container_id() {
        broker.container_id = format!("{}-{tenant}", broker.container_id);
    }
    broker
}

fn default_grace() -> Duration {
    Duration::from_secs(30)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    broker: RawBroker,
    #[serde(default)]
    host: HostSettings,
    admin: Option<RawAdmin>,
    #[serde(default)]
    telemetry: Telemetry,
    #[serde(default, rename = "tenant")]
    tenants: Vec<RawTenant>,
}

/// One URL, or the nodes of a cluster.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawUrls {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Spanned<SocketAddr>,
    token_file: Option<Spanned<PathBuf>>,
    token_env: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBroker {
    url: Spanned<RawUrls>,
    container_id: Option<String>,
    user: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    password_env: Option<Spanned<String>>,
    sasl: Option<Spanned<SaslMechanism>>,
    #[serde(default)]
    allow_plain_without_tls: bool,
    tls: Option<Spanned<security::RawTls>>,
    #[serde(default, deserialize_with = "optional_duration")]
    connect_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    idle_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    attach_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    publish_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    reconnect_initial: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    reconnect_max: Option<Spanned<Duration>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: Spanned<String>,
    broker: Option<RawBroker>,
    max_running: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    max_memory: Option<Spanned<u64>>,
    max_pending_copies: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    max_buffered: Option<Spanned<u64>>,
    max_rate: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_cpu")]
    max_cpu: Option<Spanned<u32>>,
    max_http_connections: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    log_rate: Option<Spanned<u64>>,
    log_level: Option<LogLevel>,
    #[serde(default, rename = "mount")]
    mounts: Vec<RawMount>,
}

/// A mount's `grants.send`, kept until every tenant's addresses are known.
struct SendGrant {
    tenant: String,
    here: String,
    broker: String,
    span: std::ops::Range<usize>,
    patterns: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    #[serde(default)]
    clocks: bool,
    #[serde(default)]
    random: bool,
    env: Option<Spanned<BTreeMap<String, String>>>,
    #[serde(default)]
    output: Output,
    send: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    reply: RawReply,
    http: Option<Spanned<Vec<String>>>,
}

/// `grants.reply`: `true`, `false`, or the address patterns replies may go
/// to.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum RawReply {
    #[default]
    #[serde(skip)]
    Unset,
    Granted(bool),
    To(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMount {
    name: Spanned<String>,
    module: Spanned<PathBuf>,
    address: Spanned<String>,
    node: Option<Node>,
    subscription: Option<Spanned<SubscriptionKind>>,
    subscription_name: Option<Spanned<String>>,
    retry_copies_to: Option<Spanned<RetryCopiesTo>>,
    #[serde(default)]
    settle: Settle,
    max_attempts: Option<Spanned<u32>>,
    dead_letter: Option<Spanned<String>>,
    credit: Option<Spanned<u32>>,
    concurrency: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_duration")]
    timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_size")]
    memory: Option<Spanned<u64>>,
    #[serde(default, deserialize_with = "optional_duration")]
    max_retry_delay: Option<Spanned<Duration>>,
    instance: Option<Spanned<InstanceMode>>,
    instance_max_uses: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_duration")]
    instance_max_idle: Option<Spanned<Duration>>,
    #[serde(default)]
    grants: RawGrants,
    #[serde(default, deserialize_with = "optional_size")]
    max_message_size: Option<Spanned<u64>>,
    retry: Option<RetryChoice>,
    delay: Option<DelayChoice>,
    outputs: Option<OutputsChoice>,
    retry_after_original: Option<RetryAfterOriginal>,
    max_outputs: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    max_output_bytes: Option<Spanned<u64>>,
}

fn optional_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Spanned<Duration>>, D::Error> {
    let text = Spanned::<String>::deserialize(d)?;
    let span = text.span();
    let value = parse_duration(text.get_ref()).map_err(serde::de::Error::custom)?;
    Ok(Some(Spanned::new(span, value)))
}

fn optional_cpu<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Spanned<u32>>, D::Error> {
    let raw = Spanned::<toml::Value>::deserialize(d)?;
    let span = raw.span();
    let value = match raw.get_ref() {
        toml::Value::Integer(n) => parse_cpu(&n.to_string()),
        toml::Value::Float(n) => parse_cpu(&n.to_string()),
        toml::Value::String(text) => parse_cpu(text),
        other => Err(format!(
            "expected cores such as 0.5 or \"250m\", found {}",
            other.type_str()
        )),
    }
    .map_err(serde::de::Error::custom)?;
    Ok(Some(Spanned::new(span, value)))
}

fn optional_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Spanned<u64>>, D::Error> {
    let raw = Spanned::<toml::Value>::deserialize(d)?;
    let span = raw.span();
    let value = match raw.get_ref() {
        toml::Value::Integer(n) => u64::try_from(*n).map_err(|_| format!("`{n}` is negative")),
        toml::Value::String(text) => parse_size(text),
        other => Err(format!(
            "expected a size such as \"64MiB\", found {}",
            other.type_str()
        )),
    }
    .map_err(serde::de::Error::custom)?;
    Ok(Some(Spanned::new(span, value)))
}

impl Config {
    /// Reads, parses and validates a config file. Relative module paths are
    /// resolved against the file's folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates config text; `path` names it in errors and
    /// anchors relative module paths.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            // The parser quotes the offending line and values from it: a
            // broken line may hold a password.
            message: security::redact_quoted(e.to_string().trim_end()),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let checker = Checker { path, text };
        let broker = checker.broker("[broker]", raw.broker)?;
        let mut tenants = Vec::with_capacity(raw.tenants.len());
        let mut tenant_names = HashSet::new();
        // Which tenant uses each address, per broker: an address belongs to
        // one tenant, so no tenant can feed or drain another's.
        let mut owners: HashMap<(String, String), String> = HashMap::new();
        let mut subscriptions: HashMap<(String, String), String> = HashMap::new();
        let mut sends = Vec::new();
        for tenant in raw.tenants {
            checker.name("tenant", &tenant.name)?;
            if !tenant_names.insert(tenant.name.get_ref().clone()) {
                return Err(checker.invalid(
                    &tenant.name,
                    format!("duplicate tenant name `{}`", tenant.name.get_ref()),
                ));
            }
            let tenant_name = tenant.name.get_ref().clone();
            let here = format!("tenant `{tenant_name}`");
            checker.positive(&here, "max_running", &tenant.max_running)?;
            checker.positive(&here, "max_pending_copies", &tenant.max_pending_copies)?;
            checker.positive(&here, "max_buffered", &tenant.max_buffered)?;
            checker.positive(&here, "max_http_connections", &tenant.max_http_connections)?;
            checker.positive(&here, "max_rate", &tenant.max_rate)?;
            if let Some(cpu) = &tenant.max_cpu
                && *cpu.get_ref() == 0
            {
                return Err(checker.invalid(
                    cpu,
                    format!("{here}: `max_cpu` must be at least \"1m\" (a thousandth of a core)"),
                ));
            }
            checker.positive(&here, "log_rate", &tenant.log_rate)?;
            let budget = TenantBudget {
                max_running: tenant.max_running.map(Spanned::into_inner),
                max_memory: tenant.max_memory.as_ref().map(|m| *m.get_ref()),
                max_pending_copies: tenant.max_pending_copies.map(Spanned::into_inner),
                max_buffered: tenant
                    .max_buffered
                    .as_ref()
                    .map_or(TenantBudget::DEFAULT_MAX_BUFFERED, |b| *b.get_ref()),
                max_rate: tenant.max_rate.map(Spanned::into_inner),
                max_cpu: tenant.max_cpu.map(Spanned::into_inner),
                max_http_connections: tenant.max_http_connections.map_or(
                    TenantBudget::DEFAULT_MAX_HTTP_CONNECTIONS,
                    Spanned::into_inner,
                ),
                log_rate: tenant
                    .log_rate
                    .as_ref()
                    .map_or(TenantBudget::DEFAULT_LOG_RATE, |r| *r.get_ref()),
                log_level: tenant.log_level.unwrap_or(TenantBudget::DEFAULT_LOG_LEVEL),
            };
            let tenant_broker = match tenant.broker {
                Some(raw_broker) => Some(own_connection(
                    checker.broker(&format!("{here}: [tenant.broker]"), raw_broker)?,
                    &tenant_name,
                )),
                None => None,
            };
            let broker_url = tenant_broker.as_ref().unwrap_or(&broker).urls.join(",");
            let mut mount_names = HashSet::new();
            let mut mounts = Vec::with_capacity(tenant.mounts.len());
            for mount in tenant.mounts {
                let here = format!("tenant `{tenant_name}`, mount `{}`", mount.name.get_ref());
                checker.name(&format!("tenant `{tenant_name}`: mount"), &mount.name)?;
                if !mount_names.insert(mount.name.get_ref().clone()) {
                    return Err(checker.invalid(
                        &mount.name,
                        format!(
                            "tenant `{tenant_name}`: duplicate mount name `{}`",
                            mount.name.get_ref()
                        ),
                    ));
                }
                // An instance that can never fit would wait for room forever.
                if let Some(max_memory) = &tenant.max_memory {
                    let memory = mount.memory.as_ref().map(|m| (*m.get_ref(), m.span()));
                    let (bytes, span) =
                        memory.unwrap_or((Mount::DEFAULT_MEMORY, max_memory.span()));
                    if bytes > *max_memory.get_ref() {
                        return Err(checker.invalid(
                            &Spanned::new(span, ()),
                            format!(
                                "{here}: `memory` ({bytes} bytes) is larger than the tenant's `max_memory`"
                            ),
                        ));
                    }
                }
                let addresses = std::iter::once(&mount.address).chain(&mount.dead_letter);
                for address in addresses {
                    if let Err(e) = crate::address::plain(address.get_ref()) {
                        return Err(checker.invalid(
                            address,
                            format!(
                                "{here}: address `{}` is refused: {e}",
                                text::shown(address.get_ref())
                            ),
                        ));
                    }
                    // Compared as brokers read them: `/queues/orders` on
                    // RabbitMQ is `orders`.
                    let pattern = AddressPattern::new(address.get_ref().clone());
                    for name in crate::address::pattern_names(BrokerKind::Other, &pattern) {
                        let key = (broker_url.clone(), name.as_str().to_owned());
                        let owner = owners.entry(key).or_insert_with(|| tenant_name.clone());
                        if *owner != tenant_name {
                            return Err(checker.invalid(
                                address,
                                format!(
                                    "{here}: address `{}` already belongs to tenant `{owner}`; tenants cannot share addresses",
                                    address.get_ref()
                                ),
                            ));
                        }
                    }
                }
                if let Some(send) = &mount.grants.send {
                    sends.push(SendGrant {
                        tenant: tenant_name.clone(),
                        here: here.clone(),
                        broker: broker_url.clone(),
                        span: send.span(),
                        patterns: send.get_ref().clone(),
                    });
                }
                let subscription_span = mount
                    .subscription_name
                    .as_ref()
                    .map_or(mount.name.span(), Spanned::span);
                let mount = checker.mount(&here, &tenant_name, base, mount)?;
                // Subscription queues are named across the whole broker: two
                // mounts sharing a name would share (or destroy) its messages.
                if let Some(subscription) = &mount.subscription {
                    let key = (broker_url.clone(), subscription.name.clone());
                    if let Some(first) = subscriptions.insert(key, here.clone()) {
                        return Err(checker.invalid(
                            &Spanned::new(subscription_span, ()),
                            format!(
                                "{here}: subscription `{}` is already the subscription of {first}; give each topic mount a `subscription_name` of its own",
                                subscription.name
                            ),
                        ));
                    }
                }
                mounts.push(mount);
            }
            tenants.push(Tenant {
                broker: tenant_broker,
                name: tenant_name,
                budget,
                mounts,
            });
        }
        checker.sends_stay_home(&sends, &owners)?;
        let admin = raw.admin.map(|a| checker.admin(a)).transpose()?;
        for mount in tenants.iter_mut().flat_map(|t| &mut t.mounts) {
            // Handlers reach the admin listener only through a grant naming it.
            mount.grants.http.admin = admin.as_ref().map(|admin| admin.listen);
            mount.grants.http.allow_private_networks = raw.host.allow_private_networks;
        }
        let retry_key = checker
            .secret(
                "[host]",
                raw.host.retry_key_file.as_ref(),
                raw.host.retry_key_env.as_ref(),
                "retry_key",
            )?
            .map(|secret| RetryKey::new(secret.expose().as_bytes()));
        Ok(Config {
            path: path.to_owned(),
            broker,
            host: raw.host,
            admin,
            telemetry: raw.telemetry,
            tenants,
            retry_key,
        })
    }

    /// The addresses each tenant owns (its mounts' addresses, their
    /// dead-letter addresses, its send grants), which no other tenant's
    /// reply may reach.
    pub fn address_owners(&self) -> AddressOwners {
        AddressOwners::new(self.tenants.iter().map(|tenant| {
            let owned = tenant
                .mounts
                .iter()
                .flat_map(|mount| {
                    [Some(&mount.address), mount.dead_letter.as_ref()]
                        .into_iter()
                        .flatten()
                        .map(AddressPattern::new)
                        .chain(mount.grants.send.iter().cloned())
                })
                .collect();
            (tenant.name.clone(), owned)
        }))
    }

    /// Every mount with the name of its tenant.
    pub fn mounts(&self) -> impl Iterator<Item = (&Tenant, &Mount)> {
        self.tenants
            .iter()
            .flat_map(|t| t.mounts.iter().map(move |m| (t, m)))
    }
}

struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Checker<'_> {
    fn invalid<T>(&self, at: &Spanned<T>, message: String) -> ConfigError {
        let line = self.text[..at.span().start.min(self.text.len())]
            .matches('\n')
            .count()
            + 1;
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line,
            message,
        }
    }

    fn name(&self, what: &str, name: &Spanned<String>) -> Result<(), ConfigError> {
        let ok = !name.get_ref().is_empty()
            && name
                .get_ref()
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if ok {
            Ok(())
        } else {
            Err(self.invalid(
                name,
                format!(
                    "{what} name `{}` must be non-empty and use only letters, digits, `-`, `_` and `.`",
                    name.get_ref()
                ),
            ))
        }
    }

    fn broker(&self, here: &str, raw: RawBroker) -> Result<Broker, ConfigError> {
        let urls = match raw.url.get_ref() {
            RawUrls::One(url) => vec![url.clone()],
            RawUrls::Many(urls) => urls.clone(),
        };
        if urls.is_empty() {
            return Err(self.invalid(&raw.url, format!("{here}: `url` lists no broker")));
        }
        let mut endpoints = Vec::with_capacity(urls.len());
        for url in &urls {
            match crate::endpoint::Endpoint::parse(url) {
                Ok(endpoint) => endpoints.push(endpoint),
                Err(why) => return Err(self.invalid(&raw.url, format!("{here}: `url`: {why}"))),
            }
        }
        let (credentials, tls) = self.broker_security(
            here,
            &endpoints,
            security::RawBrokerSecurity {
                url: Spanned::new(raw.url.span(), ()),
                user: raw.user,
                password_file: raw.password_file,
                password_env: raw.password_env,
                sasl: raw.sasl,
                allow_plain_without_tls: raw.allow_plain_without_tls,
                tls: raw.tls,
            },
        )?;
        let defaults = Broker::at("");
        let reconnect = BackoffPolicy {
            initial: self.timeout(
                here,
                "reconnect_initial",
                raw.reconnect_initial,
                defaults.reconnect.initial,
            )?,
            max: self.timeout(
                here,
                "reconnect_max",
                raw.reconnect_max,
                defaults.reconnect.max,
            )?,
        };
        if reconnect.max < reconnect.initial {
            return Err(self.invalid(
                &raw.url,
                format!("{here}: `reconnect_max` is shorter than `reconnect_initial`"),
            ));
        }
        Ok(Broker {
            urls,
            container_id: raw.container_id.unwrap_or_else(default_container_id),
            connect_timeout: self.timeout(
                here,
                "connect_timeout",
                raw.connect_timeout,
                defaults.connect_timeout,
            )?,
            idle_timeout: self.timeout(
                here,
                "idle_timeout",
                raw.idle_timeout,
                defaults.idle_timeout,
            )?,
            attach_timeout: self.timeout(
                here,
                "attach_timeout",
                raw.attach_timeout,
                defaults.attach_timeout,
            )?,
            publish_timeout: self.timeout(
                here,
                "publish_timeout",
                raw.publish_timeout,
                defaults.publish_timeout,
            )?,
            reconnect,
            credentials,
            tls,
        })
    }

    fn admin(&self, raw: RawAdmin) -> Result<Admin, ConfigError> {
        let here = "[admin]";
        let token = self.secret(
            here,
            raw.token_file.as_ref(),
            raw.token_env.as_ref(),
            "token",
        )?;
        let listen = *raw.listen.get_ref();
        if token.is_none() && !listen.ip().is_loopback() {
            return Err(self.invalid(
                &raw.listen,
                format!(
                    "{here}: `listen = \"{listen}\"` is reachable from other machines; set `token_file` or `token_env`, or listen on loopback"
                ),
            ));
        }
        Ok(Admin { listen, token })
    }

    /// A time-out or wait that must be longer than zero, or its default.
    fn timeout(
        &self,
        here: &str,
        key: &str,
        value: Option<Spanned<Duration>>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            Some(v) if v.get_ref().is_zero() => {
                Err(self.invalid(&v, format!("{here}: `{key}` must be longer than zero")))
            }
            Some(v) => Ok(v.into_inner()),
            None => Ok(default),
        }
    }

    fn positive<T: PartialEq + From<u8>>(
        &self,
        here: &str,
        key: &str,
        value: &Option<Spanned<T>>,
    ) -> Result<(), ConfigError> {
        match value {
            Some(v) if *v.get_ref() == T::from(0) => {
                Err(self.invalid(v, format!("{here}: `{key}` must be at least 1")))
            }
            _ => Ok(()),
        }
    }

    /// A topic mount's subscription: durable and shared unless it says
    /// otherwise, named after tenant and mount unless it names one.
    fn topic_subscription(
        &self,
        here: &str,
        tenant: &str,
        raw: &RawMount,
    ) -> Result<Option<TopicSubscription>, ConfigError> {
        if raw.node != Some(Node::Topic) {
            self.only_with(
                here,
                "`node = \"topic\"`",
                &[
                    (raw.subscription.as_ref().map(Spanned::span), "subscription"),
                    (
                        raw.subscription_name.as_ref().map(Spanned::span),
                        "subscription_name",
                    ),
                    (
                        raw.retry_copies_to.as_ref().map(Spanned::span),
                        "retry_copies_to",
                    ),
                ],
            )?;
            return Ok(None);
        }
        let kind = raw
            .subscription
            .as_ref()
            .map_or(SubscriptionKind::default(), |k| *k.get_ref());
        let name = match &raw.subscription_name {
            Some(name) => {
                self.name(&format!("{here}: subscription"), name)?;
                name.get_ref().clone()
            }
            None => format!("wharf.{tenant}.{}", raw.name.get_ref()),
        };
        let retry_copies_to = raw
            .retry_copies_to
            .as_ref()
            .map_or(RetryCopiesTo::default(), |to| *to.get_ref());
        if let Some(to) = &raw.retry_copies_to
            && *to.get_ref() == RetryCopiesTo::Subscription
            && kind == SubscriptionKind::Volatile
        {
            return Err(self.invalid(
                to,
                format!(
                    "{here}: `retry_copies_to = \"subscription\"` needs a durable subscription: a volatile one has no name to address"
                ),
            ));
        }
        Ok(Some(TopicSubscription {
            kind,
            name,
            retry_copies_to,
        }))
    }

    fn mount(
        &self,
        here: &str,
        tenant: &str,
        base: &Path,
        raw: RawMount,
    ) -> Result<Mount, ConfigError> {
        let module = base.join(raw.module.get_ref());
        if !module.is_file() {
            return Err(self.invalid(
                &raw.module,
                format!("{here}: module `{}` does not exist", module.display()),
            ));
        }
        if raw.address.get_ref().is_empty() {
            return Err(self.invalid(&raw.address, format!("{here}: `address` is empty")));
        }
        if let Some(dla) = &raw.dead_letter
            && (dla.get_ref().is_empty() || dla.get_ref() == raw.address.get_ref())
        {
            return Err(self.invalid(
                dla,
                format!(
                    "{here}: `dead_letter` must be a non-empty address other than the mount's own `{}`",
                    raw.address.get_ref()
                ),
            ));
        }
        self.positive(here, "max_attempts", &raw.max_attempts)?;
        self.positive(here, "credit", &raw.credit)?;
        self.positive(here, "concurrency", &raw.concurrency)?;
        if let Some(t) = &raw.timeout
            && t.get_ref().is_zero()
        {
            return Err(self.invalid(t, format!("{here}: `timeout` must be longer than zero")));
        }
        if let Some(m) = &raw.memory
            && *m.get_ref() < 1 << 20
        {
            return Err(self.invalid(m, format!("{here}: `memory` must be at least 1MiB")));
        }
        if let Some(m) = &raw.memory
            && *m.get_ref() > Mount::MAX_MEMORY
        {
            return Err(self.invalid(
                m,
                format!(
                    "{here}: `memory` must be at most 4GiB, all a 32-bit linear memory can address"
                ),
            ));
        }
        if let Some(size) = &raw.max_message_size
            && *size.get_ref() < 1024
        {
            return Err(self.invalid(
                size,
                format!("{here}: `max_message_size` must be at least 1KiB"),
            ));
        }
        let instance = self.instance_policy(here, &raw)?;
        let subscription = self.topic_subscription(here, tenant, &raw)?;
        self.positive(here, "max_outputs", &raw.max_outputs)?;
        self.positive(here, "max_output_bytes", &raw.max_output_bytes)?;
        let outputs = OutputLimits {
            max_outputs: raw
                .max_outputs
                .map_or(OutputLimits::DEFAULT_MAX_OUTPUTS, Spanned::into_inner),
            max_output_bytes: raw
                .max_output_bytes
                .map_or(OutputLimits::DEFAULT_MAX_OUTPUT_BYTES, Spanned::into_inner),
        };
        let grants = self.grants(here, raw.grants, outputs)?;
        Ok(Mount {
            name: raw.name.into_inner(),
            module,
            address: raw.address.into_inner(),
            node: raw.node,
            subscription,
            settle: raw.settle,
            max_attempts: raw.max_attempts.map(Spanned::into_inner),
            dead_letter: raw.dead_letter.map(Spanned::into_inner),
            credit: raw
                .credit
                .map_or(Mount::DEFAULT_CREDIT, Spanned::into_inner),
            concurrency: raw
                .concurrency
                .map_or(Mount::DEFAULT_CONCURRENCY, Spanned::into_inner),
            timeout: raw
                .timeout
                .map_or(Mount::DEFAULT_TIMEOUT, Spanned::into_inner),
            memory: raw
                .memory
                .map_or(Mount::DEFAULT_MEMORY, Spanned::into_inner),
            max_retry_delay: raw
                .max_retry_delay
                .map_or(Mount::DEFAULT_MAX_RETRY_DELAY, Spanned::into_inner),
            instance,
            grants,
            max_message_size: raw
                .max_message_size
                .map_or(Mount::DEFAULT_MAX_MESSAGE_SIZE, Spanned::into_inner),
            retry: raw.retry,
            delay: raw.delay,
            outputs: raw.outputs,
            retry_after_original: raw.retry_after_original,
        })
    }

    /// A wildcard in `grants.send` never reaches another tenant's address:
    /// granting one takes writing it out in full.
    fn sends_stay_home(
        &self,
        sends: &[SendGrant],
        owners: &HashMap<(String, String), String>,
    ) -> Result<(), ConfigError> {
        for grant in sends {
            for pattern in grant.patterns.iter().map(AddressPattern::new) {
                if pattern.is_literal() {
                    continue;
                }
                let read = crate::address::pattern_names(BrokerKind::Other, &pattern);
                let foreign = owners.iter().find(|((broker, address), owner)| {
                    *broker == grant.broker
                        && **owner != grant.tenant
                        && read.iter().any(|p| p.matches(address))
                });
                if let Some(((_, address), owner)) = foreign {
                    return Err(self.invalid(
                        &Spanned::new(grant.span.clone(), ()),
                        format!(
                            "{}: `grants.send` pattern `{}` matches `{address}`, an address of tenant `{owner}`; name it in full to grant it",
                            grant.here,
                            pattern.as_str()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Refuses the first of `keys` that is set: each only applies with
    /// `condition`.
    fn only_with(
        &self,
        here: &str,
        condition: &str,
        keys: &[(Option<std::ops::Range<usize>>, &str)],
    ) -> Result<(), ConfigError> {
        match keys
            .iter()
            .find_map(|(span, key)| Some((span.clone()?, key)))
        {
            Some((span, key)) => Err(self.invalid(
                &Spanned::new(span, ()),
                format!("{here}: `{key}` only applies with {condition}"),
            )),
            None => Ok(()),
        }
    }

    fn instance_policy(&self, here: &str, raw: &RawMount) -> Result<InstancePolicy, ConfigError> {
        self.positive(here, "instance_max_uses", &raw.instance_max_uses)?;
        let reuse = raw
            .instance
            .as_ref()
            .is_some_and(|mode| *mode.get_ref() == InstanceMode::Reuse);
        if !reuse {
            self.only_with(
                here,
                "`instance = \"reuse\"`",
                &[
                    (
                        raw.instance_max_uses.as_ref().map(Spanned::span),
                        "instance_max_uses",
                    ),
                    (
                        raw.instance_max_idle.as_ref().map(Spanned::span),
                        "instance_max_idle",
                    ),
                ],
            )?;
            return Ok(InstancePolicy::PerDelivery);
        }
        Ok(InstancePolicy::Reuse {
            max_uses: raw
                .instance_max_uses
                .as_ref()
                .map_or(Mount::DEFAULT_INSTANCE_MAX_USES, |v| *v.get_ref()),
            max_idle: raw
                .instance_max_idle
                .as_ref()
                .map_or(Mount::DEFAULT_INSTANCE_MAX_IDLE, |v| *v.get_ref()),
        })
    }

    fn grants(
        &self,
        here: &str,
        raw: RawGrants,
        outputs: OutputLimits,
    ) -> Result<Grants, ConfigError> {
        if let Some(send) = &raw.send
            && let Some(bad) = send.get_ref().iter().find(|p| p.is_empty())
        {
            return Err(self.invalid(
                send,
                format!("{here}: `grants.send` has an empty address pattern `{bad}`"),
            ));
        }
        let mut http = HttpGrants::default();
        if let Some(patterns) = &raw.http {
            for pattern in patterns.get_ref() {
                let parsed = HttpPattern::parse(pattern)
                    .map_err(|e| self.invalid(patterns, format!("{here}: `grants.http`: {e}")))?;
                http.allowed.push(parsed);
            }
        }
        if let Some(env) = &raw.env
            && let Some(bad) = env
                .get_ref()
                .keys()
                .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(self.invalid(
                env,
                format!("{here}: `grants.env` has an invalid variable name `{bad}`"),
            ));
        }
        Ok(Grants {
            clocks: raw.clocks,
            random: raw.random,
            env: raw.env.map(Spanned::into_inner).unwrap_or_default(),
            output: raw.output,
            send: raw
                .send
                .map(Spanned::into_inner)
                .unwrap_or_default()
                .into_iter()
                .map(AddressPattern::new)
                .collect(),
            reply: match raw.reply {
                RawReply::Unset | RawReply::Granted(false) => ReplyGrant::Denied,
                RawReply::Granted(true) => ReplyGrant::Any,
                RawReply::To(patterns) => {
                    ReplyGrant::To(patterns.into_iter().map(AddressPattern::new).collect())
                }
            },
            outputs,
            http,
        })
    }
}

#[cfg(test)]
mod tests;
