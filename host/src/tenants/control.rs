//! The control task: owns the broker pools and the running mounts, applies
//! config and module reloads, and drains everything on shutdown. It never
//! waits on a broker without also listening for the stop, so SIGTERM is
//! acted on in every state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::budget::{Buffered, TenantLimits};
use super::mount::{self, AttachedMount, ModuleSlot, MountSpec, instances_for};
use super::pause::Pauses;
use super::reload::{self, MountKey, Placement};
use super::watch::{FileWatcher, canonical};
use super::{load_modules, warn_if_pool_short};
use crate::admin::{Health, Metrics};
use crate::broker::{BrokerPool, ConnectOptions};
use crate::events::{ConfigChange, Event};
use crate::registry::{self, Registry};
use crate::sandbox::{Failure, InstanceSlots, LogTags, Module, Owners, Sandbox};
use crate::telemetry::Telemetry;
use wharf_core::config::{
    Broker, Config, ConfigError, Mount, Node, SaslMechanism, SubscriptionKind, Tenant,
};
use wharf_core::endpoint::Endpoint;
use wharf_core::oci::ModuleReference;

/// What the [`super::RunningHost`] asks of the control task.
pub(super) enum Command {
    Reload(oneshot::Sender<ConfigChange>),
    Shutdown,
}

