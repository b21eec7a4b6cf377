//! Outputs committed with the inputs they answer: a handler's outputs are
//! posted and its input accepted in one AMQP local transaction, so the
//! broker keeps all of it or none, whatever fails when.
//!
//! The deliveries waiting when a transaction starts share it: one declare
//! and one commit carry a whole batch. A batch with an output the broker
//! refuses (or blocks past the publish time-out) is rolled back and tried
//! again one delivery at a time, so one refused output costs no other
//! delivery an attempt.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp::ReceiverDisposer;
use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::transaction::{
    Controller, PostError, Transaction, TransactionBase, TransactionDischarge,
};
use fe2o3_amqp::types::messaging::Outcome;
use fe2o3_amqp::types::transaction::TransactionId;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::collections::HashSet;

use fe2o3_amqp::Sender;

use super::BrokerPool;
use super::error::{AttachFailure, BrokerError, PublishFailure};
use super::outputs::{
    CLOSE_OUTPUT_SENDER, Failure, MAX_OUTPUT_SENDERS, OutputSession, OutputsOn, SenderCache,
    close_sender, next_until_closed,
};

/// The most deliveries committed in one transaction.
const MAX_BATCH: usize = 256;

/// An output, encoded, and the address it goes to.
pub struct Output {
    /// The address.
    pub address: String,
    /// The encoded message.
    pub payload: Bytes,
}

struct Work {
    input: DeliveryInfo,
    outputs: Vec<Output>,
    done: oneshot::Sender<Result<(), BrokerError>>,
}

/// A handle to commit outputs with their inputs. Clones share the
/// transaction link.
#[derive(Clone)]
pub struct Transactions {
    requests: mpsc::Sender<Work>,
}

