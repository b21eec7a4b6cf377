//! What the publisher and the transaction committer share: the session
//! outputs go out on and the senders attached on it as addresses are first
//! used, the first link failure of a mount, and the end of a closing inbox.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use fe2o3_amqp::Sender;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::Target;
use fe2o3_amqp::types::primitives::Symbol;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::error::{AttachFailure, BrokerError, PublishFailure};
use super::{BrokerPool, PooledSession};
use crate::sync::Locked;

/// Senders attached on demand for outputs; past this many the least
/// recently used is detached, so a handler publishing to ever new addresses
/// cannot pile up links.
pub(super) const MAX_OUTPUT_SENDERS: usize = 64;

/// How long detaching an output sender evicted for a newer one may take.
pub(super) const CLOSE_OUTPUT_SENDER: Duration = Duration::from_secs(5);

/// Where a mount's outputs are published.
pub struct OutputsOn {
    /// The broker, for a session of their own.
    pub pool: BrokerPool,
    /// The terminus capability of their senders, if any.
    pub capability: Option<&'static str>,
}

/// One sender link to attach: its address and the node kind to ask for.
#[derive(Debug, Clone, Copy)]
pub struct SenderTarget<'a> {
    /// The address.
    pub address: &'a str,
    /// The terminus capability naming the kind of node, if any.
    pub capability: Option<&'static str>,
}

/// The first sender link failure, kept for the mount to report.
#[derive(Default)]
pub(super) struct Failure {
    pub(super) happened: CancellationToken,
    error: Mutex<Option<BrokerError>>,
}

impl Failure {
    pub(super) fn record(&self, error: BrokerError) {
        let mut slot = self.error.locked();
        if slot.is_none() {
            *slot = Some(error);
        }
        self.happened.cancel();
    }

    /// The recorded error, once: later callers get `None`.
    pub(super) fn take(&self) -> Option<BrokerError> {
        self.error.locked().take()
    }
}

pub(super) async fn attach_sender(
    session: &mut SessionHandle<()>,
    link_prefix: &str,
    target: SenderTarget<'_>,
) -> Result<Sender, BrokerError> {
    let mut terminus = Target::builder().address(target.address);
    if let Some(capability) = target.capability {
        terminus = terminus.capabilities(vec![Symbol::from(capability)]);
    }
    Sender::builder()
        .name(sender_link_name(link_prefix, target.address))
        .target(terminus.build())
        .attach(session)
        .await
        .map_err(|e| BrokerError::Attach {
            address: target.address.to_owned(),
            role: "sender",
            source: AttachFailure::Sender(e),
        })
}

/// A sender link's name: the mount's prefix and a short digest of the
/// address, never the address itself, which a handler or a publisher may
/// have chosen and which already travels once in the attach frame.
pub(super) fn sender_link_name(link_prefix: &str, address: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(address.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{link_prefix}/send/{hex}")
}

/// The session outputs go out on: begun from the pool when first needed,
/// or given (a transaction's, on the receiver's connection).
pub(super) struct OutputSession {
    on: OutputsOn,
    link_prefix: String,
    session: Option<PooledSession>,
}

impl OutputSession {
    pub(super) fn new(
        on: OutputsOn,
        link_prefix: String,
        session: Option<PooledSession>,
    ) -> OutputSession {
        OutputSession {
            on,
            link_prefix,
            session,
        }
    }

    /// A sender for `address`, on the session (begun now if there is none).
    pub(super) async fn attach(&mut self, address: &str) -> Result<Sender, PublishFailure> {
        let session = match &mut self.session {
            Some(session) => session,
            None => {
                let session =
                    self.on.pool.session().await.map_err(|e| {
                        PublishFailure::NotSent(format!("cannot begin a session: {e}"))
                    })?;
                self.session.insert(session)
            }
        };
        let target = SenderTarget {
            address,
            capability: self.on.capability,
        };
        attach_sender(&mut session.session, &self.link_prefix, target)
            .await
            .map_err(|e| match e {
                // The publish error names the address already.
                BrokerError::Attach { source, .. } => {
                    PublishFailure::Refused(format!("refused a sender link: {source}"))
                }
                other => PublishFailure::NotSent(other.to_string()),
            })
    }

    /// Forgets the session after a failure that may have ended it: the
    /// next output begins afresh.
    pub(super) fn reset(&mut self) {
        self.session = None;
    }
}

/// Senders by address, the least recently used first out once there are
/// [`MAX_OUTPUT_SENDERS`].
pub(super) struct SenderCache<S> {
    senders: HashMap<String, (S, u64)>,
    uses: u64,
}

impl<S> SenderCache<S> {
    pub(super) fn new() -> SenderCache<S> {
        SenderCache {
            senders: HashMap::new(),
            uses: 0,
        }
    }

    /// The sender for `address`, if attached; marks it used.
    pub(super) fn get(&mut self, address: &str) -> Option<&mut S> {
        self.uses += 1;
        let uses = self.uses;
        self.senders.get_mut(address).map(|(sender, used)| {
            *used = uses;
            sender
        })
    }

    pub(super) fn contains(&self, address: &str) -> bool {
        self.senders.contains_key(address)
    }

    /// Makes room for one more: takes out the least recently used sender
    /// not in `keep`, when the cache is full.
    pub(super) fn evict_for_one(&mut self, keep: impl Fn(&str) -> bool) -> Option<S> {
        if self.senders.len() < MAX_OUTPUT_SENDERS {
            return None;
        }
        let oldest = self
            .senders
            .iter()
            .filter(|(address, _)| !keep(address))
            .min_by_key(|(_, (_, used))| *used)
            .map(|(address, _)| address.clone())?;
        self.senders.remove(&oldest).map(|(sender, _)| sender)
    }

    pub(super) fn insert(&mut self, address: String, sender: S) -> &mut S {
        self.uses += 1;
        let entry = self.senders.entry(address).or_insert((sender, 0));
        entry.1 = self.uses;
        &mut entry.0
    }

    pub(super) fn remove(&mut self, address: &str) -> Option<S> {
        self.senders.remove(address).map(|(sender, _)| sender)
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = (String, S)> + '_ {
        self.senders
            .drain()
            .map(|(address, (sender, _))| (address, sender))
    }
}

/// Detaches `sender` within `timeout`, on a task of its own when `detached`
/// (an evicted sender must not hold up the publish that evicted it).
pub(super) async fn close_sender(sender: Sender, timeout: Duration, detached: bool) {
    let close = async move {
        let _ = tokio::time::timeout(timeout, sender.close()).await;
    };
    if detached {
        tokio::spawn(close);
    } else {
        close.await;
    }
}

/// The next request of `inbox`; once `close` is cancelled, only those
/// already queued, then `None`.
pub(super) async fn next_until_closed<T>(
    inbox: &mut mpsc::Receiver<T>,
    close: &CancellationToken,
) -> Option<T> {
    tokio::select! {
        request = inbox.recv() => request,
        () = close.cancelled() => {
            inbox.close();
            inbox.recv().await
        }
    }
}