/// How often the broker pools' state goes into the metrics.
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Numbers each attach of a mount, so old and new links of a replaced
/// mount never share a name.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A mount at work, as the control task sees it.
struct RunningMount {
    spec: Arc<MountSpec>,
    placement: Placement,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A tenant's shared state: its budget and its broker pool (its own, or
/// the host's).
struct TenantState {
    placement: Placement,
    limits: Arc<TenantLimits>,
    pool: BrokerPool,
}

pub(super) struct Control {
    config: Config,
    sandbox: Sandbox,
    registry: Registry,
    /// The modules pulled from registries under the config in force, for
    /// the task that polls their tags.
    pulled: watch::Sender<HashMap<ModuleReference, PathBuf>>,
    slots: InstanceSlots,
    /// What each tenant owns, for every instance's reply checks.
    owners: Owners,
    /// Bytes of deliveries the whole host holds.
    buffered: Buffered,
    default_pool: BrokerPool,
    tenants: HashMap<String, TenantState>,
    mounts: BTreeMap<MountKey, RunningMount>,
    watcher: FileWatcher,
    /// A module file the last config reload named that did not exist yet:
    /// its arrival tries that reload again (a config and its
    /// modules may come from volumes updated apart).
    awaited: Option<PathBuf>,
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
    telemetry: Telemetry,
    health: Arc<Health>,
    pauses: Arc<Pauses>,
    /// Cancelled by a shutdown request, so waits on a broker end at once.
    stopping: CancellationToken,
}

/// A broker pool for `broker`.
fn pool(broker: &Broker) -> BrokerPool {
    let endpoints: Vec<Endpoint> = broker
        .urls
        .iter()
        .map(|url| Endpoint::parse(url).expect("urls are checked when the config loads"))
        .collect();
    if broker.credentials.mechanism == SaslMechanism::Plain
        && broker.credentials.allow_plain_without_tls
        && let Some(exposed) = endpoints.iter().find(|e| e.in_clear_across_network())
    {
        tracing::warn!(
            broker = %exposed,
            "SASL PLAIN without TLS (`allow_plain_without_tls`): the password crosses the network in the clear"
        );
    }
    BrokerPool::new(endpoints, ConnectOptions::of(broker), broker.reconnect)
}

impl Control {
    /// Starts every mount of `config`; each attaches on its own and keeps
    /// trying while its broker cannot be reached.
    #[allow(
        clippy::too_many_arguments,
        reason = "the host hands over everything it made"
    )]
    pub(super) fn start(
        config: Config,
        modules: Vec<Module>,
        sandbox: Sandbox,
        registry: Registry,
        slots: InstanceSlots,
        events: broadcast::Sender<Event>,
        metrics: Arc<Metrics>,
        telemetry: Telemetry,
        health: Arc<Health>,
        pauses: Arc<Pauses>,
        stopping: CancellationToken,
    ) -> Control {
        let (pulled, modules_pulled) = watch::channel(registry::pulled_modules(&config));
        tokio::spawn(registry::poll_tags(
            registry.clone(),
            modules_pulled,
            stopping.clone(),
        ));
        let mut control = Control {
            registry,
            pulled,
            default_pool: pool(&config.broker),
            config: config.clone(),
            owners: config.address_owners().into(),
            buffered: Buffered::new(config.host.max_buffered),
            sandbox,
            slots,
            tenants: HashMap::new(),
            mounts: BTreeMap::new(),
            watcher: FileWatcher::new(),
            awaited: None,
            events,
            metrics,
            telemetry,
            health,
            pauses,
            stopping,
        };
        for ((tenant, mount), module) in config.mounts().zip(modules) {
            let spec = control.spec(tenant, mount, module);
            control.spawn(tenant, spec, None);
        }
        control.watch_files();
        control.report_brokers();
        control.health.set_serving();
        control
    }

    /// Serves commands and file changes until shutdown, then drains every
    /// mount.
    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut report = tokio::time::interval(REPORT_EVERY);
        loop {
            tokio::select! {
                _ = report.tick() => self.report_brokers(),
                command = commands.recv() => match command {
                    Some(Command::Reload(done)) => {
                        let change = self.reload().await;
                        let _ = done.send(change);
                    }
                    Some(Command::Shutdown) | None => break,
                },
                path = self.watcher.changed() => {
                    let config_file = self.config.files.iter().any(|f| canonical(f).as_ref() == Some(&path));
                    if config_file || self.awaited.as_ref() == Some(&path) {
                        self.reload().await;
                    } else {
                        self.reload_module(path).await;
                    }
                }
            }
        }
        self.health.set_stopping();
        self.stop_all().await;
    }

    /// Copies what the broker pools know into the metrics, and tells
    /// readiness which pools the running mounts use.
    fn report_brokers(&self) {
        let status = self.default_pool.status();
        self.metrics
            .broker("default", status.connections, status.lost);
        let mut in_use = Vec::new();
        if self.mounts.values().any(|m| m.placement.broker.is_none()) {
            in_use.push(("default".to_owned(), self.default_pool.clone()));
        }
        let with_mounts: HashSet<&str> = self.mounts.keys().map(|(t, _)| t.as_str()).collect();
        for (name, state) in &self.tenants {
            if state.placement.broker.is_some() {
                let status = state.pool.status();
                self.metrics.broker(name, status.connections, status.lost);
                if with_mounts.contains(name.as_str()) {
                    in_use.push((name.clone(), state.pool.clone()));
                }
            }
        }
        self.health.set_brokers(in_use);
    }

    /// The tenant's state, made on first use.
    fn tenant(&mut self, tenant: &Tenant) -> &TenantState {
        let default_pool = &self.default_pool;
        self.tenants
            .entry(tenant.name.clone())
            .or_insert_with(|| TenantState {
                placement: placement(tenant),
                limits: TenantLimits::new(tenant.budget, tenant.mounts.len()),
                pool: tenant
                    .broker
                    .as_ref()
                    .map_or_else(|| default_pool.clone(), pool),
            })
    }

    /// What a mount of `tenant` runs with.
    fn spec(&mut self, tenant: &Tenant, mount: &Mount, module: Module) -> Arc<MountSpec> {
        let broker = tenant
            .broker
            .clone()
            .unwrap_or_else(|| self.config.broker.clone());
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let tags = Arc::new(LogTags {
            tenant: tenant.name.as_str().into(),
            mount: mount.name.as_str().into(),
        });
        let slots = self.slots.clone();
        let limits = self.tenant(tenant).limits.clone();
        let slot = Arc::new(ModuleSlot::new(instances_for(
            mount,
            module,
            &tags,
            &self.owners,
            &limits,
            &slots,
        )));
        Arc::new(MountSpec::new(
            tags.clone(),
            mount.clone(),
            broker,
            slot,
            limits,
            self.events.clone(),
            self.metrics.mount(&tags),
            self.telemetry.clone(),
            self.config.host.shutdown_grace,
            generation,
            self.buffered.clone(),
            self.config.retry_key.clone(),
            self.pauses.watch(&tenant.name, &mount.name),
        ))
    }

    /// Supervises a mount from now on, starting with `attached` if the
    /// caller attached it already.
    fn spawn(&mut self, tenant: &Tenant, spec: Arc<MountSpec>, attached: Option<AttachedMount>) {
        let state = self.tenant(tenant);
        let (pool, placement) = (state.pool.clone(), state.placement.clone());
        let stop = CancellationToken::new();
        self.metrics.mounts_running(1);
        let metrics = self.metrics.clone();
        let events = self.events.clone();
        let health = self.health.clone();
        let running_spec = spec.clone();
        let mount_stop = stop.clone();
        let task = tokio::spawn(async move {
            mount::supervise(running_spec.clone(), pool, attached, mount_stop, health).await;
            metrics.mounts_running(-1);
            let _ = events.send(Event::MountStopped {
                tenant: running_spec.tags.tenant.clone(),
                mount: running_spec.tags.mount.clone(),
            });
        });
        let key = (tenant.name.clone(), spec.config.name.clone());
        self.mounts.insert(
            key,
            RunningMount {
                spec,
                placement,
                stop,
                task,
            },
        );
    }

    /// Drains the given mounts together.
    async fn stop(&mut self, keys: &[MountKey]) {
        let stopping: Vec<RunningMount> = keys
            .iter()
            .filter_map(|key| self.mounts.remove(key))
            .collect();
        for mount in &stopping {
            mount.stop.cancel();
        }
        for mount in stopping {
            let _ = mount.task.await;
        }
    }

    /// Forgets tenants left without mounts; their own connections close
    /// once the last handle to their pool is gone.
    fn forget_idle_tenants(&mut self) {
        self.tenants
            .retain(|name, _| self.mounts.keys().any(|(tenant, _)| tenant == name));
    }

    async fn stop_all(&mut self) {
        let keys: Vec<MountKey> = self.mounts.keys().cloned().collect();
        self.stop(&keys).await;
        let pools: Vec<BrokerPool> = self
            .tenants
            .drain()
            .map(|(_, state)| state.pool)
            .chain([self.default_pool.clone()])
            .collect();
        for pool in pools {
            pool.close().await;
        }
    }

    /// Compiles a changed module file, checks it instantiates, and swaps it
    /// into every mount that runs it; a file that does not load leaves the
    /// old module serving.
    async fn reload_module(&mut self, path: PathBuf) {
        let users: Vec<&RunningMount> = self
            .mounts
            .values()
            .filter(|m| canonical(&m.spec.config.module).as_ref() == Some(&path))
            .collect();
        let Some(first) = users.first() else {
            return;
        };
        let sandbox = self.sandbox.clone();
        let file = first.spec.config.module.clone();
        let loaded = tokio::task::spawn_blocking(move || sandbox.load(&file))
            .await
            .map_err(|e| e.to_string())
            .and_then(|loaded| loaded.map_err(|e| e.to_string()));
        for mount in users {
            let spec = &mount.spec;
            let current = spec.module.current();
            let (tenant, name) = (&*spec.tags.tenant, &*spec.tags.mount);
            let error = match &loaded {
                Ok(module) if module.version() == current.module().version() => continue,
                Ok(module) => {
                    let instances = instances_for(
                        &spec.config,
                        module.clone(),
                        &spec.tags,
                        &self.owners,
                        &spec.tenant,
                        &self.slots,
                    );
                    match instances.probe().await {
                        Ok(()) => {
                            spec.module.replace(instances);
                            tracing::info!(
                                tenant,
                                mount = name,
                                version = &**module.version(),
                                "module reloaded"
                            );
                            None
                        }
                        Err(failure) => Some(format!(
                            "module `{}` does not start: {failure}",
                            module.path().display()
                        )),
                    }
                }
                Err(error) => Some(error.clone()),
            };
            if let Some(error) = &error {
                tracing::error!(
                    tenant,
                    mount = name,
                    "module reload refused, the previous version keeps serving: {error}"
                );
            }
            spec.metrics.module_reloaded(error.is_none());
            let _ = self.events.send(Event::ModuleReloaded {
                tenant: spec.tags.tenant.clone(),
                mount: spec.tags.mount.clone(),
                version: spec.module.current().module().version().clone(),
                error,
            });
        }
    }

    /// Reads the config file again and applies what changed. A config
    /// naming a module file that is not there yet is tried again when it
    /// arrives.
    async fn reload(&mut self) -> ConfigChange {
        self.awaited = None;
        let change = match Config::load(&self.config.path) {
            Ok(config) => self.apply(config).await,
            Err(e) => {
                if let ConfigError::ModuleMissing { module, .. } = &e {
                    self.awaited = canonical(module);
                }
                ConfigChange {
                    error: Some(e.to_string()),
                    ..ConfigChange::default()
                }
            }
        };
        self.watch_files();
        self.metrics.config_reloaded(change.error.is_none());
        match &change.error {
            Some(error) if self.awaited.is_some() => tracing::error!(
                "config reload failed, tried again when the module arrives: {error}"
            ),
            Some(error) => tracing::error!("config reload failed: {error}"),
            None => tracing::info!(
                added = listed(&change.added),
                removed = listed(&change.removed),
                replaced = listed(&change.replaced),
                "config reloaded"
            ),
        }
        let _ = self.events.send(Event::ConfigReloaded(change.clone()));
        change
    }

    async fn apply(&mut self, config: Config) -> ConfigChange {
        // A registry slow to answer must not hold up a stop.
        let pulled = tokio::select! {
            pulled = super::pull_modules(&self.registry, &config) => pulled,
            () = self.stopping.cancelled() => Err(Vec::new()),
        };
        if let Err(errors) = pulled {
            return ConfigChange {
                error: Some(if errors.is_empty() {
                    "stopping: the modules were not pulled".to_owned()
                } else {
                    super::join_lines(&errors)
                }),
                ..ConfigChange::default()
            };
        }
        let modules = match self.compile(&config).await {
            Ok(modules) => modules,
            Err(error) => {
                return ConfigChange {
                    error: Some(error),
                    ..ConfigChange::default()
                };
            }
        };
        if (&config.broker, &config.host, &config.admin)
            != (&self.config.broker, &self.config.host, &self.config.admin)
        {
            tracing::warn!("[broker], [host] and [admin] changes take effect at the next start");
        }
        // Replies are kept from what the tenants own now, in every mount.
        self.owners.replace(config.address_owners());
        let running = self
            .mounts
            .iter()
            .map(|(key, m)| (key.clone(), (m.spec.config.clone(), m.placement.clone())))
            .collect();
        let plan = reload::plan(&running, &reload::wanted(&config));
        // Before the mounts attach: a new one starts as `paused` says.
        self.pauses.configure(&config);
        let modules: HashMap<MountKey, (Tenant, Mount, Module)> = config
            .mounts()
            .zip(modules)
            .map(|((tenant, mount), module)| {
                let key = (tenant.name.clone(), mount.name.clone());
                (key, (tenant.clone(), mount.clone(), module))
            })
            .collect();
        let Some(probed) = self.start_modules(&plan, &modules).await else {
            return ConfigChange {
                error: Some("stopping: the modules were not started".to_owned()),
                ..ConfigChange::default()
            };
        };
        let named = config
            .mounts()
            .filter_map(|(tenant, mount)| SubscriptionId::of(tenant.broker.as_ref(), mount))
            .collect();
        let change = reload::carry_out(
            plan,
            &mut Applying {
                control: self,
                modules,
                probed,
                named,
            },
        )
        .await;
        warn_if_pool_short(&config);
        self.pulled.send_replace(registry::pulled_modules(&config));
        self.config = config;
        change
    }

    /// Starts the module of every mount `plan` attaches or replaces once,
    /// side by side and off the way of a stop (`None` when one comes):
    /// how each started.
    async fn start_modules(
        &self,
        plan: &[reload::Step],
        modules: &HashMap<MountKey, (Tenant, Mount, Module)>,
    ) -> Option<HashMap<MountKey, Result<(), Failure>>> {
        let (keys, mounts): (Vec<&MountKey>, Vec<_>) = plan
            .iter()
            .filter_map(|step| match step {
                reload::Step::Attach(key) | reload::Step::Replace(key) => Some(key),
                _ => None,
            })
            .filter_map(|key| {
                let (tenant, mount, module) = modules.get(key)?;
                Some((key, (tenant, mount, module)))
            })
            .unzip();
        tracing::debug!(
            modules = mounts.len(),
            "starting the new and changed mounts' modules"
        );
        tokio::select! {
            probed = super::probe_mounts(&self.sandbox, &self.owners, &mounts) => {
                Some(keys.into_iter().cloned().zip(probed).collect())
            }
            () = self.stopping.cancelled() => None,
        }
    }

    /// Starts a new or changed mount. A changed one is attached before the
    /// old one drains, so a broker that refuses the new links leaves the
    /// old mount serving; a new one attaches in the background.
    async fn start_mount(
        &mut self,
        tenant: &Tenant,
        mount: &Mount,
        module: Module,
        replacing: bool,
    ) -> Result<(), String> {
        let key = (tenant.name.clone(), mount.name.clone());
        let spec = self.spec(tenant, mount, module);
        if !replacing {
            self.spawn(tenant, spec, None);
            return Ok(());
        }
        let pool = self.tenant(tenant).pool.clone();
        let attached = if let Some(old) = self.takes_over_first(&key, mount) {
            // The old subscription cannot be consumed beside the new one:
            // it goes first, and ends if the new mount subscribes elsewhere.
            let broker = tenant.broker.as_ref();
            if SubscriptionId::of(broker, &old.config) != SubscriptionId::of(broker, mount) {
                old.end_subscription_on_stop();
            }
            self.stop(std::slice::from_ref(&key)).await;
            None
        } else {
            let attach = tokio::time::timeout(
                spec.broker.attach_timeout + spec.broker.connect_timeout,
                spec.attach(&pool),
            );
            let attached = tokio::select! {
                attached = attach => attached,
                () = self.stopping.cancelled() => return Err("the host is stopping".to_owned()),
            };
            match attached {
                Ok(Ok(attached)) => Some(attached),
                Ok(Err(e)) => return Err(format!("{e}; the old mount keeps serving")),
                Err(_) => return Err("attach timed out; the old mount keeps serving".to_owned()),
            }
        };
        self.stop(std::slice::from_ref(&key)).await;
        self.spawn(tenant, spec, attached);
        Ok(())
    }

    /// The running mount `key` when its replacement `mount` must not attach
    /// beside it: on a topic, two volatile subscriptions each get every
    /// message and an exclusive durable one takes one link at a time; only
    /// the same shared durable subscription takes both at once.
    fn takes_over_first(&self, key: &MountKey, mount: &Mount) -> Option<Arc<MountSpec>> {
        let old = &self.mounts.get(key)?.spec;
        let topic = old.config.node == Some(Node::Topic) || mount.node == Some(Node::Topic);
        let same_shared = mount
            .subscription
            .as_ref()
            .is_some_and(|s| s.kind == SubscriptionKind::DurableShared)
            && old.config.subscription == mount.subscription
            && old.config.address == mount.address;
        (topic && !same_shared).then(|| old.clone())
    }

    /// Every module of `config`, compiled off the async runtime.
    async fn compile(&self, config: &Config) -> Result<Vec<Module>, String> {
        let sandbox = self.sandbox.clone();
        let config = config.clone();
        match tokio::task::spawn_blocking(move || load_modules(&sandbox, &config)).await {
            Ok(Ok(modules)) => Ok(modules),
            Ok(Err(errors)) => Err(super::join_lines(&errors)),
            Err(e) => Err(e.to_string()),
        }
    }

    fn watch_files(&mut self) {
        let files = (self.config.files.iter().map(PathBuf::as_path))
            .chain(self.mounts.values().map(|m| m.spec.config.module.as_path()))
            .chain(self.awaited.as_deref());
        self.watcher.watch(files);
    }
}

