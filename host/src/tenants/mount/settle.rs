//! Carrying out a plan on the link: dispositions, dead letters, copies and
//! outputs, in the order the plan gives. What a publish's answer means for
//! the delivery is `settlement::after_publish`; this file only does it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fe2o3_amqp::link::delivery::DeliveryInfo;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::context::MountContext;
use super::report;
use crate::admin::MountMetrics;
use crate::broker::{BrokerError, Output, PublishFailure, Transactions};
use crate::events::Event;
use crate::sandbox::Outgoing;
use crate::telemetry::{Kind, Span};
use wharf_core::address::MAX_ADDRESS_BYTES;
use wharf_core::message::CopyOf;
use wharf_core::message::{self, AmqpMessage};
use wharf_core::settlement::{
    self, AfterPublish, Counters, DelayPath, Disposition, Plan, Publish, Published, Unhandled,
};
use wharf_core::text::{self, shown};
use wharf_core::trace::TraceContext;

/// The message annotation a dead letter carries when the host knows more
/// of why it ends there than "no more attempts": outputs the broker would
/// not take, or a message the host could not read.
pub(crate) const DEAD_LETTER_REASON: &str = "x-opt-wharf-dead-letter-reason";

/// A disposition a delivery task asks the receive loop to send; only the
/// loop owns the receiver.
pub(super) struct SettleRequest {
    pub(super) info: DeliveryInfo,
    pub(super) disposition: Disposition,
    /// Why no handler read it, for a delivery the host refused.
    pub(super) unread: Option<(Unhandled, String)>,
    pub(super) done: oneshot::Sender<Result<(), NotSettled>>,
}

/// Why a disposition was not sent.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum NotSettled {
    /// The receive loop ended first.
    #[error("the mount stopped before the disposition was sent")]
    Stopped,
    /// The link refused it.
    #[error("{0}")]
    Link(Arc<BrokerError>),
}

/// Sends dispositions through the receive loop.
#[derive(Clone)]
pub(super) struct Settler(mpsc::UnboundedSender<SettleRequest>);

impl Settler {
    pub(super) fn new(requests: mpsc::UnboundedSender<SettleRequest>) -> Settler {
        Settler(requests)
    }

    async fn settle(
        &self,
        info: DeliveryInfo,
        disposition: Disposition,
        unread: Option<(Unhandled, String)>,
    ) -> Result<(), NotSettled> {
        let (done, answer) = oneshot::channel();
        let request = SettleRequest {
            info,
            disposition,
            unread,
            done,
        };
        self.0.send(request).map_err(|_| NotSettled::Stopped)?;
        answer.await.map_err(|_| NotSettled::Stopped)?
    }
}

/// A delivery as it arrived, for everything its plan may publish.
pub(super) struct Arrived<'a> {
    /// What settling it needs.
    pub(super) info: DeliveryInfo,
    /// The message, decoded; none when it could not be.
    pub(super) message: Option<&'a AmqpMessage>,
    /// The message as it arrived: dead letters go exactly so, copies are
    /// made from it.
    pub(super) payload: &'a Bytes,
    /// Its counters, for a plan made again.
    pub(super) counters: Counters,
    /// The trace context of its handling, when its publisher sent one:
    /// what the host publishes because of it carries a child of it.
    pub(super) trace: Option<&'a TraceContext>,
    /// Why no handler saw it, when none did: its dead letter and its
    /// `rejected` say so.
    pub(super) unread: Option<(Unhandled, &'a str)>,
}

/// How a delivery's plan went.
#[derive(Default)]
pub(super) struct Settled {
    /// The disposition sent, if any.
    pub(super) disposition: Option<Disposition>,
    /// The plan carried out instead of the one asked for: the handler's
    /// `ack` could not stand because its outputs were not delivered.
    pub(super) instead: Option<Plan>,
    /// The first thing that went wrong.
    pub(super) error: Option<String>,
}

/// Carries out `plan` for `arrived`, and the plan the planner gives
/// instead when it cannot stand. `flush`, once cancelled (the mount is
/// stopping), ends the wait of a held copy and of the pause after a failed
/// publish.
pub(super) async fn carry_out(
    context: &MountContext,
    settler: &Settler,
    arrived: &Arrived<'_>,
    plan: Plan,
    outputs: &[Outgoing],
    flush: &CancellationToken,
) -> Settled {
    let mut plan = plan;
    let mut reason = arrived.unread.map(|(_, reason)| reason.to_owned());
    let mut instead = None;
    let mut errors = Vec::new();
    let carrier = Carrier {
        context,
        settler,
        arrived,
        flush,
    };
    loop {
        // Outputs go out with the first plan only: no plan made instead
        // publishes any.
        let outputs = if instead.is_none() { outputs } else { &[] };
        match carry_out_plan(&carrier, plan, outputs, reason.as_deref()).await {
            Step::Done { disposition, error } => {
                errors.extend(error);
                return Settled {
                    disposition,
                    instead,
                    error: (!errors.is_empty()).then(|| errors.join("; then ")),
                };
            }
            Step::Instead {
                plan: next,
                reason: why,
            } => {
                report::replaced(context, plan, &why);
                errors.push(why.clone());
                (plan, reason, instead) = (next, Some(why), Some(next));
            }
        }
    }
}

