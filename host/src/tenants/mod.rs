//! The host: every tenant's mounts, loaded, attached and stopped together.

mod delayed;
mod mount;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::broker::{BrokerConnection, BrokerError};
use crate::config::Config;
use crate::events::{EVENT_CAPACITY, Event};
use crate::sandbox::{LoadError, LogTags, Module, Sandbox};
use mount::AttachedMount;

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
    events: broadcast::Sender<Event>,
    // Owns the engine's epoch ticker; modules keep the engine itself alive.
    _sandbox: Sandbox,
}

impl Host {
    /// Compiles and validates every mount's module. Any that fails refuses
    /// the whole configuration, each error naming tenant, mount and file.
    pub fn load(config: Config) -> Result<Host, HostError> {
        let sandbox = Sandbox::new().map_err(|e| HostError::Engine(format!("{e:#}")))?;
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
        if !errors.is_empty() {
            return Err(HostError::Modules(errors));
        }
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Ok(Host {
            config,
            modules,
            events,
            _sandbox: sandbox,
        })
    }

    /// Watches what the host does. Subscribe before [`Host::start`] to see
    /// every mount become ready.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Connects to the broker and attaches every mount.
    pub async fn start(self) -> Result<RunningHost, HostError> {
        let Host {
            config,
            modules,
            events,
            _sandbox: sandbox,
        } = self;
        let mut connection =
            BrokerConnection::open(&config.broker.url, &config.broker.container_id)
                .await
                .map_err(HostError::Connect)?;
        tracing::info!(broker = connection.url(), "connected");
        let stop = CancellationToken::new();
        let mut mounts = JoinSet::new();
        let grace = config.host.shutdown_grace;
        for ((tenant, mount), module) in config.mounts().zip(modules) {
            let tags = Arc::new(LogTags {
                tenant: tenant.name.as_str().into(),
                mount: mount.name.as_str().into(),
            });
            match AttachedMount::attach(&mut connection, tags, mount, module, &events).await {
                Ok(attached) => {
                    mounts.spawn(run_mount(attached, stop.clone(), grace, events.clone()));
                }
                Err(source) => {
                    stop.cancel();
                    while mounts.join_next().await.is_some() {}
                    connection.close().await;
                    return Err(HostError::Broker(MountError {
                        tenant: tenant.name.clone(),
                        mount: mount.name.clone(),
                        source,
                    }));
                }
            }
        }
        Ok(RunningHost {
            connection: Some(connection),
            mounts,
            stop,
            events,
            _sandbox: sandbox,
        })
    }
}

/// Runs an attached mount to its end and reports how it ended.
async fn run_mount(
    attached: AttachedMount,
    stop: CancellationToken,
    grace: Duration,
    events: broadcast::Sender<Event>,
) -> Result<(), MountError<BrokerError>> {
    let tags = attached.tags().clone();
    let result = attached.run(stop, grace).await;
    let _ = events.send(Event::MountStopped {
        tenant: tags.tenant.clone(),
        mount: tags.mount.clone(),
        error: result.as_ref().err().map(ToString::to_string),
    });
    result.map_err(|source| MountError {
        tenant: tags.tenant.to_string(),
        mount: tags.mount.to_string(),
        source,
    })
}

/// A host taking deliveries.
pub struct RunningHost {
    connection: Option<BrokerConnection>,
    mounts: JoinSet<Result<(), MountError<BrokerError>>>,
    stop: CancellationToken,
    events: broadcast::Sender<Event>,
    _sandbox: Sandbox,
}

impl RunningHost {
    /// Watches what the host does.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Resolves when a mount stops on its own (its link failed). The host
    /// should then be shut down.
    pub async fn failed(&mut self) -> HostError {
        loop {
            match self.mounts.join_next().await {
                Some(Ok(Err(e))) => return HostError::Broker(e),
                Some(_) => continue,
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Stops taking deliveries, lets in-flight handlers finish within the
    /// grace period and settles them, publishes pending delayed copies early,
    /// then detaches every link and closes the connection.
    pub async fn shutdown(mut self) -> Result<(), HostError> {
        self.stop.cancel();
        let mut first_error = None;
        while let Some(joined) = self.mounts.join_next().await {
            if let Ok(Err(e)) = joined {
                tracing::error!("{e}");
                first_error.get_or_insert(HostError::Broker(e));
            }
        }
        if let Some(connection) = self.connection.take() {
            connection.close().await;
        }
        first_error.map_or(Ok(()), Err)
    }
}
