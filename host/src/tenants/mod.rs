//! The host: every tenant's mounts, loaded, attached, reloaded and stopped.
//!
//! [`Host::load`] compiles every module and tries each out before anything
//! connects; [`Host::start`] hands the mounts to a control task, which from
//! then on owns them: each mount attaches on its own and comes back after
//! any broker fault; the control task reloads changed module files and
//! config, and drains mounts on shutdown.

mod budget;
mod control;
mod mount;
mod pause;
mod reload;
pub mod supervisor;
mod watch;

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminServer, Health, Metrics};
use crate::events::{ConfigChange, EVENT_CAPACITY, Event};
use crate::registry::{self, Registry};
use crate::sandbox::{
    CallLimits, Failure, Instances, LoadError, LogTags, Module, Owners, Sandbox, TenantShare,
};
use crate::telemetry::{Exporter, Settings, Telemetry};
use control::{Command, Control};
pub(crate) use mount::KeysNow;
pub use pause::{NoSuchMount, Pauses};
use wharf_core::config::{Config, Mount, Tenant};

/// How long a stopping host waits for its last spans to be exported.
const EXPORT_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The wasm engine could not be created.
    #[error("cannot create the wasm engine: {0}")]
    Engine(String),
    /// One or more modules are not usable handlers.
    #[error("{}", join_lines(.0))]
    Modules(Vec<MountError<LoadError>>),
    /// `[telemetry]` cannot be used.
    #[error("[telemetry]: {0}")]
    Telemetry(String),
    /// The admin listener could not be started.
    #[error("admin listener on {address}: {reason}")]
    Admin {
        /// The configured address.
        address: std::net::SocketAddr,
        /// Why.
        reason: String,
    },
}

/// An error that belongs to one mount.
#[derive(Debug, thiserror::Error)]
#[error("tenant `{tenant}`, mount `{mount}`: {source}")]
pub struct MountError<E: std::error::Error + 'static> {
    /// The tenant.
    pub tenant: String,
    /// The mount.
    pub mount: String,
    /// What went wrong.
    pub source: E,
}

fn join_lines<E: std::fmt::Display>(errors: &[E]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// What [`Host::load`] did with the modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModulesLoaded {
    /// Modules compiled.
    pub compiled: usize,
    /// Modules loaded from the module cache instead.
    pub from_cache: usize,
    /// How long both took.
    pub took: std::time::Duration,
}

/// A host whose modules are compiled and validated, not yet connected.
pub struct Host {
    config: Config,
    modules: Vec<Module>,
    /// How long compiling (or loading from the cache) the modules took.
    compile_time: std::time::Duration,
    sandbox: Sandbox,
    registry: Registry,
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    pauses: Arc<Pauses>,
    admin: Option<AdminServer>,
}

impl Host {
    /// Starts the admin listener, then compiles and validates every
    /// mount's module and instantiates each once. Any that fails refuses
    /// the whole configuration, each error naming tenant, mount and file.
    pub async fn load(config: Config) -> Result<Host, HostError> {
        // Listening first: a liveness probe is answered while modules
        // compile (not ready until the mounts start).
        let metrics = Metrics::new();
        let health = Arc::new(Health::default());
        let pauses = Arc::new(Pauses::default());
        pauses.configure(&config);
        let admin = match config.admin.clone() {
            Some(admin) => Some(
                AdminServer::start(
                    admin.listen,
                    admin.token,
                    metrics.clone(),
                    health.clone(),
                    pauses.clone(),
                )
                .await
                .map_err(|e| HostError::Admin {
                    address: admin.listen,
                    reason: e.to_string(),
                })?,
            ),
            None => None,
        };
        warn_if_pool_short(&config);
        let sandbox = Sandbox::with_module_cache(
            config.host.max_instances,
            config.host.module_cache.as_deref(),
        )
        .map_err(|e| HostError::Engine(wharf_core::words::chain(e.chain())))?;
        let registry = Registry::new(&config.host.registry);
        pull_modules(&registry, &config)
            .await
            .map_err(HostError::Modules)?;
        let compiling = std::time::Instant::now();
        let modules = load_modules(&sandbox, &config).map_err(HostError::Modules)?;
        let compile_time = compiling.elapsed();
        probe_modules(&sandbox, &config, &modules)
            .await
            .map_err(HostError::Modules)?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Ok(Host {
            config,
            modules,
            compile_time,
            sandbox,
            registry,
            events,
            metrics,
            health,
            pauses,
            admin,
        })
    }

