//! The receive loop of an attached mount: deliveries in, one task each,
//! dispositions out (only the loop owns the receiver). It ends when asked
//! to stop (then it drains) or when a link dies (then whatever is in flight
//! is left to the broker, which redelivers it).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp::link::delivery::DeliveryInfo;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use std::pin::Pin;

use super::MountSpec;
use super::attach::{AttachedMount, MountContext};
use super::deliver;
use super::settle::{self, SettleRequest, Settler};
use crate::broker::message;
use crate::broker::{BrokerError, Inbound, Received, Subscription};
use crate::config::Settle;
use crate::events::Event;
use crate::sandbox::LogTags;
use crate::settlement::Disposition;
use crate::tenants::budget::Room;

/// How often kept instances are checked for being idle too long.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// The part of the shutdown grace kept for detaching links, so a broker
/// that does not answer cannot stretch a stop past the grace period.
const DETACH_SHARE: u32 = 5;

impl AttachedMount {
    /// Runs the mount until `stop` is cancelled (then drains: in-flight
    /// handlers get the grace period to finish and be settled, delayed
    /// copies are published early) or until a link fails (returned).
    pub(crate) async fn run(self, stop: CancellationToken) -> Result<(), BrokerError> {
        let AttachedMount {
            context,
            mut subscription,
            mut publisher_task,
            session,
        } = self;
        let spec = context.spec.clone();
        let (requests, mut inbox) = mpsc::unbounded_channel();
        let settler = Settler::new(requests);
        let flush = CancellationToken::new();
        let mut tasks = JoinSet::new();
        // At most `concurrency` handlers run at once; each delivery then
        // waits for room in its tenant's budgets. While they wait the link's
        // credit is not renewed, so the broker holds back.
        let handlers = Arc::new(Semaphore::new(spec.config.concurrency as usize));
        let mut handler_slot = None;
        // A delivery is taken off the link only with a place among the
        // mount's unsettled ones (at most `credit`: a held `retry-after`
        // original keeps its place) and, once its size is known, room for
        // its bytes in the tenant's and the host's budgets.
        let unsettled = Arc::new(Semaphore::new(spec.credit() as usize));
        let mut unsettled_slot = None;
        let mut admitting: Option<Admitting> = None;
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        // Made once: a cancellation future registers itself when polled.
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        let failure = {
            let sender_failed = publisher_task.failed();
            tokio::pin!(sender_failed);
            loop {
                // The common case needs no wait: a handler slot is free.
                if handler_slot.is_none() {
                    handler_slot = handlers.clone().try_acquire_owned().ok();
                }
                if unsettled_slot.is_none() {
                    unsettled_slot = unsettled.clone().try_acquire_owned().ok();
                }
                tokio::select! {
                    biased;
                    Some(request) = inbox.recv() => answer(&subscription, request, &mut inbox).await,
                    Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                        report_panic(joined, &spec.tags);
                    }
                    () = &mut stopped => break None,
                    failed = &mut sender_failed => break Some(failed),
                    _ = prune.tick() => spec.module.current().prune_idle(),
                    permit = handlers.clone().acquire_owned(), if handler_slot.is_none() => {
                        handler_slot = permit.ok();
                    }
                    permit = unsettled.clone().acquire_owned(), if unsettled_slot.is_none() => {
                        unsettled_slot = permit.ok();
                    }
                    (inbound, room) = async { admitting.as_mut().expect("guarded").await }, if admitting.is_some() => {
                        admitting = None;
                        // Boxed: the task then moves a pointer, not the
                        // whole state of a delivery, as it starts and ends.
                        tasks.spawn(Box::pin(deliver::handle(
                            context.clone(),
                            settler.clone(),
                            *inbound,
                            handler_slot.take(),
                            room,
                            flush.clone(),
                        )));
                    }
                    received = subscription.recv(), if handler_slot.is_some() && unsettled_slot.is_some() && admitting.is_none() => match received {
                        Ok(Received::Delivery(inbound)) => {
                            let unsettled = unsettled_slot.take().expect("guarded");
                            admitting = Some(admit(&spec, inbound, unsettled));
                        }
                        Ok(Received::Undecodable { info, reason, payload }) => {
                            let reason = format!("not a readable AMQP message: {reason}");
                            let message_id = message::message_id_of(&payload);
                            match &spec.config.dead_letter {
                                // Settled like any other delivery: through
                                // this loop, once its dead letter is in.
                                Some(_) if spec.config.settle == Settle::AtLeastOnce => {
                                    tasks.spawn(dead_letter_unreadable(
                                        context.clone(),
                                        settler.clone(),
                                        info,
                                        payload,
                                        reason,
                                        unsettled_slot.take(),
                                    ));
                                }
                                _ => {
                                    let result = subscription.reject_undecodable(info, &reason, context.policy().rejected_requeues).await;
                                    refused(&context, message_id, reason, result.err().map(|e| e.to_string()));
                                }
                            }
                        }
                        Ok(Received::Oversized { size, max_size }) => {
                            refused(
                                &context,
                                None,
                                format!("{size} bytes is over the mount's max_message_size of {max_size}"),
                                None,
                            );
                        }
                        Err(e) => break Some(e),
                    },
                }
            }
        };
        // Slots taken ahead for the next delivery: the deliveries handled
        // while stopping need them.
        drop((handler_slot, unsettled_slot));
        let detach_budget = spec.grace / DETACH_SHARE;
        match &failure {
            None => {
                let deadline = Instant::now() + spec.grace - detach_budget;
                if spec.config.settle == Settle::AtMostOnce {
                    let handling = Handling {
                        context: &context,
                        settler: &settler,
                        flush: &flush,
                        handlers: &handlers,
                        unsettled: &unsettled,
                    };
                    take_the_rest(&mut subscription, &mut tasks, handling, admitting, deadline)
                        .await;
                }
                drain(
                    &subscription,
                    &mut inbox,
                    &mut tasks,
                    &flush,
                    deadline,
                    &spec.tags,
                )
                .await;
            }
            Some(_) => abandon(&mut tasks, &context),
        }
        // Detach the receiver and the senders together: the broker takes
        // back whatever is still unsettled.
        tokio::join!(
            subscription.close(detach_budget, spec.ends_subscription()),
            publisher_task.close()
        );
        drop(session);
        failure.map_or(Ok(()), Err)
    }
}