/// The control task carrying out a reload's steps, with the new config's
/// mounts and modules.
struct Applying<'a> {
    control: &'a mut Control,
    modules: HashMap<MountKey, (Tenant, Mount, Module)>,
    /// How each new or changed mount's module started.
    probed: HashMap<MountKey, Result<(), Failure>>,
    /// The durable subscriptions the new config's mounts name.
    named: Vec<SubscriptionId>,
}

/// A durable topic subscription as the broker keeps it: on one broker, of
/// one address, of one kind and name, whichever mount names it.
#[derive(Debug, PartialEq)]
struct SubscriptionId {
    /// The tenant's own broker; `None`: the host's.
    broker: Option<Broker>,
    address: String,
    kind: SubscriptionKind,
    name: String,
}

impl SubscriptionId {
    /// The durable subscription `mount` consumes from, if any, on its
    /// tenant's `broker`.
    fn of(broker: Option<&Broker>, mount: &Mount) -> Option<SubscriptionId> {
        let subscription = mount.subscription.as_ref()?;
        (subscription.kind != SubscriptionKind::Volatile).then(|| SubscriptionId {
            broker: broker.cloned(),
            address: mount.address.clone(),
            kind: subscription.kind,
            name: subscription.name.clone(),
        })
    }
}

impl Applying<'_> {
    async fn start(&mut self, key: &MountKey, replacing: bool) -> Result<(), String> {
        let (tenant, mount, module) = self
            .modules
            .remove(key)
            .expect("a plan attaches only wanted mounts, once each");
        if let Some(Err(failure)) = self.probed.remove(key) {
            return Err(format!("module does not start: {failure}"));
        }
        self.control
            .start_mount(&tenant, &mount, module, replacing)
            .await
    }
}

