//! The config file as written: what TOML decodes into before the checks
//! (`checks`) make a [`Config`](super::Config) of it.

use super::*;

/// How a mount asks for instances, as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum InstanceMode {
    PerDelivery,
    Reuse,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) broker: RawBroker,
    #[serde(default)]
    pub(super) host: HostSettings,
    pub(super) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(super) telemetry: Telemetry,
    #[serde(default, rename = "tenant")]
    pub(super) tenants: Vec<RawTenant>,
    /// Files and folders of further tenants (see [`Config::files`]).
    #[serde(default)]
    pub(super) include: Vec<Spanned<PathBuf>>,
}

/// A file of tenants named by `include`: nothing but `[[tenant]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenantFile {
    #[serde(default, rename = "tenant")]
    pub(super) tenants: Vec<RawTenant>,
}

/// One URL, or the nodes of a cluster.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawUrls {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub(super) listen: Spanned<SocketAddr>,
    pub(super) token_file: Option<Spanned<PathBuf>>,
    pub(super) token_env: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBroker {
    pub(super) url: Spanned<RawUrls>,
    pub(super) container_id: Option<String>,
    pub(super) user: Option<Spanned<String>>,
    pub(super) password_file: Option<Spanned<PathBuf>>,
    pub(super) password_env: Option<Spanned<String>>,
    pub(super) sasl: Option<Spanned<SaslMechanism>>,
    #[serde(default)]
    pub(super) allow_plain_without_tls: bool,
    pub(super) tls: Option<Spanned<RawTls>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) connect_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) idle_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) attach_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) publish_timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) reconnect_initial: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) reconnect_max: Option<Spanned<Duration>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub(super) name: Spanned<String>,
    pub(super) broker: Option<RawBroker>,
    pub(super) max_running: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    pub(super) max_memory: Option<Spanned<u64>>,
    pub(super) max_pending_copies: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    pub(super) max_buffered: Option<Spanned<u64>>,
    pub(super) max_rate: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_cpu")]
    pub(super) max_cpu: Option<Spanned<u32>>,
    pub(super) max_http_connections: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    pub(super) log_rate: Option<Spanned<u64>>,
    pub(super) log_level: Option<LogLevel>,
    #[serde(default, rename = "mount")]
    pub(super) mounts: Vec<RawMount>,
}

/// A mount's `grants.send`, kept until every tenant's addresses are known.
pub(super) struct SendGrant {
    pub(super) tenant: String,
    pub(super) here: String,
    /// The nodes of the tenant's broker.
    pub(super) broker_nodes: Vec<String>,
    /// The file and line of the grant.
    pub(super) file: PathBuf,
    pub(super) line: usize,
    pub(super) patterns: Vec<String>,
}

/// `[tenant.mount.breaker]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    pub(super) failure_rate: Option<Spanned<f64>>,
    pub(super) min_deliveries: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) window: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) open_for: Option<Spanned<Duration>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrants {
    #[serde(default)]
    pub(super) clocks: bool,
    #[serde(default)]
    pub(super) random: bool,
    pub(super) env: Option<Spanned<BTreeMap<String, String>>>,
    #[serde(default)]
    pub(super) output: Output,
    pub(super) send: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(super) reply: RawReply,
    pub(super) http: Option<Spanned<Vec<String>>>,
}

/// `grants.reply`: `true`, `false`, or the address patterns replies may go
/// to.
#[derive(Deserialize, Default)]
#[serde(untagged)]
pub(super) enum RawReply {
    #[default]
    #[serde(skip)]
    Unset,
    Granted(bool),
    To(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMount {
    pub(super) name: Spanned<String>,
    pub(super) module: Spanned<PathBuf>,
    pub(super) address: Spanned<String>,
    pub(super) node: Option<Node>,
    pub(super) subscription: Option<Spanned<SubscriptionKind>>,
    pub(super) subscription_name: Option<Spanned<String>>,
    pub(super) retry_copies_to: Option<Spanned<RetryCopiesTo>>,
    #[serde(default)]
    pub(super) settle: Settle,
    pub(super) max_attempts: Option<Spanned<u32>>,
    pub(super) dead_letter: Option<Spanned<String>>,
    pub(super) credit: Option<Spanned<u32>>,
    pub(super) concurrency: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "optional_size")]
    pub(super) memory: Option<Spanned<u64>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) max_retry_delay: Option<Spanned<Duration>>,
    pub(super) instance: Option<Spanned<InstanceMode>>,
    pub(super) instance_max_uses: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_duration")]
    pub(super) instance_max_idle: Option<Spanned<Duration>>,
    #[serde(default)]
    pub(super) grants: RawGrants,
    #[serde(default, deserialize_with = "optional_size")]
    pub(super) max_message_size: Option<Spanned<u64>>,
    pub(super) retry: Option<Spanned<RetryChoice>>,
    pub(super) delay: Option<Spanned<DelayChoice>>,
    pub(super) outputs: Option<OutputsChoice>,
    pub(super) retry_after_original: Option<Spanned<RetryAfterOriginal>>,
    pub(super) order_by: Option<Spanned<OrderBy>>,
    pub(super) max_keys: Option<Spanned<u32>>,
    #[serde(default)]
    pub(super) paused: bool,
    pub(super) breaker: Option<Spanned<RawBreaker>>,
    pub(super) max_outputs: Option<Spanned<u32>>,
    #[serde(default, deserialize_with = "optional_size")]
    pub(super) max_output_bytes: Option<Spanned<u64>>,
}

pub(super) fn optional_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Spanned<Duration>>, D::Error> {
    let text = Spanned::<String>::deserialize(d)?;
    let span = text.span();
    let value = parse_duration(text.get_ref()).map_err(serde::de::Error::custom)?;
    Ok(Some(Spanned::new(span, value)))
}

pub(super) fn optional_cpu<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Spanned<u32>>, D::Error> {
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

pub(super) fn optional_size<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Spanned<u64>>, D::Error> {
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

/// `[broker.tls]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) ca_file: Option<PathBuf>,
    pub(super) server_name: Option<String>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
}

/// The security keys of a `[broker]` table as written.
pub(super) struct RawBrokerSecurity {
    pub(super) url: Spanned<()>,
    pub(super) user: Option<Spanned<String>>,
    pub(super) password_file: Option<Spanned<PathBuf>>,
    pub(super) password_env: Option<Spanned<String>>,
    pub(super) sasl: Option<Spanned<SaslMechanism>>,
    pub(super) allow_plain_without_tls: bool,
    pub(super) tls: Option<Spanned<RawTls>>,
}