/// How one plan went.
enum Step {
    /// Settled with this disposition (none at most once, or when it could
    /// not be sent), and the first thing that went wrong.
    Done {
        disposition: Option<Disposition>,
        error: Option<String>,
    },
    /// The planner replaced the plan, for this reason.
    Instead { plan: Plan, reason: String },
}

/// What carrying out a delivery's plans takes.
#[derive(Clone, Copy)]
struct Carrier<'a> {
    context: &'a MountContext,
    settler: &'a Settler,
    arrived: &'a Arrived<'a>,
    /// Cancelled once the mount is stopping.
    flush: &'a CancellationToken,
}

async fn carry_out_plan(
    carrier: &Carrier<'_>,
    plan: Plan,
    outputs: &[Outgoing],
    reason: Option<&str>,
) -> Step {
    let Carrier {
        context,
        settler,
        arrived,
        flush,
    } = *carrier;
    let settle = async |disposition, error| {
        send_disposition(context, settler, arrived, disposition, error).await
    };
    let Some(publish) = plan.publish() else {
        let disposition = match plan {
            Plan::Settle(disposition) => Some(disposition),
            _ => None,
        };
        return settle(disposition, None).await;
    };
    let committed_with_acceptance =
        publish == Publish::Outputs && context.publisher.transactions().is_some();
    let published = match (publish, context.publisher.transactions()) {
        (Publish::Outputs, Some(transactions)) => {
            commit_outputs(context, transactions, arrived, outputs).await
        }
        _ => publish_one(carrier, publish, outputs, reason).await,
    };
    let error = published.failure().map(str::to_owned);
    let policy = context.policy();
    match settlement::after_publish(&policy, &arrived.counters, &plan, &published) {
        AfterPublish::Instead { plan, reason } => Step::Instead { plan, reason },
        AfterPublish::Settle(disposition) if published == Published::Accepted => {
            context.spec.publish_backoff_reset();
            if committed_with_acceptance {
                // The acceptance was part of the transaction.
                return Step::Done {
                    disposition,
                    error: None,
                };
            }
            settle(disposition, None).await
        }
        AfterPublish::Settle(disposition) => {
            // Handing the delivery back at once would bring it straight
            // back to a publish that fails: pause first.
            if disposition.is_some() {
                let pause = context.spec.publish_backoff_next();
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = flush.cancelled() => {}
                }
            }
            settle(disposition, error).await
        }
    }
}

/// Sends `disposition` (none: nothing to send), in a span of its own;
/// `error` is what went wrong before.
async fn send_disposition(
    context: &MountContext,
    settler: &Settler,
    arrived: &Arrived<'_>,
    disposition: Option<Disposition>,
    error: Option<String>,
) -> Step {
    let Some(disposition) = disposition else {
        return Step::Done {
            disposition: None,
            error,
        };
    };
    let (_, mut span) = context.spec.telemetry.child(
        arrived.trace,
        format_args!("settle {}", context.spec.config.address),
        Kind::Client,
    );
    if let Some(span) = &mut span {
        context.peer.describe(span);
        span.set("messaging.operation.type", "settle");
        span.set("messaging.operation.name", disposition.as_str());
        span.set(
            "messaging.destination.name",
            context.spec.config.address.clone(),
        );
    }
    let unread = arrived
        .unread
        .map(|(unhandled, reason)| (unhandled, reason.to_owned()));
    let sent = settler
        .settle(arrived.info.clone(), disposition, unread)
        .await;
    if let (Some(span), Err(error)) = (&mut span, &sent) {
        span.fail("settle", error.to_string());
    }
    Step::Done {
        disposition: sent.is_ok().then_some(disposition),
        error: error.or(sent.err().map(|e| e.to_string())),
    }
}

