//! Publishing copies, dead letters and handlers' outputs, and waiting for
//! the broker to take them: never longer than the publish time-out, so a
//! broker that blocks producers cannot stall a delivery or a shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp::Sender;
use fe2o3_amqp::link::ErrorRecovery;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{Outcome, Target};
use fe2o3_amqp::types::primitives::Symbol;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::{AttachFailure, BrokerError, PublishFailure};
use super::transaction::{Transactions, TransactionsOn};
use super::{BrokerPool, PooledSession};

/// The capability a broker offers on a sender link when it schedules
/// messages by their `x-opt-delivery-time` (Artemis does).
const DELAYED_DELIVERY: &str = "DELAYED_DELIVERY";

struct Request {
    address: String,
    payload: Bytes,
    /// A handler's output, to any address, on the outputs' own session.
    output: bool,
    done: oneshot::Sender<Result<(), BrokerError>>,
}

/// A handle to publish messages: copies and dead letters to the addresses
/// attached up front, handlers' outputs to any. Clones share the links.
#[derive(Clone)]
pub struct Publisher {
    requests: mpsc::Sender<Request>,
    transactions: Option<Transactions>,
}

/// The tasks that own the sender links.
pub struct PublisherTask {
    task: tokio::task::JoinHandle<()>,
    transactions: Option<tokio::task::JoinHandle<()>>,
    close: CancellationToken,
    failure: Arc<Failure>,
}

/// The first sender link failure, kept for the mount to report.
#[derive(Default)]
pub(super) struct Failure {
    pub(super) happened: CancellationToken,
    error: Mutex<Option<BrokerError>>,
}

impl Failure {
    pub(super) fn record(&self, error: BrokerError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
        self.happened.cancel();
    }
}

/// One sender link to attach: its address and the node kind to ask for.
#[derive(Debug, Clone, Copy)]
pub struct SenderTarget<'a> {
    /// The address.
    pub address: &'a str,
    /// The terminus capability naming the kind of node, if any.
    pub capability: Option<&'static str>,
}

/// What the broker offered on the sender links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// The first target's link schedules messages by delivery time.
    pub delayed_delivery: bool,
}

impl PublisherTask {
    /// Resolves when a sender link failed: the mount's links must come down
    /// and be attached again. Cancel-safe.
    pub async fn failed(&mut self) -> BrokerError {
        self.failure.happened.cancelled().await;
        let taken = self
            .failure
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match taken {
            Some(error) => error,
            // Reported once already; the mount is going down.
            None => std::future::pending().await,
        }
    }

    /// Refuses new publishes, waits until every one already asked for has
    /// the broker's answer (each within its time-out), then detaches the
    /// links, waiting at most `close_timeout` for each.
    pub async fn close(self) {
        self.close.cancel();
        if let Some(transactions) = self.transactions {
            let _ = transactions.await;
        }
        let _ = self.task.await;
    }
}

