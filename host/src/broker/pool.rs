//! The connections to one broker: opened when a session is needed, replaced
//! when lost, more of them when the broker limits sessions per connection.
//!
//! Mounts ask for sessions; the pool hands them out on a live connection or
//! opens one, moving on to the next node of a cluster after a failure. While
//! the broker cannot be reached, one attempt is made per backoff period and
//! every request in between gets the last error at once, so the mounts back
//! off on their own clocks instead of piling up on a dead socket.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fe2o3_amqp::session::{BeginError, SessionHandle};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::CLOSE_TIMEOUT;
use super::connection::{BrokerConnection, BrokerOffers, ConnectOptions};
use super::error::{BrokerError, Timed};
use crate::logging::{Repeats, Tell, human};
use wharf_core::backoff::{Backoff, BackoffPolicy};
use wharf_core::endpoint::Endpoint;

/// How often the pool looks for connections that ended on their own.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// A session on one of the pool's connections. Dropping it ends the session
/// and frees its place on the connection.
pub struct PooledSession {
    /// The session.
    pub session: SessionHandle<()>,
    /// The node the connection is to.
    pub endpoint: Endpoint,
    /// What the broker said about itself when the connection opened.
    pub offers: BrokerOffers,
    /// Which of the pool's connections the session is on.
    pub connection: u64,
    _lease: Lease,
}

struct Lease {
    sessions: Arc<AtomicUsize>,
    full: Arc<AtomicBool>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.sessions.fetch_sub(1, Ordering::Relaxed);
        self.full.store(false, Ordering::Relaxed);
    }
}

/// What the pool knows of its broker, for health and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStatus {
    /// Connections open now.
    pub connections: usize,
    /// Connections opened since start; more than one per node means
    /// reconnects.
    pub opened: u64,
    /// Connections lost (closed without being asked to).
    pub lost: u64,
    /// The last failure to connect, cleared by a success.
    pub last_error: Option<String>,
}

/// A handle to the pool of one broker. Clones share it; the connections
/// close when [`BrokerPool::close`] is called or every handle is dropped.
#[derive(Clone)]
pub struct BrokerPool {
    requests: mpsc::UnboundedSender<Request>,
    status: watch::Receiver<PoolStatus>,
}

enum Request {
    Session(oneshot::Sender<Result<PooledSession, Arc<BrokerError>>>),
    SessionOn(
        u64,
        oneshot::Sender<Result<PooledSession, Arc<BrokerError>>>,
    ),
    Close(oneshot::Sender<()>),
}

impl BrokerPool {
    /// A pool for the broker whose nodes are `endpoints`; nothing connects
    /// until a session is asked for.
    pub fn new(
        endpoints: Vec<Endpoint>,
        options: ConnectOptions,
        waits: BackoffPolicy,
    ) -> BrokerPool {
        let (requests, inbox) = mpsc::unbounded_channel();
        let (status_tx, status) = watch::channel(PoolStatus::default());
        let task = PoolTask {
            endpoints,
            next_endpoint: 0,
            options,
            backoff: Backoff::new(waits),
            connections: Vec::new(),
            opened: 0,
            failed_until: None,
            failures: Repeats::default(),
            status: status_tx,
        };
        tokio::spawn(task.run(inbox));
        BrokerPool { requests, status }
    }

    /// A new session, on a live connection (opened if need be). Fails at
    /// once with the last error while the broker is being backed off from.
    pub async fn session(&self) -> Result<PooledSession, Arc<BrokerError>> {
        let (done, answer) = oneshot::channel();
        self.requests
            .send(Request::Session(done))
            .map_err(|_| cannot_begin())?;
        answer.await.map_err(|_| cannot_begin())?
    }