/// Publishes what the plan owes and waits for the broker's answer. A held
/// copy first waits out its delay (or until the mount stops).
async fn publish_one(
    carrier: &Carrier<'_>,
    publish: Publish,
    outputs: &[Outgoing],
    reason: Option<&str>,
) -> Published {
    let Carrier {
        context,
        arrived,
        flush,
        ..
    } = *carrier;
    match publish {
        Publish::Outputs => publish_outputs(context, arrived, outputs).await,
        Publish::DeadLetter => publish_dead_letter(context, arrived, reason).await,
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
            publish_copy(context, arrived, retry_count, delay, due).await
        }
    }
}

/// Publishes the delivery as it arrived, with `reason` when there is one,
/// to the mount's dead-letter address.
async fn publish_dead_letter(
    context: &MountContext,
    arrived: &Arrived<'_>,
    reason: Option<&str>,
) -> Published {
    let address = context
        .spec
        .config
        .dead_letter
        .as_deref()
        .expect("plans only dead-letter when the mount declares an address");
    let (trace, mut span) = send_span(context, arrived.trace, address);
    crate::telemetry::set(&mut span, "wharf.dead_letter", true);
    let mut payload = with_reason(arrived.payload.clone(), reason);
    if let Some(trace) = &trace {
        payload = wharf_core::trace::carried_on_payload(&payload, trace).unwrap_or(payload);
    }
    let published = published(context.publisher.publish(address, payload).await);
    sent(span, &published);
    if published == Published::Accepted {
        context.spec.metrics.dead_lettered();
    }
    published
}

/// Publishes a copy of the delivery, counted `retry_count`, due at `due`
/// (scheduled on the broker) or now.
async fn publish_copy(
    context: &MountContext,
    arrived: &Arrived<'_>,
    retry_count: u32,
    delay: Duration,
    due: Option<SystemTime>,
) -> Published {
    let spec = &context.spec;
    let (trace, mut span) = send_span(context, arrived.trace, &spec.config.address);
    let message_id = arrived.message.and_then(AmqpMessage::message_id);
    if let Some(span) = &mut span {
        span.set("wharf.retry_count", i64::from(retry_count));
        span.set("wharf.delay_ms", delay.as_millis() as i64);
        if let Some(id) = &message_id {
            span.set("messaging.message.id", shown(id).to_string());
        }
    }
    let copy = CopyOf {
        retry_count,
        due,
        trace: trace.as_ref(),
        seal: spec.retry_key.as_ref(),
    };
    let made = match arrived.message {
        Some(message) => message::copy_payload(arrived.payload, message, copy),
        None => Err(message::DecodeFailure::new(
            "no message was read to copy".to_owned(),
        )),
    };
    let published = match made {
        Ok(payload) => published(
            context
                .publisher
                .publish(&spec.config.address, payload)
                .await,
        ),
        Err(e) => not_encoded(&e),
    };
    sent(span, &published);
    spec.metrics
        .copy_published(published == Published::Accepted);
    let _ = spec.events.send(Event::CopyPublished {
        tenant: spec.tags.tenant.clone(),
        mount: spec.tags.mount.clone(),
        message_id,
        retry_count,
        error: published.failure().map(str::to_owned),
    });
    published
}

/// A dead letter's payload, with the reason among its annotations when
/// there is one to give (and the payload's sections can be found), cut to
/// [`text::DESCRIPTION_BYTES`].
fn with_reason(payload: Bytes, reason: Option<&str>) -> Bytes {
    match reason {
        Some(reason) => {
            let reason = text::bounded(reason.to_owned(), text::DESCRIPTION_BYTES);
            message::annotate(&payload, DEAD_LETTER_REASON, &reason).unwrap_or(payload)
        }
        None => payload,
    }
}

/// What the host can know of a publish from the publisher's answer.
fn published(result: Result<(), BrokerError>) -> Published {
    let error = match result {
        Ok(()) => return Published::Accepted,
        Err(error) => error,
    };
    let reason = error.to_string();
    match error {
        BrokerError::Publish { source, .. } => match source {
            PublishFailure::Refused(_) => Published::Refused { reason },
            PublishFailure::NotSent(_) => Published::NotSent { reason },
            PublishFailure::Unknown(_) => Published::Unknown { reason },
        },
        // A transaction that failed as a whole: the broker rolls back what
        // it did not commit, but whether the commit landed is not known.
        _ => Published::Unknown { reason },
    }
}

fn not_encoded(error: &message::DecodeFailure) -> Published {
    Published::Unbuildable {
        reason: format!("cannot encode it: {error}"),
    }
}