/// What starting a delivery's task takes.
struct Handling<'a> {
    context: &'a Arc<MountContext>,
    settler: &'a Settler,
    flush: &'a CancellationToken,
    handlers: &'a Arc<Semaphore>,
    unsettled: &'a Arc<Semaphore>,
}

/// How long the link must stay quiet, once its credit is withdrawn, before
/// no more deliveries the broker already sent are expected.
const QUIET: Duration = Duration::from_millis(200);

/// At most once, every delivery the broker sent was settled on arrival:
/// left in the link's buffer at a stop, it would be lost. So whatever
/// arrives until the link stays quiet for [`QUIET`] (or `deadline`) is
/// handled like any other delivery. (The link's credit is not withdrawn
/// first: fe2o3 would then refuse the transfers already on their way.)
async fn take_the_rest(
    subscription: &mut Subscription,
    tasks: &mut JoinSet<()>,
    handling: Handling<'_>,
    admitting: Option<Admitting>,
    deadline: Instant,
) {
    let tags = &handling.context.spec.tags;
    let start = async |tasks: &mut JoinSet<()>, inbound: Box<Inbound>, room: Room| {
        let slot =
            tokio::time::timeout_at(deadline, handling.handlers.clone().acquire_owned()).await;
        tasks.spawn(Box::pin(deliver::handle(
            handling.context.clone(),
            handling.settler.clone(),
            *inbound,
            slot.ok().and_then(Result::ok),
            room,
            handling.flush.clone(),
        )));
    };
    if let Some(admitting) = admitting
        && let Ok((inbound, room)) = tokio::time::timeout_at(deadline, admitting).await
    {
        start(tasks, inbound, room).await;
    }
    let mut taken = 0;
    loop {
        let quiet = (Instant::now() + QUIET).min(deadline);
        let Ok(Ok(unsettled)) =
            tokio::time::timeout_at(quiet, handling.unsettled.clone().acquire_owned()).await
        else {
            break;
        };
        match tokio::time::timeout_at(quiet, subscription.recv()).await {
            Ok(Ok(Received::Delivery(inbound))) => {
                let admitted = admit(&handling.context.spec, inbound, unsettled);
                let Ok((inbound, room)) = tokio::time::timeout_at(deadline, admitted).await else {
                    break;
                };
                start(tasks, inbound, room).await;
                taken += 1;
            }
            Ok(Ok(Received::Undecodable {
                reason, payload, ..
            })) => refused(
                handling.context,
                message::message_id_of(&payload),
                format!("not a readable AMQP message: {reason}"),
                None,
            ),
            Ok(Ok(Received::Oversized { size, max_size })) => refused(
                handling.context,
                None,
                format!("{size} bytes is over the mount's max_message_size of {max_size}"),
                None,
            ),
            Ok(Err(_)) | Err(_) => break,
        }
    }
    if taken > 0 {
        tracing::debug!(
            tenant = &*tags.tenant,
            mount = &*tags.mount,
            taken,
            "handled deliveries the broker had already sent (at most once) before stopping"
        );
    }
}

/// A delivery taken off the link, waiting for room for its bytes.
type Admitting = Pin<Box<dyn Future<Output = (Box<Inbound>, Room)> + Send>>;

fn admit(
    spec: &Arc<MountSpec>,
    inbound: Box<Inbound>,
    unsettled: OwnedSemaphorePermit,
) -> Admitting {
    let spec = spec.clone();
    Box::pin(async move {
        let tenant = spec.tenant.buffered().hold(inbound.size).await;
        let host = spec.host_buffered.hold(inbound.size).await;
        (inbound, Room::new(unsettled, tenant, host))
    })
}

/// The most settle requests answered with one batch of dispositions.
const SETTLE_BATCH: usize = 256;