impl Transactions {
    /// Publishes `outputs` and accepts `input` in one transaction, and waits
    /// until it is committed. On an error nothing of it happened, unless the
    /// links went down (then the broker rolls back what was not committed).
    pub async fn commit(
        &self,
        input: DeliveryInfo,
        outputs: Vec<Output>,
    ) -> Result<(), BrokerError> {
        let (done, answer) = oneshot::channel();
        let gone = || BrokerError::Transaction {
            stage: "queueing",
            reason: "the mount's links went down".to_owned(),
        };
        let work = Work {
            input,
            outputs,
            done,
        };
        self.requests.send(work).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// What a mount needs to commit in transactions.
pub struct TransactionsOn<'a> {
    /// The broker.
    pub pool: BrokerPool,
    /// The connection the mount's receiver is on: outputs must go out on
    /// it too.
    pub connection: u64,
    /// Settles the receiver's deliveries.
    pub disposer: ReceiverDisposer,
    /// The terminus capability of output senders, if any.
    pub capability: Option<&'static str>,
    /// The mount's link name, to name the links after.
    pub link_prefix: &'a str,
    /// How long each step may take.
    pub publish_timeout: Duration,
}

impl Transactions {
    /// Attaches a transaction controller on `session`, the receiver's, and
    /// begins a session for outputs on the same connection. Fails when the
    /// broker has no coordinator.
    ///
    /// The controller shares the receiver's session so that an input's
    /// transactional acceptance reaches the broker before the commit: a
    /// session sends its frames in order, two sessions may not.
    pub(super) async fn attach(
        on: TransactionsOn<'_>,
        session: &mut SessionHandle<()>,
        failure: Arc<Failure>,
        close: CancellationToken,
    ) -> Result<(Transactions, tokio::task::JoinHandle<()>), BrokerError> {
        let name = format!("{}/txn", on.link_prefix);
        let controller =
            Controller::attach(session, name)
                .await
                .map_err(|e| BrokerError::Attach {
                    address: "the transaction coordinator".to_owned(),
                    role: "controller",
                    source: AttachFailure::Sender(e),
                })?;
        // Transactions belong to a connection: work posted in one must go
        // out on it.
        let outputs_session =
            on.pool
                .session_on(on.connection)
                .await
                .map_err(|e| BrokerError::Transaction {
                    stage: "beginning its session",
                    reason: e.to_string(),
                });
        let outputs_session = match outputs_session {
            Ok(outputs_session) => outputs_session,
            Err(e) => {
                let _ = tokio::time::timeout(on.publish_timeout, controller.close()).await;
                return Err(e);
            }
        };
        let outputs = OutputSession::new(
            OutputsOn {
                pool: on.pool,
                capability: on.capability,
            },
            format!("{}/out", on.link_prefix),
            Some(outputs_session),
        );
        let (requests, inbox) = mpsc::channel(MAX_BATCH);
        let committer = Committer {
            controller,
            outputs,
            senders: SenderCache::new(),
            disposer: on.disposer,
            timeout: on.publish_timeout,
            failure,
        };
        let task = tokio::spawn(committer.serve(inbox, close));
        Ok((Transactions { requests }, task))
    }
}

struct Committer {
    controller: Controller,
    outputs: OutputSession,
    senders: SenderCache<Sender>,
    disposer: ReceiverDisposer,
    timeout: Duration,
    failure: Arc<Failure>,
}

/// Why a transaction did not commit.
enum Failed {
    /// The broker refused an output, or gave no credit or answer for one in
    /// time (it blocks producers to a full address): the transaction is
    /// rolled back and the links are fine. Deliveries on their own may yet
    /// commit.
    Refused(BrokerError),
    /// The links cannot be trusted any more; the mount must attach again.
    Links(BrokerError),
}

impl Committer {
    async fn serve(mut self, mut inbox: mpsc::Receiver<Work>, close: CancellationToken) {
        loop {
            // Once closed, what was already queued is still committed.
            let Some(first) = next_until_closed(&mut inbox, &close).await else {
                break;
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH
                && let Ok(work) = inbox.try_recv()
            {
                batch.push(work);
            }
            // A transaction's senders must all stay attached until it ends.
            for batch in by_addresses(batch, MAX_OUTPUT_SENDERS) {
                tracing::trace!(deliveries = batch.len(), "committing");
                self.commit_batch(batch).await;
            }
        }
        let _ = tokio::time::timeout(self.timeout, self.controller.close()).await;
        for (_, sender) in self.senders.drain() {
            close_sender(sender, self.timeout, false).await;
        }
    }

    async fn commit_batch(&mut self, batch: Vec<Work>) {
        if self.failure.happened.is_cancelled() {
            return answer_all(batch, || Err(links_down()));
        }
        // Senders first, outside any transaction: a delivery whose output
        // address the broker refuses fails alone.
        let keep: HashSet<String> = batch
            .iter()
            .flat_map(|work| work.outputs.iter().map(|o| o.address.clone()))
            .collect();
        let mut ready = Vec::with_capacity(batch.len());
        for work in batch {
            match self.attach_senders(&work, &keep).await {
                Ok(()) => ready.push(work),
                Err(e) => {
                    let _ = work.done.send(Err(e));
                }
            }
        }
        match ready.len() {
            0 => return,
            1 => return self.commit_alone(ready.remove(0)).await,
            _ => {}
        }
        match self.transact(&ready).await {
            Ok(()) => answer_all(ready, || Ok(())),
            Err(Failed::Refused(error)) => {
                tracing::debug!(
                    deliveries = ready.len(),
                    %error,
                    "transaction rolled back; committing its deliveries one at a time"
                );
                for work in ready {
                    self.commit_alone(work).await;
                }
            }
            Err(Failed::Links(error)) => self.links_failed(error, ready),
        }
    }

    async fn commit_alone(&mut self, work: Work) {
        if self.failure.happened.is_cancelled() {
            let _ = work.done.send(Err(links_down()));
            return;
        }
        match self.transact(std::slice::from_ref(&work)).await {
            Ok(()) => {
                let _ = work.done.send(Ok(()));
            }
            Err(Failed::Refused(error)) => {
                let _ = work.done.send(Err(error));
            }
            Err(Failed::Links(error)) => self.links_failed(error, vec![work]),
        }
    }

    /// The mount's links must come down: the broker rolls back whatever
    /// was not committed.
    fn links_failed(&self, error: BrokerError, batch: Vec<Work>) {
        let reason = error.to_string();
        self.failure.record(error);
        answer_all(batch, || {
            Err(BrokerError::Transaction {
                stage: "committing",
                reason: reason.clone(),
            })
        });
    }

    /// Attaches a sender for each output address of `work` that has none,
    /// each within the time-out, making room by detaching senders no
    /// delivery of this batch (`keep`) uses.
    async fn attach_senders(
        &mut self,
        work: &Work,
        keep: &HashSet<String>,
    ) -> Result<(), BrokerError> {
        for output in &work.outputs {
            if self.senders.contains(&output.address) {
                continue;
            }
            if let Some(evicted) = self.senders.evict_for_one(|a| keep.contains(a)) {
                close_sender(evicted, CLOSE_OUTPUT_SENDER, true).await;
            }
            let attached =
                tokio::time::timeout(self.timeout, self.outputs.attach(&output.address)).await;
            let failure = match attached {
                Ok(Ok(sender)) => {
                    self.senders.insert(output.address.clone(), sender);
                    continue;
                }
                Ok(Err(e)) => e,
                Err(_) => PublishFailure::NotSent(format!(
                    "no sender link was attached within {} (`publish_timeout`)",
                    humantime::format_duration(self.timeout)
                )),
            };
            return Err(output_error(&output.address, failure));
        }
        Ok(())
    }

    /// One transaction: declare, post every output and wait for the broker
    /// to take each, accept every input, commit.
    async fn transact(&mut self, batch: &[Work]) -> Result<(), Failed> {
        let Committer {
            controller,
            senders,
            disposer,
            timeout,
            ..
        } = self;
        let timeout = *timeout;
        let txn = step(timeout, "declaring", Transaction::declare(controller, None)).await?;
        let txn_id = txn.txn_id().clone();
        if let Err(failed) = post_all(senders, batch, &txn_id, timeout).await {
            // A refusal leaves the links fine: undo the transaction's
            // work and go on. Otherwise the links go, and with them the
            // transaction.
            if let Failed::Refused(error) = failed {
                step(timeout, "rolling back", txn.rollback()).await?;
                return Err(Failed::Refused(rolled_back(error)));
            }
            return Err(failed);
        }
        for work in batch {
            step(
                timeout,
                "accepting an input",
                disposer.accept_in_transaction(work.input.clone(), txn_id.clone()),
            )
            .await?;
        }
        step(timeout, "committing", txn.commit()).await
    }
}

/// `batch` in order, cut wherever the next delivery would bring the
/// output addresses of its part past `max`. A delivery with more addresses
/// than that on its own stays whole (the broker may still take it).
fn by_addresses(batch: Vec<Work>, max: usize) -> Vec<Vec<Work>> {
    let mut parts: Vec<Vec<Work>> = Vec::new();
    let mut addresses: HashSet<String> = HashSet::new();
    for work in batch {
        let mut with = addresses.clone();
        with.extend(work.outputs.iter().map(|o| o.address.clone()));
        match parts.last_mut() {
            Some(part) if with.len() <= max => {
                part.push(work);
                addresses = with;
            }
            _ => {
                addresses = work.outputs.iter().map(|o| o.address.clone()).collect();
                parts.push(vec![work]);
            }
        }
    }
    parts
}

/// A refused transaction was rolled back: whatever went out, the broker
/// holds none of it now.
fn rolled_back(error: BrokerError) -> BrokerError {
    match error {
        BrokerError::Publish {
            address,
            source: PublishFailure::Unknown(reason),
        } => BrokerError::Publish {
            address,
            source: PublishFailure::NotSent(format!("{reason}; the transaction was rolled back")),
        },
        other => other,
    }
}

/// Posts every output of `batch` in the transaction `txn_id`, then waits
/// for the broker to take each, all within `timeout`.
async fn post_all(
    senders: &mut SenderCache<Sender>,
    batch: &[Work],
    txn_id: &TransactionId,
    timeout: Duration,
) -> Result<(), Failed> {
    let deadline = Instant::now() + timeout;
    let mut posted = Vec::new();
    for output in batch.iter().flat_map(|work| &work.outputs) {
        let failed = |source| output_error(&output.address, source);
        let Some(sender) = senders.get(&output.address) else {
            return Err(Failed::Refused(failed(PublishFailure::NotSent(
                "its sender link was detached".to_owned(),
            ))));
        };
        let sent = tokio::time::timeout_at(
            deadline,
            sender.post_payload_batchable(output.payload.clone(), txn_id.clone()),
        )
        .await;
        match sent {
            Ok(Ok(outcome)) => posted.push((&output.address, outcome)),
            // Refused before it went out: the link is fine.
            Ok(Err(e @ PostError::MessageSizeExceeded(_))) => {
                return Err(Failed::Refused(failed(PublishFailure::Refused(format!(
                    "did not take it: {e}"
                )))));
            }
            Ok(Err(e)) => {
                return Err(Failed::Links(failed(PublishFailure::NotSent(format!(
                    "the sender link failed: {e}"
                )))));
            }
            Err(_) => return Err(Failed::Refused(failed(PublishFailure::no_credit(timeout)))),
        }
    }
    let answers =
        futures_util::future::join_all(posted.into_iter().map(|(address, outcome)| async move {
            let failed = |source| output_error(address, source);
            match tokio::time::timeout_at(deadline, outcome).await {
                Ok(Ok(Outcome::Accepted(_))) => Ok(()),
                Ok(Ok(other)) => Err(Failed::Refused(failed(PublishFailure::outcome(&other)))),
                Ok(Err(e)) => Err(Failed::Links(failed(PublishFailure::Unknown(format!(
                    "the link failed before the broker answered: {e}"
                ))))),
                Err(_) => Err(Failed::Refused(failed(PublishFailure::no_answer(timeout)))),
            }
        }))
        .await;
    answers
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(()), Err)
}

/// One step of a transaction, within `timeout`. A step that fails leaves
/// the transaction in a state only the broker knows: the links must go.
async fn step<T, E: std::fmt::Display>(
    timeout: Duration,
    stage: &'static str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, Failed> {
    let reason = match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(done)) => return Ok(done),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {timeout:?}"),
    };
    Err(Failed::Links(BrokerError::Transaction { stage, reason }))
}

fn output_error(address: &str, source: PublishFailure) -> BrokerError {
    BrokerError::Publish {
        address: address.to_owned(),
        source,
    }
}

fn links_down() -> BrokerError {
    BrokerError::Transaction {
        stage: "starting",
        reason: "the mount's links went down".to_owned(),
    }
}

fn answer_all(batch: Vec<Work>, result: impl Fn() -> Result<(), BrokerError>) {
    for work in batch {
        let _ = work.done.send(result());
    }
}