    /// A new session on `connection` (a [`PooledSession::connection`]), for
    /// work the broker ties to one connection (a transaction's). Fails if
    /// that connection is gone or takes no more sessions.
    pub async fn session_on(&self, connection: u64) -> Result<PooledSession, Arc<BrokerError>> {
        let (done, answer) = oneshot::channel();
        self.requests
            .send(Request::SessionOn(connection, done))
            .map_err(|_| cannot_begin())?;
        answer.await.map_err(|_| cannot_begin())?
    }

    /// What the pool knows now.
    pub fn status(&self) -> PoolStatus {
        self.status.borrow().clone()
    }

    /// Closes every connection (the sessions on them end).
    pub async fn close(&self) {
        let (done, answer) = oneshot::channel();
        if self.requests.send(Request::Close(done)).is_ok() {
            let _ = answer.await;
        }
    }
}

/// A session asked of a pool that is closed, or on a connection it lost.
fn cannot_begin() -> Arc<BrokerError> {
    Arc::new(BrokerError::Begin {
        source: Timed::Failed(BeginError::IllegalState),
    })
}

struct Live {
    /// Unique within the pool.
    id: u64,
    connection: BrokerConnection,
    sessions: Arc<AtomicUsize>,
    /// The broker refused one more session on it; cleared when one ends.
    full: Arc<AtomicBool>,
}

struct PoolTask {
    endpoints: Vec<Endpoint>,
    next_endpoint: usize,
    options: ConnectOptions,
    backoff: Backoff,
    connections: Vec<Live>,
    opened: u64,
    /// While set, connect attempts are not made: the last one failed.
    failed_until: Option<(Instant, Arc<BrokerError>)>,
    /// Connect failures, so a repeated one is not logged at every attempt.
    failures: Repeats,
    status: watch::Sender<PoolStatus>,
}