    /// How the modules were made ready: how many compiled, how many
    /// loaded from the module cache, and how long it took.
    pub fn modules_loaded(&self) -> ModulesLoaded {
        let from_cache = self.modules.iter().filter(|m| m.from_disk_cache()).count();
        ModulesLoaded {
            compiled: self.modules.len() - from_cache,
            from_cache,
            took: self.compile_time,
        }
    }

    /// Watches what the host does. Subscribe before [`Host::start`] to see
    /// every mount become ready.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Starts every mount, and watches module files
    /// and the config file for changes. Mounts attach in the background
    /// (each [`Event::MountReady`] says one is up); a broker that cannot be
    /// reached is retried, never a reason to stop.
    pub async fn start(self) -> Result<RunningHost, HostError> {
        let (admin, health) = (self.admin, self.health);
        let (telemetry, exporter) = start_telemetry(&self.config, &self.metrics)?;
        let events = self.events.clone();
        let metrics = self.metrics.clone();
        let stopping = CancellationToken::new();
        let slots = self.sandbox.slots().clone();
        let control = Control::start(
            self.config,
            self.modules,
            self.sandbox,
            self.registry,
            slots,
            self.events,
            self.metrics,
            telemetry,
            health,
            self.pauses.clone(),
            stopping.clone(),
        );
        let (commands, inbox) = mpsc::unbounded_channel();
        let task = tokio::spawn(control.run(inbox));
        Ok(RunningHost {
            commands,
            stopping,
            task,
            events,
            admin,
            metrics,
            pauses: self.pauses,
            exporter,
        })
    }
}

/// Starts trace export when `[telemetry]` or the `OTEL_*` environment
/// asks for it.
fn start_telemetry(
    config: &Config,
    metrics: &Metrics,
) -> Result<(Telemetry, Option<Exporter>), HostError> {
    let mut warnings = Vec::new();
    let settings = Settings::resolve(
        &config.telemetry,
        |name| std::env::var(name).ok(),
        &mut warnings,
    )
    .map_err(HostError::Telemetry)?;
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let Some(settings) = settings else {
        return Ok((Telemetry::off(), None));
    };
    let (telemetry, exporter) = Telemetry::start(&settings, metrics.span_counts());
    tracing::info!(
        endpoint = %settings.destination.url,
        grpc = settings.destination.grpc,
        sampler = %settings.sampler,
        "exporting spans over OTLP"
    );
    Ok((telemetry, Some(exporter)))
}

/// Says when the mounts' `concurrency` adds up to more than the host's
/// instance pool: deliveries beyond it wait for an instance.
fn warn_if_pool_short(config: &Config) {
    let wanted: u64 = config
        .mounts()
        .map(|(_, mount)| u64::from(mount.concurrency))
        .sum();
    if wanted > u64::from(config.host.max_instances) {
        tracing::warn!(
            wanted,
            max_instances = config.host.max_instances,
            "the mounts' concurrency adds up to more than [host] max_instances; deliveries beyond it wait for a free instance"
        );
    }
}

