//! What makes a config valid: every check of the file as written, each
//! error naming the file, the line and the key.

use super::raw::*;
use super::*;
use crate::breaker::BreakerPolicy;
use crate::endpoint::Endpoint;
use crate::oci::ModuleReference;

/// A tenant's broker, its container id made unique to the tenant when left
/// at the default: brokers may refuse a second connection with the same id.
fn own_connection(mut broker: Broker, tenant: &str) -> Broker {
    if broker.container_id == default_container_id() {
        broker.container_id = format!("{}-{tenant}", broker.container_id);
    }
    broker
}

/// Parses and checks config text (see [`Config::parse`]), with the files
/// of tenants it includes.
pub(super) fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let raw: RawConfig = from_toml(text, path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut host = raw.host;
    host.module_cache = host.module_cache.map(|folder| base.join(folder));
    host.registry.credentials = host.registry.credentials.map(|file| base.join(file));
    let checker = Checker {
        path,
        text,
        module_cache: host.module_cache.as_deref(),
    };
    let broker = checker.broker("[broker]", raw.broker)?;
    let mut seen = Seen::default();
    let mut tenants = Vec::with_capacity(raw.tenants.len());
    for tenant in raw.tenants {
        tenants.push(checker.tenant(tenant, &broker, base, &mut seen)?);
    }
    let mut files = vec![path.to_owned()];
    for included in checker.included(&raw.include, base)? {
        let text = std::fs::read_to_string(&included).map_err(|source| ConfigError::Read {
            path: included.clone(),
            source,
        })?;
        let raw: RawTenantFile = from_toml(&text, &included)?;
        let checker = Checker {
            path: &included,
            text: &text,
            module_cache: host.module_cache.as_deref(),
        };
        let base = included.parent().unwrap_or(Path::new("."));
        for tenant in raw.tenants {
            tenants.push(checker.tenant(tenant, &broker, base, &mut seen)?);
        }
        files.push(included);
    }
    sends_stay_home(&seen.sends, &seen.owners)?;
    let admin = raw.admin.map(|a| checker.admin(a)).transpose()?;
    for mount in tenants.iter_mut().flat_map(|t| &mut t.mounts) {
        // Handlers reach the admin listener only through a grant naming it.
        mount.grants.http.admin = admin.as_ref().map(|admin| admin.listen);
        mount.grants.http.allow_private_networks = host.allow_private_networks;
    }
    let retry_key = checker
        .secret(
            "[host]",
            host.retry_key_file.as_ref(),
            host.retry_key_env.as_ref(),
            "retry_key",
        )?
        .map(|secret| RetryKey::new(secret.expose().as_bytes()));
    Ok(Config {
        path: path.to_owned(),
        files,
        broker,
        host,
        admin,
        telemetry: raw.telemetry,
        tenants,
        retry_key,
    })
}

/// TOML decoded into `T`, or an error naming `path`.
fn from_toml<T: serde::de::DeserializeOwned>(text: &str, path: &Path) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        // The parser quotes the offending line and values from it: a
        // broken line may hold a password.
        message: security::redact_quoted(e.to_string().trim_end()),
    })
}

/// How deep below an included folder tenant files are looked for: its
/// subfolders (one per ConfigMap), not further.
const INCLUDE_DEPTH: u32 = 1;

/// The `*.toml` files in `folder` and, `depth` levels down, its
/// subfolders, sorted by path; hidden entries skipped.
fn toml_files(folder: &Path, depth: u32, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(folder)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        let hidden = path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            if depth > 0 {
                toml_files(&path, depth - 1, files)?;
            }
        } else if path.extension().is_some_and(|ext| ext == "toml") {
            files.push(path);
        }
    }
    Ok(())
}

/// What the tenants checked so far have taken.
#[derive(Default)]
struct Seen {
    tenant_names: HashSet<String>,
    /// Which tenant uses each address, per broker node: an address belongs
    /// to one tenant, so no tenant can feed or drain another's.
    owners: HashMap<(String, String), String>,
    /// Which mount has each subscription, per broker node.
    subscriptions: HashMap<(String, String), String>,
    /// Send grants, checked once every tenant's addresses are known.
    sends: Vec<SendGrant>,
}

