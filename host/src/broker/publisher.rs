//! Publishing copies, dead letters and handlers' outputs, and waiting for
//! the broker to take them: never past the publish time-out counted from
//! when the publish was asked for, so a broker that blocks producers cannot
//! stall a delivery or a shutdown.
//!
//! Each address has a task of its own with its sender link: an address the
//! broker blocks holds up only what goes to it, and what waited there past
//! its deadline is answered at once rather than one time-out after another.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp::Sender;
use fe2o3_amqp::link::ErrorRecovery;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::Outcome;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::{BrokerError, PublishFailure};
use super::outputs::{
    Failure, OutputSession, OutputsOn, SenderCache, SenderTarget, attach_sender, next_until_closed,
};
use super::transaction::{Transactions, TransactionsOn};

/// The capability a broker offers on a sender link when it schedules
/// messages by their `x-opt-delivery-time` (Artemis does).
const DELAYED_DELIVERY: &str = "DELAYED_DELIVERY";

struct Request {
    address: String,
    payload: Bytes,
    /// A handler's output, to any address, on the outputs' own session.
    output: bool,
    /// Asked for this long ago at most: the answer is due by then.
    deadline: Instant,
    done: oneshot::Sender<Result<(), PublishFailure>>,
}

/// A handle to publish messages: copies and dead letters to the addresses
/// attached up front, handlers' outputs to any. Clones share the links.
#[derive(Clone)]
pub struct Publisher {
    /// Boxed: a channel's first block holds 32 items from its creation.
    requests: mpsc::Sender<Box<Request>>,
    transactions: Option<Transactions>,
    publish_timeout: Duration,
}

/// The tasks that own the sender links.
pub struct PublisherTask {
    task: tokio::task::JoinHandle<()>,
    transactions: Option<tokio::task::JoinHandle<()>>,
    close: CancellationToken,
    failure: Arc<Failure>,
}

/// What the broker offered on the sender links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// The first target's link schedules messages by delivery time.
    pub delayed_delivery: bool,
}

/// Whether the broker offered to schedule messages on `sender`'s link.
pub(super) fn offers_delayed_delivery(sender: &Sender) -> bool {
    sender
        .remote_offered_capabilities()
        .is_some_and(|offered| offered.iter().any(|c| c.0 == DELAYED_DELIVERY))
}