/// Instantiates every mount's module once with the mount's grants and
/// limits: start-up code that traps, runs too long or calls what the mount
/// does not grant is refused here rather than on every delivery.
async fn probe_modules(
    sandbox: &Sandbox,
    config: &Config,
    modules: &[Module],
) -> Result<(), Vec<MountError<LoadError>>> {
    let owners: Owners = config.address_owners().into();
    let mounts: Vec<_> = config
        .mounts()
        .zip(modules)
        .map(|((tenant, mount), module)| (tenant, mount, module))
        .collect();
    let probed = probe_mounts(sandbox, &owners, &mounts).await;
    let errors: Vec<_> = mounts
        .iter()
        .zip(probed)
        .filter_map(|((tenant, mount, _), probed)| {
            let failure = probed.err()?;
            Some(MountError {
                tenant: tenant.name.clone(),
                mount: mount.name.clone(),
                source: LoadError {
                    path: mount.module.clone(),
                    reason: format!("does not start: {failure}"),
                },
            })
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Instantiates each mount's module once with the mount's grants and
/// limits, side by side: the sandbox's probe slots bound how many run at
/// once, each under its mount's `timeout`, so one module whose start-up
/// spins delays no other's past that. The results in `mounts`' order.
async fn probe_mounts(
    sandbox: &Sandbox,
    owners: &Owners,
    mounts: &[(&Tenant, &Mount, &Module)],
) -> Vec<Result<(), Failure>> {
    let probes = mounts.iter().map(|(tenant, mount, module)| {
        let tags = Arc::new(LogTags {
            tenant: tenant.name.as_str().into(),
            mount: mount.name.as_str().into(),
        });
        let instances = Instances::new(
            (*module).clone(),
            CallLimits {
                timeout: mount.timeout,
                memory: mount.memory,
            },
            mount.instance,
            mount.grants.clone(),
            tags,
            owners.clone(),
            TenantShare::new(&tenant.budget),
            sandbox.slots().clone(),
        );
        async move { instances.probe().await }
    });
    futures_util::future::join_all(probes).await
}

/// Pulls the modules the config names from registries; one that cannot
/// be pulled fails every mount using it.
async fn pull_modules(
    registry: &Registry,
    config: &Config,
) -> Result<(), Vec<MountError<LoadError>>> {
    let Err(failed) = registry::pull_all(registry, config).await else {
        return Ok(());
    };
    Err(config
        .mounts()
        .filter_map(|(tenant, mount)| {
            let reference = mount.pulled_from.as_ref()?;
            let (_, error) = failed.iter().find(|(r, _)| r == reference)?;
            Some(MountError {
                tenant: tenant.name.clone(),
                mount: mount.name.clone(),
                source: LoadError {
                    path: reference.to_string().into(),
                    reason: error.to_string(),
                },
            })
        })
        .collect())
}

/// Compiles every mount's module, or says which ones cannot be used.
fn load_modules(
    sandbox: &Sandbox,
    config: &Config,
) -> Result<Vec<Module>, Vec<MountError<LoadError>>> {
    let mut modules = Vec::new();
    let mut errors = Vec::new();
    for (tenant, mount) in config.mounts() {
        let started = std::time::Instant::now();
        let loaded = sandbox.load(&mount.module).and_then(|module| {
            // An instance that can never fit its memory limit would fail
            // every delivery.
            if module.initial_memory() > mount.memory {
                Err(LoadError {
                    path: mount.module.clone(),
                    reason: format!(
                        "needs {} bytes of linear memory to start, more than the mount's `memory` of {}",
                        module.initial_memory(),
                        mount.memory
                    ),
                })
            } else {
                Ok(module)
            }
        });
        match loaded {
            Ok(module) => {
                // A large module can take a minute to compile: one line
                // each shows a slow start is progressing, and which
                // module it waits on.
                tracing::debug!(
                    tenant = %tenant.name,
                    mount = %mount.name,
                    module = %mount.module.display(),
                    from_cache = module.from_disk_cache(),
                    elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "module loaded"
                );
                modules.push(module);
            }
            Err(source) => errors.push(MountError {
                tenant: tenant.name.clone(),
                mount: mount.name.clone(),
                source,
            }),
        }
    }
    if errors.is_empty() {
        Ok(modules)
    } else {
        Err(errors)
    }
}

/// A host taking deliveries.
pub struct RunningHost {
    commands: mpsc::UnboundedSender<Command>,
    stopping: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    events: broadcast::Sender<Event>,
    admin: Option<AdminServer>,
    metrics: Arc<Metrics>,
    pauses: Arc<Pauses>,
    exporter: Option<Exporter>,
}

impl RunningHost {
    /// Deliveries handled so far, over all mounts (cheap to poll, unlike
    /// the event stream, which a slow reader can fall behind).
    pub fn handled_total(&self) -> u64 {
        self.metrics.handled_total()
    }

    /// Watches what the host does.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The metrics, in the Prometheus text format `/metrics` serves.
    pub fn metrics_text(&self) -> String {
        self.metrics.encode()
    }

    /// The mounts' pause switches: what `POST /tenants/{t}/…/pause` sets.
    pub fn pauses(&self) -> &Pauses {
        &self.pauses
    }

    /// Where the admin listener listens, if the config asks for one.
    pub fn admin_address(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(AdminServer::address)
    }

    /// Reads the config file again and applies it: new mounts attach,
    /// removed ones drain, changed ones are replaced (attached first, so
    /// one the broker refuses leaves the old one serving), the rest are not
    /// touched. A config that does not load changes nothing.
    pub async fn reload(&self) -> ConfigChange {
        let (done, answer) = oneshot::channel();
        if self.commands.send(Command::Reload(done)).is_err() {
            return stopped();
        }
        answer.await.unwrap_or_else(|_| stopped())
    }

    /// Stops taking deliveries, lets in-flight handlers finish within the
    /// grace period and settles them, publishes held copies early, then
    /// detaches every link and closes the connections. A reload waiting on
    /// a broker gives up at once.
    pub async fn shutdown(mut self) {
        self.stopping.cancel();
        let _ = self.commands.send(Command::Shutdown);
        let _ = (&mut self.task).await;
        if let Some(exporter) = self.exporter.take() {
            exporter.flush(EXPORT_FLUSH).await;
        }
    }
}

fn stopped() -> ConfigChange {
    ConfigChange {
        error: Some("the host has stopped".to_owned()),
        ..ConfigChange::default()
    }
}