/// The outputs of the handler of `input`, encoded, each with its
/// deterministic message-id, and the span of sending each.
fn encode_outputs(
    context: &MountContext,
    input: &Arrived<'_>,
    outputs: &[Outgoing],
) -> Result<(Vec<Output>, Vec<Option<Span>>), message::DecodeFailure> {
    // Only a handler has outputs, and only a message read reaches one.
    let input_id = input.message.map(AmqpMessage::identity).ok_or_else(|| {
        message::DecodeFailure::new("outputs for a message no handler read".to_owned())
    })?;
    let mut spans = Vec::with_capacity(outputs.len());
    let encoded = outputs
        .iter()
        .enumerate()
        .map(|(index, output)| {
            let mut message = output
                .message
                .to_amqp(&input_id, index, context.duplicate_ids);
            // The outbox let no longer address in; checked again where it
            // becomes wire text.
            let address = output
                .address
                .wire(MAX_ADDRESS_BYTES)
                .map_err(|e| message::DecodeFailure::new(format!("its address is {e}")))?;
            let (trace, mut span) = send_span(context, input.trace, address);
            if let Some(trace) = &trace {
                message.set_trace(trace);
            }
            if let (Some(span), Some(id)) = (&mut span, message.message_id()) {
                span.set("messaging.message.id", shown(&id).to_string());
            }
            spans.push(span);
            Ok(Output {
                address: address.to_owned(),
                payload: message.encode()?,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((encoded, spans))
}

/// The span of publishing to `address`, below `parent`, and the context
/// the message carries.
fn send_span(
    context: &MountContext,
    parent: Option<&TraceContext>,
    address: &str,
) -> (Option<TraceContext>, Option<Span>) {
    let (trace, mut span) = context.spec.telemetry.child(
        parent,
        format_args!("send {}", shown(address)),
        Kind::Producer,
    );
    if let Some(span) = &mut span {
        context.peer.describe(span);
        span.set("messaging.operation.type", "send");
        span.set("messaging.destination.name", shown(address).to_string());
    }
    (trace, span)
}

/// Ends a publish's span with what the broker answered.
fn sent(span: Option<Span>, published: &Published) {
    if let (Some(mut span), Some(failure)) = (span, published.failure()) {
        let kind = match published {
            Published::Refused { .. } => "refused",
            Published::NotSent { .. } => "not_sent",
            Published::Unbuildable { .. } => "unbuildable",
            _ => "unknown",
        };
        span.fail(kind, failure);
    }
}

/// Posts every output of the handler of `arrived` and accepts it in one
/// transaction, and waits until it is committed.
async fn commit_outputs(
    context: &MountContext,
    transactions: &Transactions,
    arrived: &Arrived<'_>,
    outputs: &[Outgoing],
) -> Published {
    let (encoded, spans) = match encode_outputs(context, arrived, outputs) {
        Ok(encoded) => encoded,
        Err(e) => return not_encoded(&e),
    };
    let committed = published(transactions.commit(arrived.info.clone(), encoded).await);
    for mut span in spans {
        crate::telemetry::set(&mut span, "wharf.transaction", true);
        sent(span, &committed);
    }
    let (sent, failed) = match committed {
        Published::Accepted => (outputs.len(), 0),
        _ => (0, outputs.len()),
    };
    context.spec.metrics.outputs_published(sent, failed);
    committed
}

/// Publishes every output of the handler of `input` at once, and waits
/// until the broker has answered each. The first that is not accepted
/// decides, the most definite first: a refusal, then one never sent, then
/// one whose fate is unknown.
async fn publish_outputs(
    context: &MountContext,
    input: &Arrived<'_>,
    outputs: &[Outgoing],
) -> Published {
    let (encoded, spans) = match encode_outputs(context, input, outputs) {
        Ok(encoded) => encoded,
        Err(e) => return not_encoded(&e),
    };
    let answers = futures_util::future::join_all(encoded.into_iter().zip(spans).map(
        |(output, span)| async move {
            let answer = published(
                context
                    .publisher
                    .publish_output(&output.address, output.payload)
                    .await,
            );
            sent(span, &answer);
            answer
        },
    ))
    .await;
    let failed = answers
        .iter()
        .filter(|p| **p != Published::Accepted)
        .count();
    context
        .spec
        .metrics
        .outputs_published(outputs.len() - failed, failed);
    let rank = |p: &Published| match p {
        Published::Unbuildable { .. } | Published::Refused { .. } => 0,
        Published::NotSent { .. } => 1,
        Published::Unknown { .. } => 2,
        Published::Accepted => 3,
    };
    answers
        .into_iter()
        .min_by_key(rank)
        .unwrap_or(Published::Accepted)
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
            tracing::debug!("publishing a held copy early: the mount is stopping");
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