impl Publisher {
    /// Attaches one sender per distinct address of `targets` on `session`.
    /// Outputs go out on a session of their own from `outputs`, begun when
    /// first needed, with senders attached as each address is first used:
    /// a broker that ends the session over an address it refuses (RabbitMQ
    /// 4 does) then takes down no link of the mount's. With `transactions`,
    /// outputs are committed with their inputs instead (the controller on
    /// `session`, the outputs on a session of their own on its
    /// connection); failing to set that up fails the attach.
    pub async fn attach(
        session: &mut SessionHandle<()>,
        link_prefix: &str,
        targets: &[SenderTarget<'_>],
        outputs: OutputsOn,
        transactions: Option<TransactionsOn<'_>>,
        publish_timeout: Duration,
        close_timeout: Duration,
    ) -> Result<(Publisher, PublisherTask, Offered), BrokerError> {
        let mut senders = HashMap::new();
        let mut delayed_delivery = false;
        for (index, target) in targets.iter().enumerate() {
            if senders.contains_key(target.address) {
                continue;
            }
            let sender = attach_sender(session, link_prefix, *target).await?;
            if index == 0 {
                delayed_delivery = sender
                    .remote_offered_capabilities()
                    .is_some_and(|offered| offered.iter().any(|c| c.0 == DELAYED_DELIVERY));
            }
            senders.insert(target.address.to_owned(), sender);
        }
        let close = CancellationToken::new();
        let failure = Arc::new(Failure::default());
        let (transactions, transactions_task) = match transactions {
            Some(on) => {
                let attached =
                    Transactions::attach(on, session, failure.clone(), close.clone()).await;
                match attached {
                    Ok((handle, task)) => (Some(handle), Some(task)),
                    Err(e) => {
                        for (_, sender) in senders {
                            let _ = tokio::time::timeout(close_timeout, sender.close()).await;
                        }
                        return Err(e);
                    }
                }
            }
            None => (None, None),
        };
        let (requests, inbox) = mpsc::channel(256);
        let links = Links {
            senders,
            outputs: OutputLinks::new(outputs, format!("{link_prefix}/out"), None),
            publish_timeout,
            close_timeout,
            failure: failure.clone(),
        };
        let task = tokio::spawn(links.serve(inbox, close.clone()));
        let task = PublisherTask {
            task,
            transactions: transactions_task,
            close,
            failure,
        };
        let publisher = Publisher {
            requests,
            transactions,
        };
        Ok((publisher, task, Offered { delayed_delivery }))
    }

    /// Publishes an encoded message to `address`, one of those attached up
    /// front, and waits for the broker's `accepted`.
    pub async fn publish(&self, address: &str, payload: Bytes) -> Result<(), BrokerError> {
        self.request(address, payload, false).await
    }

    /// Where outputs are committed with their inputs, when they are.
    pub fn transactions(&self) -> Option<&Transactions> {
        self.transactions.as_ref()
    }

    /// Publishes a handler's output, encoded, to `address` and waits for
    /// the broker's `accepted`.
    pub async fn publish_output(&self, address: &str, payload: Bytes) -> Result<(), BrokerError> {
        self.request(address, payload, true).await
    }

    async fn request(
        &self,
        address: &str,
        payload: Bytes,
        output: bool,
    ) -> Result<(), BrokerError> {
        let (done, answer) = oneshot::channel();
        let request = Request {
            address: address.to_owned(),
            payload,
            output,
            done,
        };
        let gone = || BrokerError::Publish {
            address: address.to_owned(),
            source: PublishFailure::LinkDown,
        };
        self.requests.send(request).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// Where a mount's outputs are published.
pub struct OutputsOn {
    /// The broker, for a session of their own.
    pub pool: BrokerPool,
    /// The terminus capability of their senders, if any.
    pub capability: Option<&'static str>,
}

/// Senders attached on demand for outputs; past this many the least
/// recently attached is detached, so a handler publishing to ever new
/// addresses cannot pile up links.
const MAX_OUTPUT_SENDERS: usize = 64;

async fn attach_sender(
    session: &mut SessionHandle<()>,
    link_prefix: &str,
    target: SenderTarget<'_>,
) -> Result<Sender, BrokerError> {
    let mut terminus = Target::builder().address(target.address);
    if let Some(capability) = target.capability {
        terminus = terminus.capabilities(vec![Symbol::from(capability)]);
    }
    Sender::builder()
        .name(format!("{link_prefix}/send/{}", target.address))
        .target(terminus.build())
        .attach(session)
        .await
        .map_err(|e| BrokerError::Attach {
            address: target.address.to_owned(),
            role: "sender",
            source: AttachFailure::Sender(e),
        })
}

/// The session and senders of a mount's outputs.
pub(super) struct OutputLinks {
    on: OutputsOn,
    link_prefix: String,
    session: Option<PooledSession>,
    senders: HashMap<String, Sender>,
    /// Addresses of `senders`, oldest first.
    attached: Vec<String>,
}

impl OutputLinks {
    /// Output senders on `session`, or on one begun when first needed.
    pub(super) fn new(
        on: OutputsOn,
        link_prefix: String,
        session: Option<PooledSession>,
    ) -> OutputLinks {
        OutputLinks {
            on,
            link_prefix,
            session,
            senders: HashMap::new(),
            attached: Vec::new(),
        }
    }

    /// The sender for `address`, attached (on a session begun) now if
    /// there is none yet.
    pub(super) async fn sender(&mut self, address: &str) -> Result<&mut Sender, PublishFailure> {
        if !self.senders.contains_key(address) {
            if self.attached.len() >= MAX_OUTPUT_SENDERS {
                let oldest = self.attached.remove(0);
                if let Some(sender) = self.senders.remove(&oldest) {
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(CLOSE_OUTPUT_SENDER, sender.close()).await;
                    });
                }
            }
            let session = match &mut self.session {
                Some(session) => session,
                None => {
                    let session = self.on.pool.session().await.map_err(|e| {
                        PublishFailure::Refused(format!("cannot begin a session: {e}"))
                    })?;
                    self.session.insert(session)
                }
            };
            let target = SenderTarget {
                address,
                capability: self.on.capability,
            };
            let sender = attach_sender(&mut session.session, &self.link_prefix, target)
                .await
                .map_err(|e| match e {
                    // The publish error names the address already.
                    BrokerError::Attach { source, .. } => {
                        PublishFailure::Refused(format!("cannot attach a sender link: {source}"))
                    }
                    other => PublishFailure::Refused(other.to_string()),
                })?;
            self.attached.push(address.to_owned());
            self.senders.insert(address.to_owned(), sender);
        }
        Ok(self
            .senders
            .get_mut(address)
            .expect("attached above when missing"))
    }

    /// Forgets the session and every sender on it, after a failure that
    /// may have ended it: the next output begins afresh.
    fn reset(&mut self) {
        self.senders.clear();
        self.attached.clear();
        self.session = None;
    }

    pub(super) async fn close(self, timeout: Duration) {
        for (_, sender) in self.senders {
            let _ = tokio::time::timeout(timeout, sender.close()).await;
        }
    }
}

/// How long detaching an output sender evicted for a newer one may take.
const CLOSE_OUTPUT_SENDER: Duration = Duration::from_secs(5);

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

struct Links {
    senders: HashMap<String, Sender>,
    outputs: OutputLinks,
    publish_timeout: Duration,
    close_timeout: Duration,
    failure: Arc<Failure>,
}

impl Links {
    async fn serve(mut self, mut inbox: mpsc::Receiver<Request>, close: CancellationToken) {
        let mut waiting = tokio::task::JoinSet::new();
        loop {
            let Some(Request {
                address,
                payload,
                output,
                done,
            }) = next_until_closed(&mut inbox, &close).await
            else {
                break;
            };
            let fail = |source| BrokerError::Publish {
                address: address.clone(),
                source,
            };
            if self.failure.happened.is_cancelled() {
                let _ = done.send(Err(fail(PublishFailure::LinkDown)));
                continue;
            }
            // Credit, attaching an output's sender and the broker's answer
            // share one deadline.
            let deadline = Instant::now() + self.publish_timeout;
            let sender = if output {
                match tokio::time::timeout_at(deadline, self.outputs.sender(&address)).await {
                    Ok(Ok(sender)) => sender,
                    Ok(Err(e)) => {
                        self.outputs.reset();
                        let _ = done.send(Err(fail(e)));
                        continue;
                    }
                    Err(_) => {
                        self.outputs.reset();
                        let _ =
                            done.send(Err(fail(PublishFailure::TimedOut(self.publish_timeout))));
                        continue;
                    }
                }
            } else if let Some(sender) = self.senders.get_mut(&address) {
                sender
            } else {
                let _ = done.send(Err(fail(PublishFailure::Refused(
                    "no sender link is attached to this address".to_owned(),
                ))));
                continue;
            };
            let sent =
                tokio::time::timeout_at(deadline, sender.send_payload_batchable(payload)).await;
            let outcome = match sent {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(e)) if e.recovery() != ErrorRecovery::UseLink => {
                    let _ = done.send(Err(fail(PublishFailure::LinkDown)));
                    // An output's session is the outputs' own: begin again.
                    if output {
                        self.outputs.reset();
                    } else {
                        self.failure
                            .record(BrokerError::Sender { address, source: e });
                    }
                    continue;
                }
                Ok(Err(e)) => {
                    let _ = done.send(Err(fail(PublishFailure::Send(e))));
                    continue;
                }
                Err(_) => {
                    let _ = done.send(Err(fail(PublishFailure::TimedOut(self.publish_timeout))));
                    continue;
                }
            };
            // Pipeline: the transfer is on the link; wait for the answer
            // beside the loop.
            let timeout = self.publish_timeout;
            waiting.spawn(async move {
                let result = match tokio::time::timeout_at(deadline, outcome).await {
                    Ok(Ok(Outcome::Accepted(_))) => Ok(()),
                    Ok(Ok(other)) => Err(PublishFailure::Refused(format!("{other:?}"))),
                    Ok(Err(e)) => Err(PublishFailure::Send(e)),
                    Err(_) => Err(PublishFailure::TimedOut(timeout)),
                };
                let _ =
                    done.send(result.map_err(|source| BrokerError::Publish { address, source }));
            });
            while waiting.try_join_next().is_some() {}
        }
        while waiting.join_next().await.is_some() {}
        for (_, sender) in self.senders {
            let _ = tokio::time::timeout(self.close_timeout, sender.close()).await;
        }
        self.outputs.close(self.close_timeout).await;
    }
}