impl reload::Steps for Applying<'_> {
    fn new_tenant_state(&mut self, tenant: &str) {
        self.control.tenants.remove(tenant);
    }

    async fn attach(&mut self, key: &MountKey) -> Result<(), String> {
        self.start(key, false).await
    }

    async fn replace(&mut self, key: &MountKey) -> Result<(), String> {
        self.start(key, true).await
    }

    async fn detach(&mut self, keys: &[MountKey]) {
        // A mount gone from the config ends its durable subscription, so
        // subscriptions do not pile up on the broker; not one a mount of
        // the new config still names (a renamed mount, a moved one), which
        // would lose the messages waiting in it.
        for key in keys {
            if let Some(mount) = self.control.mounts.get(key) {
                let id = SubscriptionId::of(mount.placement.broker.as_ref(), &mount.spec.config);
                if id.is_some_and(|id| !self.named.contains(&id)) {
                    mount.spec.end_subscription_on_stop();
                }
            }
        }
        self.control.stop(keys).await;
    }

    fn forget_idle_tenants(&mut self) {
        self.control.forget_idle_tenants();
    }
}

fn placement(tenant: &Tenant) -> Placement {
    Placement {
        budget: tenant.budget,
        broker: tenant.broker.clone(),
    }
}

/// Mounts as a log line lists them: `a/b, c/d`, or `none`.
fn listed(mounts: &[String]) -> String {
    if mounts.is_empty() {
        "none".to_owned()
    } else {
        mounts.join(", ")
    }
}
