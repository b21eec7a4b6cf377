//! The host: every tenant's mounts, loaded, attached, reloaded and stopped.
//!
//! [`Host::load`] compiles every module before anything connects;
//! [`Host::start`] connects and hands the mounts to a control task, which
//! from then on owns them: it reloads changed module files and config, and
//! drains mounts on shutdown.

mod budget;
mod control;
mod delayed;
mod mount;
mod watch;

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::admin::{AdminServer, Health, Metrics};
use crate::broker::BrokerError;
use crate::config::Config;
use crate::events::{ConfigChange, EVENT_CAPACITY, Event};
use crate::sandbox::{LoadError, Module, Sandbox};
use control::{Command, Control};

/// Why the host could not start or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The wasm engine could not be created.
    #[error("cannot create the wasm engine: {0}")]
    Engine(String),
    /// One or more modules are not usable handlers.
    #[error("{}", join_lines(.0))]
    Modules(Vec<MountError<LoadError>>),
    /// The broker connection could not be opened.
    #[error("{0}")]
    Connect(BrokerError),
    /// The broker refused a mount's link, or the link failed.
    #[error("{0}")]
    Broker(MountError<BrokerError>),
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

/// A host whose modules are compiled and validated, not yet connected.
pub struct Host {
    config: Config,
    modules: Vec<Module>,
    sandbox: Sandbox,
    events: broadcast::Sender<Event>,
    metrics: Arc<Metrics>,
}

impl Host {
    /// Compiles and validates every mount's module. Any that fails refuses
    /// the whole configuration, each error naming tenant, mount and file.
    pub fn load(config: Config) -> Result<Host, HostError> {
        let sandbox = Sandbox::new().map_err(|e| HostError::Engine(format!("{e:#}")))?;
        let modules = load_modules(&sandbox, &config).map_err(HostError::Modules)?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Ok(Host {
            config,
            modules,
            sandbox,
            events,
            metrics: Metrics::new(),
        })
    }

    /// Watches what the host does. Subscribe before [`Host::start`] to see
    /// every mount become ready.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Connects to the broker(s), attaches every mount and starts watching
    /// module files and the config file for changes.
    pub async fn start(self) -> Result<RunningHost, HostError> {
        let health = Arc::new(Health::default());
        let admin = match self.config.admin.clone() {
            Some(admin) => Some(
                AdminServer::start(admin.listen, self.metrics.clone(), health.clone())
                    .await
                    .map_err(|e| HostError::Admin {
                        address: admin.listen,
                        reason: e.to_string(),
                    })?,
            ),
            None => None,
        };
        let events = self.events.clone();
        let (control, failures) = Control::start(
            self.config,
            self.modules,
            self.sandbox,
            self.events,
            self.metrics,
            health,
        )
        .await?;
        let (commands, inbox) = mpsc::unbounded_channel();
        let task = tokio::spawn(control.run(inbox));
        Ok(RunningHost {
            commands,
            failures,
            task,
            events,
            admin,
        })
    }
}

/// Compiles every mount's module, or says which ones cannot be used.
fn load_modules(
    sandbox: &Sandbox,
    config: &Config,
) -> Result<Vec<Module>, Vec<MountError<LoadError>>> {
    let mut modules = Vec::new();
    let mut errors = Vec::new();
    for (tenant, mount) in config.mounts() {
        match sandbox.load(&mount.module) {
            Ok(module) => modules.push(module),
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
    failures: mpsc::UnboundedReceiver<HostError>,
    task: tokio::task::JoinHandle<()>,
    events: broadcast::Sender<Event>,
    admin: Option<AdminServer>,
}

impl RunningHost {
    /// Watches what the host does.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Where the admin listener listens, if the config asks for one.
    pub fn admin_address(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().map(AdminServer::address)
    }

    /// Resolves when a mount stops on its own (its link failed). The host
    /// is then already draining; call [`RunningHost::shutdown`] to wait for it.
    pub async fn failed(&mut self) -> HostError {
        match self.failures.recv().await {
            Some(error) => error,
            None => std::future::pending().await,
        }
    }

    /// Reads the config file again and applies it: new mounts attach,
    /// removed ones drain, changed ones are replaced, the rest are not
    /// touched. A config that does not load changes nothing.
    pub async fn reload(&self) -> ConfigChange {
        let (done, answer) = oneshot::channel();
        if self.commands.send(Command::Reload(done)).is_err() {
            return stopped();
        }
        answer.await.unwrap_or_else(|_| stopped())
    }

    /// Stops taking deliveries, lets in-flight handlers finish within the
    /// grace period and settles them, publishes pending delayed copies early,
    /// then detaches every link and closes the connections.
    pub async fn shutdown(mut self) -> Result<(), HostError> {
        let _ = self.commands.send(Command::Shutdown);
        let _ = (&mut self.task).await;
        self.failures.try_recv().map_or(Ok(()), Err)
    }
}

fn stopped() -> ConfigChange {
    ConfigChange {
        error: Some("the host has stopped".to_owned()),
        ..ConfigChange::default()
    }
}