impl PublisherTask {
    /// Resolves when a sender link failed: the mount's links must come down
    /// and be attached again. Cancel-safe.
    pub async fn failed(&mut self) -> BrokerError {
        self.failure.happened.cancelled().await;
        match self.failure.take() {
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
        let mut senders: HashMap<String, Sender> = HashMap::new();
        let mut delayed_delivery = false;
        for (index, target) in targets.iter().enumerate() {
            if senders.contains_key(target.address) {
                continue;
            }
            let sender = attach_sender(session, link_prefix, *target).await?;
            if index == 0 {
                delayed_delivery = offers_delayed_delivery(&sender);
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
        let workers = Workers {
            tasks: JoinSet::new(),
            publish_timeout,
            close_timeout,
            failure: failure.clone(),
        };
        let dispatcher = Dispatcher {
            idle: senders,
            fixed: HashMap::new(),
            outputs: OutputSession::new(outputs, format!("{link_prefix}/out"), None),
            output_workers: SenderCache::new(),
            session_lost: CancellationToken::new(),
            workers,
        };
        let task = tokio::spawn(dispatcher.serve(inbox, close.clone()));
        let task = PublisherTask {
            task,
            transactions: transactions_task,
            close,
            failure,
        };
        let publisher = Publisher {
            requests,
            transactions,
            publish_timeout,
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
        let failed = |source| BrokerError::Publish {
            address: address.to_owned(),
            source,
        };
        let (done, answer) = oneshot::channel();
        let request = Box::new(Request {
            address: address.to_owned(),
            payload,
            output,
            deadline: Instant::now() + self.publish_timeout,
            done,
        });
        self.requests
            .send(request)
            .await
            .map_err(|_| failed(PublishFailure::links_down()))?;
        answer
            .await
            .map_err(|_| failed(PublishFailure::links_down()))?
            .map_err(failed)
    }
}

/// Hands each request to the task of its address, attaching output senders
/// as addresses are first used.
struct Dispatcher {
    /// Senders attached up front whose task starts with their first
    /// publish: most mounts' copy and dead-letter addresses see none for
    /// long stretches, and an idle task costs kilobytes on every mount of
    /// a host that runs thousands.
    idle: HashMap<String, Sender>,
    fixed: HashMap<String, mpsc::UnboundedSender<Box<Request>>>,
    outputs: OutputSession,
    output_workers: SenderCache<mpsc::UnboundedSender<Box<Request>>>,
    /// Cancelled when an output link failed in a way that may have ended
    /// the outputs' session.
    session_lost: CancellationToken,
    workers: Workers,
}

impl Dispatcher {
    async fn serve(mut self, mut inbox: mpsc::Receiver<Box<Request>>, close: CancellationToken) {
        while let Some(request) = next_until_closed(&mut inbox, &close).await {
            if self.workers.failure.happened.is_cancelled() {
                let _ = request.done.send(Err(PublishFailure::links_down()));
                continue;
            }
            let worker = if request.output {
                match self.output_worker(&request.address, request.deadline).await {
                    Ok(worker) => worker,
                    Err(e) => {
                        let _ = request.done.send(Err(e));
                        continue;
                    }
                }
            } else if let Some(worker) = self.fixed_worker(&request.address) {
                worker
            } else {
                let _ = request.done.send(Err(PublishFailure::NotSent(
                    "no sender link is attached to this address".to_owned(),
                )));
                continue;
            };
            if let Err(mpsc::error::SendError(request)) = worker.send(request) {
                // The worker's link failed since: answer, and attach anew
                // for the next one.
                self.output_workers.remove(&request.address);
                let _ = request.done.send(Err(PublishFailure::links_down()));
            }
        }
        // Every worker answers what it holds, then detaches its link; an
        // idle sender gets a task only to detach.
        self.fixed.clear();
        for (address, sender) in self.idle.drain() {
            drop(self.workers.start(address, sender, None));
        }
        self.output_workers.drain().for_each(drop);
        self.workers.finish().await;
    }

    /// The task publishing to `address`, one of those attached up front,
    /// started now if it was idle.
    fn fixed_worker(&mut self, address: &str) -> Option<mpsc::UnboundedSender<Box<Request>>> {
        if let Some((address, sender)) = self.idle.remove_entry(address) {
            let worker = self.workers.start(address.clone(), sender, None);
            self.fixed.insert(address, worker);
        }
        self.fixed.get(address).cloned()
    }

    /// The task publishing outputs to `address`, its sender attached now if
    /// there is none, within the request's deadline.
    async fn output_worker(
        &mut self,
        address: &str,
        deadline: Instant,
    ) -> Result<mpsc::UnboundedSender<Box<Request>>, PublishFailure> {
        if self.session_lost.is_cancelled() {
            self.output_workers.drain().for_each(drop);
            self.outputs.reset();
            self.session_lost = CancellationToken::new();
        }
        if let Some(worker) = self.output_workers.get(address)
            && !worker.is_closed()
        {
            return Ok(worker.clone());
        }
        self.output_workers.remove(address);
        // An evicted worker finishes what it holds, then detaches.
        drop(self.output_workers.evict_for_one(|_| false));
        let sender = match tokio::time::timeout_at(deadline, self.outputs.attach(address)).await {
            Ok(Ok(sender)) => sender,
            Ok(Err(e)) => {
                self.outputs.reset();
                return Err(e);
            }
            Err(_) => {
                self.outputs.reset();
                return Err(PublishFailure::NotSent(format!(
                    "no sender link was attached within {} (`publish_timeout`)",
                    humantime::format_duration(self.workers.publish_timeout)
                )));
            }
        };
        let worker =
            self.workers
                .start(address.to_owned(), sender, Some(self.session_lost.clone()));
        Ok(self
            .output_workers
            .insert(address.to_owned(), worker)
            .clone())
    }
}

/// The tasks publishing to one address each.
struct Workers {
    tasks: JoinSet<()>,
    publish_timeout: Duration,
    close_timeout: Duration,
    failure: Arc<Failure>,
}

impl Workers {
    /// Starts the task publishing to `address` with `sender`. An output
    /// link that fails cancels `session_lost`; any other takes the mount's
    /// links down.
    fn start(
        &mut self,
        address: String,
        sender: Sender,
        session_lost: Option<CancellationToken>,
    ) -> mpsc::UnboundedSender<Box<Request>> {
        let (requests, inbox) = mpsc::unbounded_channel();
        let worker = Worker {
            address,
            sender,
            publish_timeout: self.publish_timeout,
            close_timeout: self.close_timeout,
            failure: self.failure.clone(),
            session_lost,
        };
        self.tasks.spawn(worker.serve(inbox));
        requests
    }

    async fn finish(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

struct Worker {
    address: String,
    sender: Sender,
    publish_timeout: Duration,
    close_timeout: Duration,
    failure: Arc<Failure>,
    session_lost: Option<CancellationToken>,
}

impl Worker {
    async fn serve(mut self, mut inbox: mpsc::UnboundedReceiver<Box<Request>>) {
        let mut waiting = JoinSet::new();
        while let Some(request) = inbox.recv().await {
            let Request {
                payload,
                deadline,
                done,
                ..
            } = *request;
            let sent =
                tokio::time::timeout_at(deadline, self.sender.send_payload_batchable(payload))
                    .await;
            let outcome = match sent {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(e)) if e.recovery() != ErrorRecovery::UseLink => {
                    let _ = done.send(Err(PublishFailure::NotSent(format!(
                        "the sender link failed: {e}"
                    ))));
                    self.link_failed(e);
                    break;
                }
                Ok(Err(e)) => {
                    let _ = done.send(Err(PublishFailure::Refused(format!(
                        "did not take it: {e}"
                    ))));
                    continue;
                }
                Err(_) => {
                    let _ = done.send(Err(PublishFailure::no_credit(self.publish_timeout)));
                    continue;
                }
            };
            // Pipeline: the transfer is on the link; wait for the answer
            // beside the loop.
            let timeout = self.publish_timeout;
            waiting.spawn(async move {
                let result = match tokio::time::timeout_at(deadline, outcome).await {
                    Ok(Ok(Outcome::Accepted(_))) => Ok(()),
                    Ok(Ok(other)) => Err(PublishFailure::outcome(&other)),
                    Ok(Err(e)) => Err(PublishFailure::Unknown(format!(
                        "the link failed before the broker answered: {e}"
                    ))),
                    Err(_) => Err(PublishFailure::no_answer(timeout)),
                };
                let _ = done.send(result);
            });
            while waiting.try_join_next().is_some() {}
        }
        // After a link failure, what is still queued was never sent.
        inbox.close();
        while let Some(request) = inbox.recv().await {
            let _ = request.done.send(Err(PublishFailure::links_down()));
        }
        while waiting.join_next().await.is_some() {}
        let _ = tokio::time::timeout(self.close_timeout, self.sender.close()).await;
    }

    fn link_failed(&self, source: fe2o3_amqp::link::SendError) {
        match &self.session_lost {
            // An output's session is the outputs' own: begin it again.
            Some(lost) => lost.cancel(),
            None => self.failure.record(BrokerError::Sender {
                address: self.address.clone(),
                source,
            }),
        }
    }
}