/// The tenant a mount is checked in.
struct InTenant<'a> {
    name: &'a str,
    max_memory: Option<&'a Spanned<u64>>,
    /// The nodes of the broker its mounts use, which addresses belong to
    /// ([`crate::endpoint::Endpoint::node`]): one broker however its URLs
    /// are spelt.
    broker_nodes: &'a [String],
    /// The config file's folder, which module paths are relative to.
    base: &'a Path,
}

impl Checker<'_> {
    fn tenant(
        &self,
        tenant: RawTenant,
        broker: &Broker,
        base: &Path,
        seen: &mut Seen,
    ) -> Result<Tenant, ConfigError> {
        self.name("tenant", &tenant.name)?;
        if !seen.tenant_names.insert(tenant.name.get_ref().clone()) {
            return Err(self.invalid(
                &tenant.name,
                format!("duplicate tenant name `{}`", tenant.name.get_ref()),
            ));
        }
        let tenant_name = tenant.name.get_ref().clone();
        let here = format!("tenant `{tenant_name}`");
        let budget = self.budget(&here, &tenant)?;
        let tenant_broker = match tenant.broker {
            Some(raw_broker) => Some(own_connection(
                self.broker(&format!("{here}: [tenant.broker]"), raw_broker)?,
                &tenant_name,
            )),
            None => None,
        };
        let broker_nodes = nodes(tenant_broker.as_ref().unwrap_or(broker));
        let within = InTenant {
            name: &tenant_name,
            max_memory: tenant.max_memory.as_ref(),
            broker_nodes: &broker_nodes,
            base,
        };
        let mut mount_names = HashSet::new();
        let mut mounts = Vec::with_capacity(tenant.mounts.len());
        for mount in tenant.mounts {
            mounts.push(self.mount_in(mount, &within, &mut mount_names, seen)?);
        }
        Ok(Tenant {
            broker: tenant_broker,
            name: tenant_name,
            budget,
            mounts,
        })
    }

    /// A tenant's budget, its limits checked.
    fn budget(&self, here: &str, tenant: &RawTenant) -> Result<TenantBudget, ConfigError> {
        self.positive(here, "max_running", &tenant.max_running)?;
        self.positive(here, "max_pending_copies", &tenant.max_pending_copies)?;
        self.positive(here, "max_buffered", &tenant.max_buffered)?;
        self.positive(here, "max_http_connections", &tenant.max_http_connections)?;
        self.positive(here, "max_rate", &tenant.max_rate)?;
        if let Some(cpu) = &tenant.max_cpu
            && *cpu.get_ref() == 0
        {
            return Err(self.invalid(
                cpu,
                format!("{here}: `max_cpu` must be at least \"1m\" (a thousandth of a core)"),
            ));
        }
        self.positive(here, "log_rate", &tenant.log_rate)?;
        Ok(TenantBudget {
            max_running: tenant.max_running.as_ref().map(|n| *n.get_ref()),
            max_memory: tenant.max_memory.as_ref().map(|m| *m.get_ref()),
            max_pending_copies: tenant.max_pending_copies.as_ref().map(|n| *n.get_ref()),
            max_buffered: tenant
                .max_buffered
                .as_ref()
                .map_or(TenantBudget::DEFAULT_MAX_BUFFERED, |b| *b.get_ref()),
            max_rate: tenant.max_rate.as_ref().map(|n| *n.get_ref()),
            max_cpu: tenant.max_cpu.as_ref().map(|n| *n.get_ref()),
            max_http_connections: tenant
                .max_http_connections
                .as_ref()
                .map_or(TenantBudget::DEFAULT_MAX_HTTP_CONNECTIONS, |n| *n.get_ref()),
            log_rate: tenant
                .log_rate
                .as_ref()
                .map_or(TenantBudget::DEFAULT_LOG_RATE, |r| *r.get_ref()),
            log_level: tenant.log_level.unwrap_or(TenantBudget::DEFAULT_LOG_LEVEL),
        })
    }

    /// A mount of the tenant `within`, checked against what the tenants
    /// before it (and its own earlier mounts, `names`) have taken.
    fn mount_in(
        &self,
        mount: RawMount,
        within: &InTenant<'_>,
        names: &mut HashSet<String>,
        seen: &mut Seen,
    ) -> Result<Mount, ConfigError> {
        let tenant_name = within.name;
        let here = format!("tenant `{tenant_name}`, mount `{}`", mount.name.get_ref());
        self.name(&format!("tenant `{tenant_name}`: mount"), &mount.name)?;
        if !names.insert(mount.name.get_ref().clone()) {
            return Err(self.invalid(
                &mount.name,
                format!(
                    "tenant `{tenant_name}`: duplicate mount name `{}`",
                    mount.name.get_ref()
                ),
            ));
        }
        // An instance that can never fit would wait for room forever.
        if let Some(max_memory) = within.max_memory {
            let memory = mount.memory.as_ref().map(|m| (*m.get_ref(), m.span()));
            let (bytes, span) = memory.unwrap_or((Mount::DEFAULT_MEMORY, max_memory.span()));
            if bytes > *max_memory.get_ref() {
                return Err(self.invalid(
                    &Spanned::new(span, ()),
                    format!(
                        "{here}: `memory` ({bytes} bytes) is larger than the tenant's `max_memory`"
                    ),
                ));
            }
        }
        let addresses = std::iter::once(&mount.address).chain(&mount.dead_letter);
        for address in addresses {
            self.owned_address(&here, address, within, &mut seen.owners)?;
        }
        if let Some(send) = &mount.grants.send {
            seen.sends.push(SendGrant {
                tenant: tenant_name.to_owned(),
                here: here.clone(),
                broker_nodes: within.broker_nodes.to_vec(),
                file: self.path.to_owned(),
                line: self.line(send),
                patterns: send.get_ref().clone(),
            });
        }
        let subscription_span = mount
            .subscription_name
            .as_ref()
            .map_or(mount.name.span(), Spanned::span);
        let mount = self.mount(&here, tenant_name, within.base, mount)?;
        // Subscription queues are named across the whole broker: two
        // mounts sharing a name would share (or destroy) its messages.
        if let Some(subscription) = &mount.subscription {
            let first = within.broker_nodes.iter().find_map(|node| {
                let key = (node.clone(), subscription.name.clone());
                seen.subscriptions.insert(key, here.clone())
            });
            if let Some(first) = first {
                return Err(self.invalid(
                    &Spanned::new(subscription_span, ()),
                    format!(
                        "{here}: subscription `{}` is already the subscription of {first}; give each topic mount a `subscription_name` of its own",
                        subscription.name
                    ),
                ));
            }
        }
        Ok(mount)
    }

    /// An address of a mount in `within`: plain, and no other tenant's.
    fn owned_address(
        &self,
        here: &str,
        address: &Spanned<String>,
        within: &InTenant<'_>,
        owners: &mut HashMap<(String, String), String>,
    ) -> Result<(), ConfigError> {
        if let Err(e) = crate::address::plain(address.get_ref()) {
            return Err(self.invalid(
                address,
                format!(
                    "{here}: address `{}` is refused: {e}",
                    text::shown(address.get_ref())
                ),
            ));
        }
        // Compared as brokers read them: `/queues/orders` on RabbitMQ is
        // `orders`.
        let pattern = AddressPattern::new(address.get_ref().clone());
        for (name, node) in crate::address::pattern_names(BrokerKind::Other, &pattern)
            .iter()
            .flat_map(|name| within.broker_nodes.iter().map(move |node| (name, node)))
        {
            let key = (node.clone(), name.as_str().to_owned());
            let owner = owners.entry(key).or_insert_with(|| within.name.to_owned());
            if owner != within.name {
                return Err(self.invalid(
                    address,
                    format!(
                        "{here}: address `{}` already belongs to tenant `{owner}`; tenants cannot share addresses",
                        address.get_ref()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The first of `keys` the config sets, with where it sets it.
fn first_set<'k>(
    keys: &[(Option<std::ops::Range<usize>>, &'k str)],
) -> Option<(std::ops::Range<usize>, &'k str)> {
    keys.iter()
        .find_map(|(span, key)| Some((span.clone()?, *key)))
}

struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
    /// Where modules pulled from registries are kept.
    module_cache: Option<&'a Path>,
}

impl Checker<'_> {
    fn invalid<T>(&self, at: &Spanned<T>, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line: self.line(at),
            message,
        }
    }

    /// The line `at` starts on.
    fn line<T>(&self, at: &Spanned<T>) -> usize {
        self.text[..at.span().start.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    /// The files `include` names, in order: a file as named, a folder's
    /// `*.toml` files and those of its subfolders (by name; hidden entries,
    /// such as a ConfigMap volume's `..data`, skipped). Relative to `base`.
    fn included(
        &self,
        include: &[Spanned<PathBuf>],
        base: &Path,
    ) -> Result<Vec<PathBuf>, ConfigError> {
        let mut files = Vec::new();
        for entry in include {
            let path = base.join(entry.get_ref());
            if path.is_dir() {
                toml_files(&path, INCLUDE_DEPTH, &mut files).map_err(|source| {
                    ConfigError::Read {
                        path: path.clone(),
                        source,
                    }
                })?;
            } else if path.is_file() {
                files.push(path);
            } else {
                return Err(self.invalid(
                    entry,
                    format!(
                        "`include`: `{}` is neither a file nor a folder",
                        path.display()
                    ),
                ));
            }
        }
        Ok(files)
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
            RawBrokerSecurity {
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

    /// Where a mount's module is read from, and the registry it is pulled
    /// from when it is named `oci://…`.
    fn module(
        &self,
        here: &str,
        base: &Path,
        named: &Spanned<PathBuf>,
    ) -> Result<(PathBuf, Option<ModuleReference>), ConfigError> {
        if let Some(text) = named.get_ref().to_str()
            && text.starts_with(crate::oci::SCHEME)
        {
            let reference = ModuleReference::parse(text)
                .map_err(|why| self.invalid(named, format!("{here}: `module` {why}")))?;
            let Some(cache) = self.module_cache else {
                return Err(self.invalid(
                    named,
                    format!("{here}: a module pulled from a registry needs `[host] module_cache`, the folder where it is kept"),
                ));
            };
            return Ok((
                cache.join("oci").join(reference.file_name()),
                Some(reference),
            ));
        }
        let module = base.join(named.get_ref());
        if !module.is_file() {
            return Err(ConfigError::ModuleMissing {
                path: self.path.to_owned(),
                line: self.line(named),
                here: here.to_owned(),
                module,
            });
        }
        Ok((module, None))
    }

    fn mount(
        &self,
        here: &str,
        tenant: &str,
        base: &Path,
        raw: RawMount,
    ) -> Result<Mount, ConfigError> {
        let (module, pulled_from) = self.module(here, base, &raw.module)?;
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
        self.ordering(here, &raw)?;
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
        let breaker = match &raw.breaker {
            Some(breaker) => Some(self.breaker(here, breaker)?),
            None => None,
        };
        Ok(Mount {
            name: raw.name.into_inner(),
            module,
            pulled_from,
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
            retry: raw.retry.map(Spanned::into_inner),
            delay: raw.delay.map(Spanned::into_inner),
            outputs: raw.outputs,
            retry_after_original: raw.retry_after_original.map(Spanned::into_inner),
            order_by: raw.order_by.map(Spanned::into_inner),
            max_keys: raw
                .max_keys
                .map_or(Mount::DEFAULT_MAX_KEYS, Spanned::into_inner),
            paused: raw.paused,
            breaker,
        })
    }

    /// `[tenant.mount.breaker]`, its bounds checked.
    fn breaker(&self, here: &str, raw: &Spanned<RawBreaker>) -> Result<BreakerPolicy, ConfigError> {
        let here = format!("{here}, [breaker]");
        let breaker = raw.get_ref();
        if let Some(rate) = &breaker.failure_rate
            && !(*rate.get_ref() > 0.0 && *rate.get_ref() <= 1.0)
        {
            return Err(self.invalid(
                rate,
                format!(
                    "{here}: `failure_rate` must be above 0 and at most 1 (a share of attempts)"
                ),
            ));
        }
        self.positive(&here, "min_deliveries", &breaker.min_deliveries)?;
        for (key, value) in [("window", &breaker.window), ("open_for", &breaker.open_for)] {
            if let Some(value) = value
                && *value.get_ref() < std::time::Duration::from_millis(100)
            {
                return Err(self.invalid(value, format!("{here}: `{key}` must be at least 100ms")));
            }
        }
        Ok(BreakerPolicy {
            failure_rate: breaker
                .failure_rate
                .as_ref()
                .map_or(BreakerPolicy::DEFAULT_FAILURE_RATE, |r| *r.get_ref()),
            min_deliveries: breaker
                .min_deliveries
                .as_ref()
                .map_or(BreakerPolicy::DEFAULT_MIN_DELIVERIES, |m| *m.get_ref()),
            window: breaker
                .window
                .as_ref()
                .map_or(BreakerPolicy::DEFAULT_WINDOW, |w| *w.get_ref()),
            open_for: breaker
                .open_for
                .as_ref()
                .map_or(BreakerPolicy::DEFAULT_OPEN_FOR, |o| *o.get_ref()),
        })
    }

    /// An ordered mount retries in place and holds its deliveries
    /// unsettled: the keys that choose how retries travel do not apply, and
    /// it settles after its handler.
    fn ordering(&self, here: &str, raw: &RawMount) -> Result<(), ConfigError> {
        self.positive(here, "max_keys", &raw.max_keys)?;
        let Some(order_by) = &raw.order_by else {
            return self.only_with(
                here,
                "`order_by`",
                &[(raw.max_keys.as_ref().map(Spanned::span), "max_keys")],
            );
        };
        if raw.settle == Settle::AtMostOnce {
            return Err(self.invalid(
                order_by,
                format!(
                    "{here}: `order_by` needs `settle = \"at-least-once\"`: a key's delivery is held unsettled while it is retried in place"
                ),
            ));
        }
        let retry_keys = [
            (raw.retry.as_ref().map(Spanned::span), "retry"),
            (raw.delay.as_ref().map(Spanned::span), "delay"),
            (
                raw.retry_after_original.as_ref().map(Spanned::span),
                "retry_after_original",
            ),
        ];
        match first_set(&retry_keys) {
            Some((span, key)) => Err(self.invalid(
                &Spanned::new(span, ()),
                format!(
                    "{here}: `{key}` does not apply with `order_by`: an ordered mount retries in place, holding the key, so no later delivery of it passes"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Refuses the first of `keys` that is set: each only applies with
    /// `condition`.
    fn only_with(
        &self,
        here: &str,
        condition: &str,
        keys: &[(Option<std::ops::Range<usize>>, &str)],
    ) -> Result<(), ConfigError> {
        match first_set(keys) {
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

/// Secrets and the broker's security settings.
impl Checker<'_> {
    /// Reads a secret from the file or environment variable a key names;
    /// errors name the key and the file or variable, never the value.
    pub(super) fn secret(
        &self,
        here: &str,
        file: Option<&Spanned<PathBuf>>,
        env: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<Option<Secret>, ConfigError> {
        match (file, env) {
            (Some(file), Some(_)) => Err(self.invalid(
                file,
                format!("{here}: give `{key}_file` or `{key}_env`, not both"),
            )),
            (Some(file), None) => {
                let path = self.base().join(file.get_ref());
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    self.invalid(
                        file,
                        format!(
                            "{here}: `{key}_file`: cannot read `{}`: {}",
                            path.display(),
                            crate::words::io(&e)
                        ),
                    )
                })?;
                // Secret files made with `echo` end in a newline that is
                // not part of the secret.
                let value = text.trim_end_matches(['\n', '\r']);
                if value.is_empty() {
                    return Err(self.invalid(
                        file,
                        format!("{here}: `{key}_file`: `{}` is empty", path.display()),
                    ));
                }
                Ok(Some(Secret::new(value)))
            }
            (None, Some(env)) => match std::env::var(env.get_ref()) {
                Ok(value) if !value.is_empty() => Ok(Some(Secret::new(value))),
                _ => Err(self.invalid(
                    env,
                    format!(
                        "{here}: `{key}_env`: the environment variable `{}` is not set",
                        env.get_ref()
                    ),
                )),
            },
            (None, None) => Ok(None),
        }
    }

    /// Checks how a broker is logged in to and secured, reading every
    /// secret and TLS file now so a bad one is refused at load.
    pub(super) fn broker_security(
        &self,
        here: &str,
        endpoints: &[Endpoint],
        raw: RawBrokerSecurity,
    ) -> Result<(Credentials, Option<TlsFiles>), ConfigError> {
        let password = self.secret(
            here,
            raw.password_file.as_ref(),
            raw.password_env.as_ref(),
            "password",
        )?;
        let url = &raw.url;
        let tls_urls = endpoints.iter().filter(|e| e.scheme == "amqps").count();
        if tls_urls != 0 && tls_urls != endpoints.len() {
            return Err(self.invalid(
                url,
                format!("{here}: `url` mixes `amqp://` and `amqps://` nodes"),
            ));
        }
        let tls = match raw.tls {
            Some(tls) if tls_urls == 0 => {
                return Err(self.invalid(&tls, format!("{here}: `[tls]` needs `amqps://` URLs")));
            }
            Some(tls) => Some(self.tls_files(here, tls)?),
            None if tls_urls > 0 => Some(self.tls_files_checked(here, url, TlsFiles::default())?),
            None => None,
        };
        for endpoint in endpoints {
            if endpoint.password.is_some() && password.is_some() {
                return Err(self.invalid(
                    url,
                    format!(
                        "{here}: `{endpoint}` carries a password and `password_file` or `password_env` gives another; give it once"
                    ),
                ));
            }
        }
        let user = raw.user.map(Spanned::into_inner);
        let client_cert = tls.as_ref().is_some_and(|t| t.cert_file.is_some());
        let has_user = |e: &Endpoint| e.user.is_some() || user.is_some();
        let mechanism = match &raw.sasl {
            Some(sasl) => *sasl.get_ref(),
            None if endpoints.iter().any(has_user) => SaslMechanism::Plain,
            None if client_cert => SaslMechanism::External,
            None => SaslMechanism::Anonymous,
        };
        let at = raw.sasl.as_ref().map_or(url.span(), Spanned::span);
        let at = Spanned::new(at, ());
        if mechanism.needs_password() {
            for endpoint in endpoints {
                let has_password = endpoint.password.is_some() || password.is_some();
                if !has_user(endpoint) || !has_password {
                    return Err(self.invalid(
                        &at,
                        format!(
                            "{here}: SASL {mechanism} needs a user and a password for `{endpoint}` (in the URL, or `user` with `password_file` or `password_env`)"
                        ),
                    ));
                }
            }
        }
        if mechanism == SaslMechanism::External && !client_cert {
            return Err(self.invalid(
                &at,
                format!(
                    "{here}: SASL EXTERNAL needs `amqps://` URLs and a client certificate (`tls.cert_file`, `tls.key_file`)"
                ),
            ));
        }
        if mechanism == SaslMechanism::Plain
            && !raw.allow_plain_without_tls
            && let Some(endpoint) = endpoints.iter().find(|e| e.in_clear_across_network())
        {
            return Err(self.invalid(
                &at,
                format!(
                    "{here}: SASL PLAIN would send the password to `{endpoint}` without TLS; use `amqps://`, or set `allow_plain_without_tls = true`"
                ),
            ));
        }
        Ok((
            Credentials {
                mechanism,
                user,
                password,
                allow_plain_without_tls: raw.allow_plain_without_tls,
            },
            tls,
        ))
    }

    fn tls_files(&self, here: &str, raw: Spanned<RawTls>) -> Result<TlsFiles, ConfigError> {
        let at = Spanned::new(raw.span(), ());
        let raw = raw.into_inner();
        let base = self.base();
        let files = TlsFiles {
            ca_file: raw.ca_file.map(|p| base.join(p)),
            server_name: raw.server_name,
            cert_file: raw.cert_file.map(|p| base.join(p)),
            key_file: raw.key_file.map(|p| base.join(p)),
        };
        self.tls_files_checked(here, &at, files)
    }

    /// Loads the TLS material as a connection would, so `wharf check`
    /// names a missing or unreadable file.
    fn tls_files_checked<T>(
        &self,
        here: &str,
        at: &Spanned<T>,
        files: TlsFiles,
    ) -> Result<TlsFiles, ConfigError> {
        match crate::tls::client_config(&files) {
            Ok(_) => Ok(files),
            Err(e) => Err(self.invalid(at, format!("{here}: [tls]: {e}"))),
        }
    }

    fn base(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }
}

/// A wildcard in `grants.send` never reaches another tenant's address:
/// granting one takes writing it out in full.
fn sends_stay_home(
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
                grant.broker_nodes.contains(broker)
                    && **owner != grant.tenant
                    && read.iter().any(|p| p.matches(address))
            });
            if let Some(((_, address), owner)) = foreign {
                return Err(ConfigError::Invalid {
                    path: grant.file.clone(),
                    line: grant.line,
                    message: format!(
                        "{}: `grants.send` pattern `{}` matches `{address}`, an address of tenant `{owner}`; name it in full to grant it",
                        grant.here,
                        pattern.as_str()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The nodes `broker`'s URLs reach, each once, as addresses and
/// subscriptions on them are compared.
fn nodes(broker: &Broker) -> Vec<String> {
    let mut nodes: Vec<String> = broker
        .urls
        .iter()
        .map(|url| Endpoint::parse(url).map_or_else(|_| url.to_ascii_lowercase(), |e| e.node()))
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}