impl PoolTask {
    async fn run(mut self, mut inbox: mpsc::UnboundedReceiver<Request>) {
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                request = inbox.recv() => match request {
                    Some(Request::Session(done)) => {
                        let session = self.session().await;
                        let _ = done.send(session);
                    }
                    Some(Request::SessionOn(connection, done)) => {
                        let session = self.session_on(connection).await;
                        let _ = done.send(session);
                    }
                    Some(Request::Close(done)) => {
                        self.close_all().await;
                        let _ = done.send(());
                    }
                    None => break,
                },
                _ = check.tick() => self.forget_closed(),
            }
        }
        self.close_all().await;
    }

    async fn session(&mut self) -> Result<PooledSession, Arc<BrokerError>> {
        self.forget_closed();
        for live in &mut self.connections {
            if live.full.load(Ordering::Relaxed) {
                continue;
            }
            match live.connection.begin_session().await {
                Ok(session) => return Ok(lease(live, session)),
                Err(BrokerError::Begin {
                    source: Timed::Failed(BeginError::LocalChannelMaxReached),
                }) => {
                    tracing::info!(
                        broker = %live.connection.endpoint(),
                        sessions = live.sessions.load(Ordering::Relaxed),
                        "the broker allows no more sessions on this connection; opening another"
                    );
                    live.full.store(true, Ordering::Relaxed);
                }
                Err(e) if live.connection.is_closed() => {
                    tracing::debug!(error = %e, "connection ended while beginning a session");
                }
                Err(e) => return Err(Arc::new(e)),
            }
        }
        self.forget_closed();
        let mut live = self.connect().await?;
        let begun = live.connection.begin_session().await;
        let session = begun.map(|session| lease(&mut live, session));
        self.connections.push(live);
        // Counted once it is in the pool: readiness and the metrics read it.
        self.publish_status(None);
        session.map_err(Arc::new)
    }

    async fn session_on(&mut self, connection: u64) -> Result<PooledSession, Arc<BrokerError>> {
        self.forget_closed();
        let live = self
            .connections
            .iter_mut()
            .find(|live| live.id == connection)
            .ok_or_else(cannot_begin)?;
        let session = live.connection.begin_session().await.map_err(Arc::new)?;
        Ok(lease(live, session))
    }

    /// Opens a connection to the next node, unless the last attempt failed
    /// too recently.
    async fn connect(&mut self) -> Result<Live, Arc<BrokerError>> {
        if let Some((until, error)) = &self.failed_until
            && Instant::now() < *until
        {
            return Err(error.clone());
        }
        let endpoint = self.endpoints[self.next_endpoint % self.endpoints.len()].clone();
        let mut options = self.options.clone();
        // Brokers may refuse a second connection with the same container id.
        if self.opened > 0 {
            options.container_id = format!("{}-{}", options.container_id, self.opened);
        }
        match BrokerConnection::open(&endpoint, &options).await {
            Ok(connection) => {
                tracing::info!(broker = %endpoint, "connected");
                self.failures.ended();
                self.opened += 1;
                self.backoff.reset();
                self.failed_until = None;
                Ok(Live {
                    id: self.opened,
                    connection,
                    sessions: Arc::default(),
                    full: Arc::default(),
                })
            }
            Err(e) => {
                // The next attempt goes to the next node of a cluster.
                self.next_endpoint += 1;
                let error = Arc::new(e);
                let wait = self.backoff.next_wait();
                self.tell_unreachable(&error, wait);
                self.failed_until = Some((Instant::now() + wait, error.clone()));
                self.publish_status(Some(error.to_string()));
                Err(error)
            }
        }
    }

    /// Logs a failed connect: in full the first time, then a reminder at
    /// most once a minute while the same failure repeats.
    fn tell_unreachable(&mut self, error: &BrokerError, wait: Duration) {
        let retry_in = human(wait);
        match self.failures.happened(&error.to_string()) {
            Tell::First if error.is_permanent() => {
                tracing::error!(
                    "{error}. Retrying will not mend this; wharf keeps retrying (next in {retry_in}) and reminds once a minute"
                );
            }
            Tell::First => tracing::warn!("{error} (retrying in {retry_in})"),
            Tell::Again { times, lasting } => {
                let lasting = human(lasting);
                if error.is_permanent() {
                    tracing::error!(
                        "still cannot connect after {lasting} ({times} more attempts): {error}"
                    );
                } else {
                    tracing::warn!(
                        "still cannot connect after {lasting} ({times} more attempts): {error}"
                    );
                }
            }
            Tell::Quiet => tracing::debug!("{error} (retrying in {retry_in})"),
        }
    }

    /// Drops connections that ended on their own; the mounts on them see
    /// their links fail and ask for new sessions.
    fn forget_closed(&mut self) {
        let before = self.connections.len();
        self.connections.retain(|live| {
            let closed = live.connection.is_closed();
            if closed {
                tracing::warn!(broker = %live.connection.endpoint(), "connection lost");
            }
            !closed
        });
        let lost = before - self.connections.len();
        if lost > 0 {
            // Reconnects start from the next node, as a client of a cluster
            // would after losing one.
            self.next_endpoint += 1;
            self.status.send_modify(|status| status.lost += lost as u64);
            self.publish_status(None);
        }
    }

    async fn close_all(&mut self) {
        for live in self.connections.drain(..) {
            live.connection.close(CLOSE_TIMEOUT).await;
        }
        self.publish_status(None);
    }

    fn publish_status(&self, error: Option<String>) {
        let (connections, opened) = (self.connections.len(), self.opened);
        self.status.send_modify(|status| {
            status.connections = connections;
            status.opened = opened;
            if error.is_some() || connections > 0 {
                status.last_error = error;
            }
        });
    }
}

fn lease(live: &mut Live, session: SessionHandle<()>) -> PooledSession {
    live.sessions.fetch_add(1, Ordering::Relaxed);
    PooledSession {
        session,
        endpoint: live.connection.endpoint().clone(),
        offers: live.connection.offers().clone(),
        connection: live.id,
        _lease: Lease {
            sessions: live.sessions.clone(),
            full: live.full.clone(),
        },
    }
}