/// Sends the disposition `first` asks for, and those of every other request
/// already waiting, grouped by kind: deliveries finishing together are
/// settled with a few frames rather than one each.
async fn answer(
    subscription: &Subscription,
    first: SettleRequest,
    inbox: &mut mpsc::UnboundedReceiver<SettleRequest>,
) {
    let mut requests = vec![first];
    while requests.len() < SETTLE_BATCH
        && let Ok(request) = inbox.try_recv()
    {
        requests.push(request);
    }
    for disposition in [
        Disposition::Accepted,
        Disposition::Rejected,
        Disposition::Modified,
        Disposition::Released,
    ] {
        let (these, others): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .partition(|r| r.disposition == disposition);
        requests = others;
        if these.is_empty() {
            continue;
        }
        let infos = these.iter().map(|r| r.info.clone()).collect();
        let result = subscription
            .settle_all(infos, disposition)
            .await
            .map_err(|e| e.to_string());
        for request in these {
            let _ = request.done.send(result.clone());
        }
    }
}

/// Lets in-flight deliveries finish and be settled until `deadline`; waiting
/// copies are published at once. What is left then stays unsettled.
async fn drain(
    subscription: &Subscription,
    inbox: &mut mpsc::UnboundedReceiver<SettleRequest>,
    tasks: &mut JoinSet<()>,
    flush: &CancellationToken,
    deadline: Instant,
    tags: &LogTags,
) {
    flush.cancel();
    let expired = tokio::time::sleep_until(deadline);
    tokio::pin!(expired);
    while !tasks.is_empty() {
        tokio::select! {
            biased;
            Some(request) = inbox.recv() => answer(subscription, request, inbox).await,
            Some(joined) = tasks.join_next() => report_panic(joined, tags),
            () = &mut expired => {
                tracing::warn!(
                    tenant = &*tags.tenant,
                    mount = &*tags.mount,
                    unfinished = tasks.len(),
                    "shutdown grace period over; unfinished deliveries are left to the broker"
                );
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
    }
    while let Ok(request) = inbox.try_recv() {
        answer(subscription, request, inbox).await;
    }
}

/// The link died: nothing in flight can be settled any more. The broker
/// redelivers those deliveries; count them.
fn abandon(tasks: &mut JoinSet<()>, context: &MountContext) {
    let abandoned = tasks.len();
    tasks.abort_all();
    if abandoned > 0 {
        let tags = &context.spec.tags;
        context.spec.metrics.abandoned(abandoned as u64);
        tracing::warn!(
            tenant = &*tags.tenant,
            mount = &*tags.mount,
            abandoned,
            "link lost with deliveries in flight; the broker redelivers them"
        );
    }
}

/// Publishes an unreadable delivery to the mount's dead-letter address,
/// then settles it.
async fn dead_letter_unreadable(
    context: Arc<MountContext>,
    settler: Settler,
    info: DeliveryInfo,
    payload: Bytes,
    reason: String,
    unsettled: Option<OwnedSemaphorePermit>,
) {
    let address = context
        .spec
        .config
        .dead_letter
        .as_deref()
        .expect("spawned only for mounts with a dead-letter address");
    let message_id = message::message_id_of(&payload);
    let result =
        settle::dead_letter_unreadable(&context, &settler, info, payload, &reason, address).await;
    refused(&context, message_id, reason, result.err());
    drop(unsettled);
}

/// What a host log line takes beside its message: time, level, target,
/// tenant, mount and ids, about.
const LINE_OVERHEAD: usize = 160;

/// A delivery the host settled without running the handler.
fn refused(
    context: &MountContext,
    message_id: Option<String>,
    reason: String,
    error: Option<String>,
) {
    let tags = &context.spec.tags;
    context.spec.metrics.refused();
    let line = reason.len() + error.as_ref().map_or(0, String::len) + LINE_OVERHEAD;
    if !context.spec.tenant.may_tell(line) {
        tracing::debug!(
            tenant = &*tags.tenant,
            mount = &*tags.mount,
            message_id,
            "delivery rejected without running the handler (over the tenant's log_rate): {reason}"
        );
    } else {
        match &error {
            None => tracing::warn!(
                tenant = &*tags.tenant,
                mount = &*tags.mount,
                message_id,
                "delivery rejected without running the handler: {reason}"
            ),
            Some(e) => tracing::error!(
                tenant = &*tags.tenant,
                mount = &*tags.mount,
                message_id,
                "delivery could not be rejected ({e}): {reason}"
            ),
        }
    }
    let _ = context.spec.events.send(Event::Refused {
        tenant: tags.tenant.clone(),
        mount: tags.mount.clone(),
        message_id,
        reason,
    });
}

/// A delivery task that panicked is a bug in the host, not in the handler:
/// its delivery stays unsettled and returns to the broker when the link
/// detaches.
fn report_panic(joined: Result<(), tokio::task::JoinError>, tags: &LogTags) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(
            tenant = &*tags.tenant,
            mount = &*tags.mount,
            "delivery task panicked; the delivery is left to the broker: {e}"
        );
    }
}
