//! The control task: owns the connections and the running mounts, applies
//! config and module reloads, and drains everything on shutdown.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::budget::TenantLimits;
use super::mount::{AttachedMount, ModuleSlot, instances_for};
use super::watch::{FileWatcher, canonical};
use super::{HostError, MountError, load_modules};
use crate::admin::{Health, Metrics};
use crate::broker::{BrokerConnection, BrokerError};
use crate::config::{Broker, Config, Mount, Tenant};
use crate::events::{ConfigChange, Event};
use crate::sandbox::{LogTags, Module, Sandbox};

/// What the [`super::RunningHost`] asks of the control task.
pub(super) enum Command {
    Reload(oneshot::Sender<ConfigChange>),
    Shutdown,
}

/// `(tenant, mount)`.
type MountKey = (String, String);

/// A mount at work, as the control task sees it.
struct RunningMount {
    config: Mount,
    tags: Arc<LogTags>,
    slot: Arc<ModuleSlot>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A tenant's shared state: its budget and, if it has one, its own
/// connection.
struct TenantState {
    config: Tenant,
    limits: Arc<TenantLimits>,
    connection: Option<BrokerConnection>,
}

pub(super) struct Control {
    config: Config,
    sandbox: Sandbox,
    /// The host's default connection; `None` once closed.
    connection: Option<BrokerConnection>,
    tenants: HashMap<String, TenantState>,
    mounts: BTreeMap<MountKey, RunningMount>,
    ended: mpsc::UnboundedSender<(MountKey, Result<(), BrokerError>)>,
    ended_inbox: mpsc::UnboundedReceiver<(MountKey, Result<(), BrokerError>)>,
    failures: mpsc::UnboundedSender<HostError>,
    watcher: FileWatcher,
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl Control {
    /// Connects and attaches every mount of `config`; on any failure,
    /// detaches what was attached and says which mount failed.
    pub(super) async fn start(
        config: Config,
        modules: Vec<Module>,
        sandbox: Sandbox,
        events: broadcast::Sender<Event>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Result<(Control, mpsc::UnboundedReceiver<HostError>), HostError> {
        let connection = open(&config.broker).await?;
        let (ended, ended_inbox) = mpsc::unbounded_channel();
        let (failures, failures_inbox) = mpsc::unbounded_channel();
        let mut control = Control {
            config: config.clone(),
            sandbox,
            connection: Some(connection),
            tenants: HashMap::new(),
            mounts: BTreeMap::new(),
            ended,
            ended_inbox,
            failures,
            watcher: FileWatcher::new(),
            events,
            metrics,
            health,
        };
        for ((tenant, mount), module) in config.mounts().zip(modules) {
            if let Err(e) = control.attach(tenant, mount, module).await {
                control.stop_all().await;
                return Err(e);
            }
        }
        control.watch_files();
        control.health.set_serving(true);
        Ok((control, failures_inbox))
    }

    /// Serves commands, file changes and mount endings until shutdown or a
    /// failed link, then drains every mount.
    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Reload(done)) => {
                        let change = self.reload().await;
                        let _ = done.send(change);
                    }
                    Some(Command::Shutdown) | None => break,
                },
                path = self.watcher.changed() => {
                    if canonical(&self.config.path).as_ref() == Some(&path) {
                        self.reload().await;
                    } else {
                        self.reload_module(path).await;
                    }
                }
                Some((key, result)) = self.ended_inbox.recv() => {
                    if let Err(source) = result
                        && self.mounts.contains_key(&key)
                    {
                        let failure = MountError { tenant: key.0, mount: key.1, source };
                        if !self.stop_tenant_after(&failure).await {
                            let _ = self.failures.send(HostError::Broker(failure));
                            break;
                        }
                    }
                }
            }
        }
        self.health.set_serving(false);
        self.stop_all().await;
    }

    /// Attaches one mount with its compiled module.
    async fn attach(
        &mut self,
        tenant: &Tenant,
        mount: &Mount,
        module: Module,
    ) -> Result<(), HostError> {
        let fail = |source| {
            HostError::Broker(MountError {
                tenant: tenant.name.clone(),
                mount: mount.name.clone(),
                source,
            })
        };
        if !self.tenants.contains_key(&tenant.name) {
            let connection = match &tenant.broker {
                Some(broker) => Some(open(broker).await?),
                None => None,
            };
            let state = TenantState {
                config: tenant.clone(),
                limits: TenantLimits::new(tenant.budget),
                connection,
            };
            self.tenants.insert(tenant.name.clone(), state);
        }
        let state = self.tenants.get_mut(&tenant.name).expect("inserted above");
        let tags = Arc::new(LogTags {
            tenant: tenant.name.as_str().into(),
            mount: mount.name.as_str().into(),
        });
        let slot = Arc::new(ModuleSlot::new(instances_for(
            mount,
            module,
            &tags,
            &state.limits,
        )));
        let Some(connection) = state.connection.as_mut().or(self.connection.as_mut()) else {
            return Err(fail(BrokerError::Connect {
                url: "(default)".to_owned(),
                reason: "the connection is closed".to_owned(),
            }));
        };
        let attached = AttachedMount::attach(
            connection,
            tags.clone(),
            mount,
            slot.clone(),
            state.limits.clone(),
            &self.events,
            self.metrics.mount(&tags),
        )
        .await
        .map_err(fail)?;
        let stop = CancellationToken::new();
        let key = (tenant.name.clone(), mount.name.clone());
        let task = tokio::spawn(run_mount(
            attached,
            key.clone(),
            stop.clone(),
            self.config.host.shutdown_grace,
            self.events.clone(),
            self.metrics.clone(),
            self.ended.clone(),
        ));
        self.mounts.insert(
            key,
            RunningMount {
                config: mount.clone(),
                tags,
                slot,
                stop,
                task,
            },
        );
        Ok(())
    }

    /// Drains the given mounts together and forgets them; tenants left
    /// without mounts close their own connections.
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
        let idle: Vec<String> = self
            .tenants
            .keys()
            .filter(|tenant| !self.mounts.keys().any(|(t, _)| t == *tenant))
            .cloned()
            .collect();
        for tenant in idle {
            self.forget_tenant(&tenant).await;
        }
    }

    /// Drops a tenant's budget and closes its own connection, if it has one.
    async fn forget_tenant(&mut self, tenant: &str) {
        if let Some(TenantState {
            connection: Some(connection),
            ..
        }) = self.tenants.remove(tenant)
        {
            connection.close().await;
        }
    }

    /// A link failed: if it was on the tenant's own connection, only that
    /// tenant stops (until the next config reload attaches it again) and
    /// `true` is returned; on the shared connection the host must stop.
    async fn stop_tenant_after(&mut self, failure: &MountError<BrokerError>) -> bool {
        let own_connection = self
            .tenants
            .get(&failure.tenant)
            .is_some_and(|state| state.connection.is_some());
        if !own_connection {
            return false;
        }
        tracing::error!(
            "{failure}; stopping tenant `{}` (its own connection) until the next config reload",
            failure.tenant
        );
        let keys: Vec<MountKey> = self
            .mounts
            .keys()
            .filter(|(tenant, _)| *tenant == failure.tenant)
            .cloned()
            .collect();
        self.stop(&keys).await;
        true
    }

    async fn stop_all(&mut self) {
        let keys: Vec<MountKey> = self.mounts.keys().cloned().collect();
        self.stop(&keys).await;
        if let Some(connection) = self.connection.take() {
            connection.close().await;
        }
    }

    /// Compiles a changed module file and swaps it into every mount that
    /// runs it; a file that does not load leaves the old module serving.
    async fn reload_module(&mut self, path: PathBuf) {
        let users: Vec<&RunningMount> = self
            .mounts
            .values()
            .filter(|m| canonical(&m.config.module).as_ref() == Some(&path))
            .collect();
        let Some(first) = users.first() else {
            return;
        };
        let sandbox = self.sandbox.clone();
        let file = first.config.module.clone();
        let loaded = tokio::task::spawn_blocking(move || sandbox.load(&file))
            .await
            .map_err(|e| e.to_string())
            .and_then(|loaded| loaded.map_err(|e| e.to_string()));
        for mount in users {
            let current = mount.slot.current();
            let metrics = self.metrics.mount(&mount.tags);
            let (tenant, name) = (&*mount.tags.tenant, &*mount.tags.mount);
            let error = match &loaded {
                Ok(module) if module.version() == current.module().version() => continue,
                Ok(module) => {
                    let limits = &self.tenants[tenant].limits;
                    let instances =
                        instances_for(&mount.config, module.clone(), &mount.tags, limits);
                    mount.slot.replace(instances);
                    tracing::info!(
                        tenant,
                        mount = name,
                        version = &**module.version(),
                        "module reloaded"
                    );
                    None
                }
                Err(error) => {
                    tracing::error!(
                        tenant,
                        mount = name,
                        "module reload refused, the previous version keeps serving: {error}"
                    );
                    Some(error.clone())
                }
            };
            metrics.module_reloaded(error.is_none());
            let _ = self.events.send(Event::ModuleReloaded {
                tenant: mount.tags.tenant.clone(),
                mount: mount.tags.mount.clone(),
                version: mount.slot.current().module().version().clone(),
                error,
            });
        }
    }

    /// Reads the config file again and applies what changed.
    async fn reload(&mut self) -> ConfigChange {
        let change = match Config::load(&self.config.path) {
            Ok(config) => self.apply(config).await,
            Err(e) => ConfigChange {
                error: Some(e.to_string()),
                ..ConfigChange::default()
            },
        };
        match &change.error {
            Some(error) => tracing::error!("config reload refused, nothing changed: {error}"),
            None => tracing::info!(
                added = ?change.added,
                removed = ?change.removed,
                replaced = ?change.replaced,
                "config reloaded"
            ),
        }
        let _ = self.events.send(Event::ConfigReloaded(change.clone()));
        change
    }

    async fn apply(&mut self, config: Config) -> ConfigChange {
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
        let mut change = ConfigChange::default();
        let mut wanted: BTreeMap<MountKey, (&Tenant, &Mount, Module)> = BTreeMap::new();
        for ((tenant, mount), module) in config.mounts().zip(modules) {
            wanted.insert(
                (tenant.name.clone(), mount.name.clone()),
                (tenant, mount, module),
            );
        }
        let changed_tenants = self.changed_tenants(&config);
        let mut stopping = Vec::new();
        for (key, running) in &self.mounts {
            let label = format!("{}/{}", key.0, key.1);
            match wanted.get(key) {
                None => change.removed.push(label),
                Some((_, mount, _))
                    if **mount != running.config || changed_tenants.contains(&key.0) =>
                {
                    change.replaced.push(label);
                }
                Some(_) => continue,
            }
            stopping.push(key.clone());
        }
        self.stop(&stopping).await;
        // Tenants whose budget or broker changed start over with new ones.
        for tenant in &changed_tenants {
            self.forget_tenant(tenant).await;
        }
        let mut errors = Vec::new();
        for (key, (tenant, mount, module)) in wanted {
            if self.mounts.contains_key(&key) {
                continue;
            }
            let label = format!("{}/{}", key.0, key.1);
            if !change.replaced.contains(&label) {
                change.added.push(label);
            }
            if let Err(e) = self.attach(tenant, mount, module).await {
                tracing::error!("{e}");
                errors.push(e.to_string());
            }
        }
        if !errors.is_empty() {
            change.error = Some(errors.join("\n"));
        }
        self.config = config;
        self.watch_files();
        change
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

    /// Running tenants that `config` removes or gives another budget or
    /// broker.
    fn changed_tenants(&self, config: &Config) -> Vec<String> {
        self.tenants
            .iter()
            .filter(|(name, state)| {
                config
                    .tenants
                    .iter()
                    .find(|t| &t.name == *name)
                    .is_none_or(|t| {
                        (&t.broker, t.budget) != (&state.config.broker, state.config.budget)
                    })
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn watch_files(&mut self) {
        let files = std::iter::once(self.config.path.as_path())
            .chain(self.mounts.values().map(|m| m.config.module.as_path()));
        self.watcher.watch(files);
    }
}

async fn open(broker: &Broker) -> Result<BrokerConnection, HostError> {
    let connection = BrokerConnection::open(&broker.url, &broker.container_id)
        .await
        .map_err(HostError::Connect)?;
    tracing::info!(broker = connection.url(), "connected");
    Ok(connection)
}

/// Runs an attached mount to its end and reports how it ended.
async fn run_mount(
    attached: AttachedMount,
    key: MountKey,
    stop: CancellationToken,
    grace: Duration,
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
    ended: mpsc::UnboundedSender<(MountKey, Result<(), BrokerError>)>,
) {
    let tags = attached.tags().clone();
    metrics.mounts_running(1);
    let result = attached.run(stop, grace).await;
    metrics.mounts_running(-1);
    if let Err(e) = &result {
        tracing::error!(tenant = &*tags.tenant, mount = &*tags.mount, "{e}");
    }
    let _ = events.send(Event::MountStopped {
        tenant: tags.tenant.clone(),
        mount: tags.mount.clone(),
        error: result.as_ref().err().map(ToString::to_string),
    });
    let _ = ended.send((key, result));
}
