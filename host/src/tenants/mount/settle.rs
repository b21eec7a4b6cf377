//! Carrying out a plan on the link: dispositions, dead letters and copies,
//! in the order the plan gives. The rules themselves live in `settlement`.

use std::time::{Duration, SystemTime};

use fe2o3_amqp::link::delivery::DeliveryInfo;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::attach::MountContext;
use crate::admin::MountMetrics;
use crate::broker::message::AmqpMessage;
use crate::broker::{Output, Transactions};
use crate::events::Event;
use crate::sandbox::Outgoing;
use crate::settlement::{DelayPath, Disposition, Plan, Publish};

/// A disposition a delivery task asks the receive loop to send; only the
/// loop owns the receiver.
pub(super) struct SettleRequest {
    pub(super) info: DeliveryInfo,
    pub(super) disposition: Disposition,
    pub(super) done: oneshot::Sender<Result<(), String>>,
}

/// Sends dispositions through the receive loop.
#[derive(Clone)]
pub(super) struct Settler(mpsc::UnboundedSender<SettleRequest>);

impl Settler {
    pub(super) fn new(requests: mpsc::UnboundedSender<SettleRequest>) -> Settler {
        Settler(requests)
    }

    async fn settle(&self, info: DeliveryInfo, disposition: Disposition) -> Result<(), String> {
        let (done, answer) = oneshot::channel();
        let request = SettleRequest {
            info,
            disposition,
            done,
        };
        let stopped = || "the mount stopped before the disposition was sent".to_owned();
        self.0.send(request).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// How a plan went: the disposition sent (if any) and the first thing that
/// went wrong.
pub(super) struct Settled {
    pub(super) disposition: Option<Disposition>,
    pub(super) error: Option<String>,
}

/// Carries out `plan` for the delivery `info` of `message`. `flush`, once
/// cancelled (the mount is stopping), ends the wait of a held copy and of
/// the pause after a failed publish.
pub(super) async fn carry_out(
    context: &MountContext,
    settler: &Settler,
    info: DeliveryInfo,
    message: &AmqpMessage,
    plan: Plan,
    outputs: &[Outgoing],
    flush: &CancellationToken,
) -> Settled {
    let settle = async |disposition| match settler.settle(info.clone(), disposition).await {
        Ok(()) => Settled {
            disposition: Some(disposition),
            error: None,
        },
        Err(error) => Settled {
            disposition: None,
            error: Some(error),
        },
    };
    match plan {
        Plan::Settle(disposition) => settle(disposition).await,
        Plan::PublishThenSettle {
            publish,
            then,
            otherwise,
        } => {
            let published = match (publish, context.publisher.transactions()) {
                // The acceptance is part of the transaction.
                (Publish::Outputs, Some(transactions)) => {
                    commit_outputs(context, transactions, info.clone(), message, outputs)
                        .await
                        .map(|()| Committed::WithAcceptance)
                }
                _ => publish_one(context, message, publish, outputs, flush)
                    .await
                    .map(|()| Committed::Alone),
            };
            match published {
                Ok(committed) => {
                    context.spec.publish_backoff_reset();
                    match committed {
                        Committed::WithAcceptance => Settled {
                            disposition: Some(then),
                            error: None,
                        },
                        Committed::Alone => settle(then).await,
                    }
                }
                Err(error) => {
                    // Handing the delivery back at once would bring it straight
                    // back to a publish that fails: pause first.
                    let pause = context.spec.publish_backoff_next();
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = flush.cancelled() => {}
                    }
                    let mut settled = settle(otherwise).await;
                    settled.error = Some(error);
                    settled
                }
            }
        }
        Plan::Presettled { publish, .. } => {
            let error = match publish {
                Some(publish) => publish_one(context, message, publish, outputs, flush)
                    .await
                    .err(),
                None => None,
            };
            Settled {
                disposition: None,
                error,
            }
        }
    }
}

/// Publishes what the plan owes and waits for the broker to accept it. A
/// held copy first waits out its delay (or until the mount stops).
async fn publish_one(
    context: &MountContext,
    message: &AmqpMessage,
    publish: Publish,
    outputs: &[Outgoing],
    flush: &CancellationToken,
) -> Result<(), String> {
    let spec = &context.spec;
    match publish {
        Publish::Outputs => publish_outputs(context, message, outputs).await,
        Publish::DeadLetter => {
            let address = spec
                .config
                .dead_letter
                .as_deref()
                .expect("plans only dead-letter when the mount declares an address");
            let published = publish_message(context, address, message).await;
            if published.is_ok() {
                spec.metrics.dead_lettered();
            }
            published
        }
        Publish::Copy {
            retry_count,
            delay,
            path,
        } => {
            let due = match path {
                DelayPath::Scheduled if !delay.is_zero() => Some(SystemTime::now() + delay),
                DelayPath::Scheduled => None,
                DelayPath::Held => {
                    wait_held(context, delay, flush).await;
                    None
                }
            };
            let copy = message.copy(retry_count, due);
            let published = publish_message(context, &spec.config.address, &copy).await;
            spec.metrics.copy_published(published.is_ok());
            let _ = spec.events.send(Event::CopyPublished {
                tenant: spec.tags.tenant.clone(),
                mount: spec.tags.mount.clone(),
                message_id: copy.message_id(),
                retry_count,
                error: published.as_ref().err().cloned(),
            });
            published
        }
    }
}

/// Whether the input was accepted with what was published.
enum Committed {
    /// In the same transaction.
    WithAcceptance,
    /// No: the input is settled next.
    Alone,
}

/// The outputs of the handler of `input`, encoded, each with its
/// deterministic message-id.
fn encode_outputs(
    context: &MountContext,
    input: &AmqpMessage,
    outputs: &[Outgoing],
) -> Result<Vec<Output>, String> {
    let input_id = input.message_id().unwrap_or_else(|| input.body_digest());
    outputs
        .iter()
        .enumerate()
        .map(|(index, output)| {
            let message =
                AmqpMessage::output(&output.message, &input_id, index, context.duplicate_ids);
            Ok(Output {
                address: output.address.clone(),
                payload: message.encode().map_err(|e| e.to_string())?,
            })
        })
        .collect()
}

/// Posts every output of the handler of `input` and accepts `input` in one
/// transaction, and waits until it is committed.
async fn commit_outputs(
    context: &MountContext,
    transactions: &Transactions,
    info: DeliveryInfo,
    input: &AmqpMessage,
    outputs: &[Outgoing],
) -> Result<(), String> {
    let encoded = encode_outputs(context, input, outputs)?;
    let committed = transactions.commit(info, encoded).await;
    let (published, failed) = match committed {
        Ok(()) => (outputs.len(), 0),
        Err(_) => (0, outputs.len()),
    };
    context.spec.metrics.outputs_published(published, failed);
    committed.map_err(|e| e.to_string())
}

/// Publishes every output of the handler of `input` at once, and waits
/// until the broker has accepted them all.
async fn publish_outputs(
    context: &MountContext,
    input: &AmqpMessage,
    outputs: &[Outgoing],
) -> Result<(), String> {
    let encoded = encode_outputs(context, input, outputs)?;
    let published = futures_util::future::join_all(encoded.into_iter().map(|output| async move {
        context
            .publisher
            .publish_output(&output.address, output.payload)
            .await
            .map_err(|e| e.to_string())
    }))
    .await;
    let failed = published.iter().filter(|p| p.is_err()).count();
    context
        .spec
        .metrics
        .outputs_published(outputs.len() - failed, failed);
    match published.into_iter().find_map(Result::err) {
        None => Ok(()),
        Some(error) if failed == 1 => Err(error),
        Some(error) => Err(format!("{error} (and {} more outputs)", failed - 1)),
    }
}

async fn publish_message(
    context: &MountContext,
    address: &str,
    message: &AmqpMessage,
) -> Result<(), String> {
    let encoded = message.encode().map_err(|e| e.to_string())?;
    context
        .publisher
        .publish(address, encoded)
        .await
        .map_err(|e| e.to_string())
}

/// The delay of a copy held by the host, the original unsettled meanwhile.
async fn wait_held(context: &MountContext, delay: Duration, flush: &CancellationToken) {
    if delay.is_zero() {
        return;
    }
    let _pending = PendingCopy::new(&context.spec.metrics);
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        () = flush.cancelled() => {
            let tags = &context.spec.tags;
            tracing::debug!(tenant = &*tags.tenant, mount = &*tags.mount, "publishing a held copy early: the mount is stopping");
        }
    }
}

/// Counts a held copy in `wharf_copies_pending` for as long as it lives,
/// however its wait ends.
struct PendingCopy<'a>(&'a MountMetrics);

impl<'a> PendingCopy<'a> {
    fn new(metrics: &'a MountMetrics) -> PendingCopy<'a> {
        metrics.copies_pending(1);
        PendingCopy(metrics)
    }
}

impl Drop for PendingCopy<'_> {
    fn drop(&mut self) {
        self.0.copies_pending(-1);
    }
}
