//! The `wharf.toml` file: brokers, tenants and their mounts.
//!
//! Loading refuses anything it does not understand, naming the file, the line
//! and the key: unknown keys, bad durations or sizes, duplicate names, missing
//! modules, dead-letter addresses that would loop back to the subscription.

mod checks;
mod defaults;
mod raw;
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
pub use crate::ordering::OrderBy;
use crate::retry_key::RetryKey;
use crate::text;
pub use defaults::reference;
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
    /// A mount names a module file that is not there (yet: a reload is
    /// tried again when it arrives).
    #[error("config file `{path}`, line {line}: {here}: module `{}` does not exist", module.display())]
    ModuleMissing {
        /// The config file.
        path: PathBuf,
        /// The line of the `module` key.
        line: usize,
        /// The tenant and mount.
        here: String,
        /// The module file, as the config resolves it.
        module: PathBuf,
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
    /// Every file it was made of: `path`, then the files of tenants its
    /// `include` names (a file, or a folder's `*.toml` files and its
    /// subfolders', so each team's tenants can live in a ConfigMap of its
    /// own); a change to any of them reloads the config.
    pub files: Vec<PathBuf>,
    /// The default broker connection.
    pub broker: Broker,
    /// Host-wide settings.
    pub host: HostSettings,
    /// The admin listener, if any.
    pub admin: Option<Admin>,
    /// Trace export: off unless an endpoint is configured here or in the
    /// `OTEL_*` environment.
    pub telemetry: Telemetry,
    /// Every tenant, in file order (the main file's, then each included
    /// file's).
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
    /// A folder where compiled modules are kept between starts, keyed by
    /// the module's digest and the engine's settings, so a restart does not
    /// compile again (relative to the config file's folder). Only wharf may
    /// write there: what it holds is loaded as machine code.
    #[serde(default)]
    pub module_cache: Option<PathBuf>,
    /// How modules named `oci://…` are pulled.
    #[serde(default)]
    pub registry: RegistrySettings,
}

/// `[host.registry]`: how modules named `oci://…` are pulled. They are
/// kept under `module_cache`, so a restart with the registry away still
/// starts with the last version pulled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// A Docker `config.json` (a `kubernetes.io/dockerconfigjson` Secret's
    /// key) with each registry's credentials, read at every pull so a
    /// rotated Secret takes effect; registries not in it are pulled from
    /// anonymously. Relative to the config file's folder.
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// How often tags are resolved again; a tag that moved reloads the
    /// modules pulled from it.
    #[serde(
        default = "default_registry_poll",
        deserialize_with = "units::duration"
    )]
    pub poll: Duration,
    /// Registries (`host:port`) spoken to over plain HTTP instead of HTTPS.
    #[serde(default)]
    pub plain_http: Vec<String>,
    /// The largest module pulled; a registry offering a larger one is
    /// refused before its bytes are read.
    #[serde(default = "default_max_module_size", deserialize_with = "units::size")]
    pub max_module_size: u64,
}

impl RegistrySettings {
    /// Default `poll`.
    pub const DEFAULT_POLL: Duration = Duration::from_secs(60);
    /// Default `max_module_size`: Python and JavaScript components are
    /// tens of MiB.
    pub const DEFAULT_MAX_MODULE_SIZE: u64 = 128 << 20;
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            credentials: None,
            poll: RegistrySettings::DEFAULT_POLL,
            plain_http: Vec::new(),
            max_module_size: RegistrySettings::DEFAULT_MAX_MODULE_SIZE,
        }
    }
}

fn default_registry_poll() -> Duration {
    RegistrySettings::DEFAULT_POLL
}

fn default_max_module_size() -> u64 {
    RegistrySettings::DEFAULT_MAX_MODULE_SIZE
}

impl HostSettings {
    /// Default `shutdown_grace`.
    pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// Default `max_instances`.
    pub const DEFAULT_MAX_INSTANCES: u32 = 1000;
    /// Default `max_buffered`.
    pub const DEFAULT_MAX_BUFFERED: u64 = 1 << 30;
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings {
            shutdown_grace: HostSettings::DEFAULT_SHUTDOWN_GRACE,
            max_instances: HostSettings::DEFAULT_MAX_INSTANCES,
            max_buffered: HostSettings::DEFAULT_MAX_BUFFERED,
            retry_key_file: None,
            retry_key_env: None,
            allow_private_networks: false,
            module_cache: None,
            registry: RegistrySettings::default(),
        }
    }
}

fn default_max_buffered() -> u64 {
    HostSettings::DEFAULT_MAX_BUFFERED
}

fn default_max_instances() -> u32 {
    HostSettings::DEFAULT_MAX_INSTANCES
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
    /// The handler component, resolved against the config file's folder;
    /// for a module pulled from a registry, the file under `module_cache`
    /// where the version pulled is kept.
    pub module: PathBuf,
    /// Where the module is pulled from, when the config names it
    /// `oci://…`.
    pub pulled_from: Option<crate::oci::ModuleReference>,
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
    /// What deliveries are ordered by, if they are: one of a key at a
    /// time, in the order the broker delivered them.
    pub order_by: Option<OrderBy>,
    /// On an ordered mount, the most keys with a delivery running or
    /// waiting; the link's credit is withheld while there are as many.
    pub max_keys: u32,
    /// Starts paused: attached without credit until resumed through the
    /// admin listener. A reload applies it only when it changes, so an
    /// operator's pause or resume holds across reloads otherwise.
    pub paused: bool,
    /// The circuit breaker that pauses the mount while too many attempts
    /// fail; off without `[tenant.mount.breaker]`.
    pub breaker: Option<crate::breaker::BreakerPolicy>,
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
    /// Default bound on an ordered mount's keys in flight.
    pub const DEFAULT_MAX_KEYS: u32 = 10_000;
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

fn default_container_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    format!("wharf-{host}-{}", std::process::id())
}

fn default_grace() -> Duration {
    HostSettings::DEFAULT_SHUTDOWN_GRACE
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
        checks::parse(text, path)
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

#[cfg(test)]
mod tests;
