//! One mount at work: take deliveries off its link, run the handler on each,
//! carry out the settlement plan, and stop without losing anything.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fe2o3_amqp::link::delivery::DeliveryInfo;
use tokio::sync::{OwnedSemaphorePermit, broadcast, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::budget::TenantLimits;
use super::delayed::DelayedCopies;
use crate::admin::MountMetrics;
use crate::broker::message::{self, AmqpMessage, DeliveryContext};
use crate::broker::{
    BrokerConnection, BrokerError, Inbound, Publisher, PublisherTask, Subscription,
};
use crate::config::{Mount, Node, Settle};
use crate::events::{Event, Handled};
use crate::sandbox::{self, CallLimits, Instances, LogTags, MemoryHeld, Module, Reserved};
use crate::settlement::{self, Disposition, Outcome, Plan, Policy, Publish};

/// How often kept instances are checked for being idle too long.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// The module a mount runs, swapped whole when its file changes: deliveries
/// already running finish on the instances they started with.
pub(crate) struct ModuleSlot {
    current: RwLock<Arc<Instances>>,
}

impl ModuleSlot {
    pub(crate) fn new(instances: Arc<Instances>) -> ModuleSlot {
        ModuleSlot {
            current: RwLock::new(instances),
        }
    }

    /// The instances new deliveries use.
    pub(crate) fn current(&self) -> Arc<Instances> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Makes `instances` the ones new deliveries use.
    pub(crate) fn replace(&self, instances: Arc<Instances>) {
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = instances;
    }
}

/// What a mount runs its module with; a reloaded module gets the same.
pub(crate) fn instances_for(
    mount: &Mount,
    module: Module,
    tags: &Arc<LogTags>,
    tenant: &TenantLimits,
) -> Arc<Instances> {
    let limits = CallLimits {
        timeout: mount.timeout,
        memory: mount.memory,
    };
    Arc::new(Instances::new(
        module,
        limits,
        mount.instance,
        mount.grants.clone(),
        tags.clone(),
        tenant.memory(),
        tenant.lane(),
    ))
}

/// Everything a mount's handler tasks share.
struct MountContext {
    tags: Arc<LogTags>,
    config: Mount,
    module: Arc<ModuleSlot>,
    tenant: Arc<TenantLimits>,
    policy: Policy,
    publisher: Publisher,
    delayed: DelayedCopies,
    events: broadcast::Sender<Event>,
    metrics: MountMetrics,
    /// Whether an at-most-once outcome that cannot act has been logged at
    /// warn level yet; later ones go to debug.
    unsupported_warned: AtomicBool,
}

/// A mount whose links are attached, ready to run.
pub(crate) struct AttachedMount {
    context: Arc<MountContext>,
    subscription: Subscription,
    publisher_task: PublisherTask,
}

impl AttachedMount {
    /// Attaches the mount's receiver, and a sender for its own address and
    /// its dead-letter address, each link set on a session of its own.
    pub(crate) async fn attach(
        connection: &mut BrokerConnection,
        tags: Arc<LogTags>,
        mount: &Mount,
        module: Arc<ModuleSlot>,
        tenant: Arc<TenantLimits>,
        events: &broadcast::Sender<Event>,
        metrics: MountMetrics,
    ) -> Result<AttachedMount, BrokerError> {
        let link_name = format!("wharf/{}/{}", tags.tenant, tags.mount);
        let capability = mount.node.map(Node::capability);
        let subscription = Subscription::attach(
            connection,
            &link_name,
            &mount.address,
            capability,
            mount.settle,
            mount.credit,
        )
        .await?;
        // Copies go to the subscription's own node; a dead-letter address is
        // a queue whenever the mount says what its nodes are.
        let mut targets = vec![(mount.address.as_str(), capability)];
        if let Some(dead_letter) = &mount.dead_letter {
            targets.push((dead_letter, mount.node.map(|_| Node::Queue.capability())));
        }
        let (publisher, publisher_task) = Publisher::open(connection, &link_name, &targets).await?;
        let modified_supported = subscription.modified_supported();
        tracing::info!(
            tenant = &*tags.tenant,
            mount = &*tags.mount,
            address = mount.address,
            settle = %mount.settle,
            retry_path = if modified_supported {
                "modified"
            } else {
                "copy (the broker does not offer `modified`)"
            },
            "mount attached"
        );
        let policy = Policy {
            settle: mount.settle,
            max_attempts: mount.max_attempts,
            dead_letter: mount.dead_letter.is_some(),
            modified_supported,
        };
        let delayed = DelayedCopies::new(
            publisher.clone(),
            mount.address.clone(),
            tags.clone(),
            events.clone(),
            metrics.clone(),
        );
        let _ = events.send(Event::MountReady {
            tenant: tags.tenant.clone(),
            mount: tags.mount.clone(),
            modified_supported,
        });
        let context = MountContext {
            tags,
            config: mount.clone(),
            module,
            tenant,
            policy,
            publisher,
            delayed,
            events: events.clone(),
            metrics,
            unsupported_warned: AtomicBool::new(false),
        };
        Ok(AttachedMount {
            context: Arc::new(context),
            subscription,
            publisher_task,
        })
    }

    /// Whose mount this is.
    pub(crate) fn tags(&self) -> &Arc<LogTags> {
        &self.context.tags
    }

    /// Runs the mount until `stop` is cancelled or its link fails, then
    /// drains: in-flight handlers get `grace` to finish and be settled,
    /// delayed copies are published early, links are closed.
    pub(crate) async fn run(
        self,
        stop: CancellationToken,
        grace: Duration,
    ) -> Result<(), BrokerError> {
        let AttachedMount {
            context,
            mut subscription,
            publisher_task,
        } = self;
        let (requests, mut inbox) = mpsc::unbounded_channel();
        let settler = Settler(requests);
        let mut handlers = JoinSet::new();
        let concurrency = context.config.concurrency as usize;
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        // At most `concurrency` deliveries are taken off the link at once;
        // each then waits for room in its tenant's budgets. While they wait
        // the link's credit is not renewed, so the broker holds back.
        let failure = loop {
            tokio::select! {
                biased;
                Some(request) = inbox.recv() => answer(&subscription, request).await,
                Some(joined) = handlers.join_next(), if !handlers.is_empty() => {
                    report_panic(joined, &context.tags);
                }
                () = stop.cancelled() => break None,
                _ = prune.tick() => context.module.current().prune_idle(),
                inbound = subscription.recv(), if handlers.len() < concurrency => match inbound {
                    Ok(inbound) => {
                        let context = context.clone();
                        let settler = settler.clone();
                        handlers.spawn(handle(context, settler, inbound));
                    }
                    Err(e) => break Some(e),
                },
            }
        };
        drain(
            &subscription,
            &mut inbox,
            &mut handlers,
            grace,
            &context.tags,
        )
        .await;
        subscription.close().await;
        let pending = context.delayed.pending();
        if pending > 0 {
            tracing::info!(
                tenant = &*context.tags.tenant,
                mount = &*context.tags.mount,
                pending,
                "publishing delayed copies early"
            );
        }
        context.delayed.flush().await;
        publisher_task.close().await;
        failure.map_or(Ok(()), Err)
    }
}

/// A disposition a handler task asks the receive loop to send; only the
/// loop owns the receiver.
struct SettleRequest {
    info: DeliveryInfo,
    disposition: Disposition,
    done: oneshot::Sender<Result<(), BrokerError>>,
}

#[derive(Clone)]
struct Settler(mpsc::UnboundedSender<SettleRequest>);

impl Settler {
    async fn settle(&self, info: DeliveryInfo, disposition: Disposition) -> Result<(), String> {
        let (done, answer) = oneshot::channel();
        let request = SettleRequest {
            info,
            disposition,
            done,
        };
        let stopped = || "the mount stopped before the disposition was sent".to_owned();
        self.0.send(request).map_err(|_| stopped())?;
        answer
            .await
            .map_err(|_| stopped())?
            .map_err(|e| e.to_string())
    }
}

async fn answer(subscription: &Subscription, request: SettleRequest) {
    let result = subscription.settle(request.info, request.disposition).await;
    let _ = request.done.send(result);
}

async fn drain(
    subscription: &Subscription,
    inbox: &mut mpsc::UnboundedReceiver<SettleRequest>,
    handlers: &mut JoinSet<()>,
    grace: Duration,
    tags: &LogTags,
) {
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    while !handlers.is_empty() {
        tokio::select! {
            biased;
            Some(request) = inbox.recv() => answer(subscription, request).await,
            Some(joined) = handlers.join_next() => report_panic(joined, tags),
            () = &mut deadline => {
                tracing::warn!(
                    tenant = &*tags.tenant,
                    mount = &*tags.mount,
                    unfinished = handlers.len(),
                    "shutdown grace period over; unfinished deliveries are left to the broker"
                );
                handlers.abort_all();
                while handlers.join_next().await.is_some() {}
            }
        }
    }
    while let Ok(request) = inbox.try_recv() {
        answer(subscription, request).await;
    }
}

/// A handler task that panicked is a bug in the host, not in the handler: its
/// delivery stays unsettled and returns to the broker when the link detaches.
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

/// Runs the handler on one delivery and carries out the plan for its outcome.
async fn handle(context: Arc<MountContext>, settler: Settler, inbound: Inbound) {
    // Room in the tenant's budgets first, then an instance of the module
    // current at that moment (it may be replaced while this one waits).
    let mut admission = context.tenant.admit().await;
    let instance = context.module.current().reserve().await;
    let module_version = instance.instances().module().version().clone();
    let Inbound { info, message } = inbound;
    let counters = message::counters(&message);
    let attempt = counters.attempt();
    let message_id = message::message_id(&message);
    let span = tracing::info_span!(
        "handle",
        messaging.system = "amqp",
        messaging.operation = "process",
        messaging.destination.name = context.config.address,
        messaging.message.id = message_id,
        tenant = &*context.tags.tenant,
        mount = &*context.tags.mount,
        attempt,
    );
    async move {
        let _ = context.events.send(Event::Started {
            tenant: context.tags.tenant.clone(),
            mount: context.tags.mount.clone(),
            message_id: message_id.clone(),
            attempt,
        });
        let started = Instant::now();
        // The tenant's budget stays held until the delivery is settled.
        let (outcome, failure, _memory) = run_handler(&context, instance, &message, attempt).await;
        let took = started.elapsed();
        let plan = settlement::plan(&context.policy, &counters, outcome);
        if plan.unsupported {
            log_unsupported(&context, outcome);
        }
        let copy_slot = admission.copy_slot.take();
        let (disposition, error) =
            carry_out(&context, &settler, info, &message, &plan, copy_slot).await;
        context.metrics.handled(outcome, disposition, took);
        match &error {
            Some(error) => tracing::error!(?outcome, ?disposition, error, "settlement incomplete"),
            None => tracing::debug!(?outcome, ?disposition, publish = ?plan.publish, "handled"),
        }
        let _ = context.events.send(Event::Handled(Handled {
            tenant: context.tags.tenant.clone(),
            mount: context.tags.mount.clone(),
            message_id,
            attempt,
            counters,
            module_version,
            outcome,
            failure,
            plan,
            disposition,
            error,
        }));
        drop(admission);
    }
    .instrument(span)
    .await
}

async fn run_handler(
    context: &MountContext,
    instance: Reserved,
    message: &AmqpMessage,
    attempt: u32,
) -> (Outcome, Option<String>, MemoryHeld) {
    let delivery = message::to_delivery(
        message,
        DeliveryContext {
            address: &context.config.address,
            tenant: &context.tags.tenant,
            mount: &context.tags.mount,
            attempt,
            presettled: context.config.settle == Settle::AtMostOnce,
        },
    );
    let instances = instance.instances().clone();
    let module = instances.module();
    let (result, memory) = instance.call(&delivery).await;
    context
        .metrics
        .output_dropped(instances.take_output_dropped());
    match result {
        Ok(outcome) => (
            outcome_of(outcome, context.config.max_retry_delay),
            None,
            memory,
        ),
        Err(failure) => {
            tracing::warn!(
                kind = failure.kind(),
                module = %module.path().display(),
                version = &**module.version(),
                "handler failed, treating it as retry: {failure}"
            );
            context.metrics.failed(failure.kind());
            (Outcome::Retry, Some(failure.to_string()), memory)
        }
    }
}

fn outcome_of(outcome: sandbox::Outcome, max_delay: Duration) -> Outcome {
    match outcome {
        sandbox::Outcome::Ack => Outcome::Ack,
        sandbox::Outcome::Retry => Outcome::Retry,
        sandbox::Outcome::Drop => Outcome::Drop,
        sandbox::Outcome::RetryAfter(ms) => {
            let asked = Duration::from_millis(ms);
            if asked > max_delay {
                tracing::warn!(
                    ?asked,
                    ?max_delay,
                    "retry-after delay shortened to the mount's max_retry_delay"
                );
            }
            Outcome::RetryAfter(asked.min(max_delay))
        }
    }
}

/// Sends the plan's dispositions and publishes in order. Returns the
/// disposition that was sent last and the first thing that went wrong.
async fn carry_out(
    context: &MountContext,
    settler: &Settler,
    info: DeliveryInfo,
    message: &AmqpMessage,
    plan: &Plan,
    copy_slot: Option<OwnedSemaphorePermit>,
) -> (Option<Disposition>, Option<String>) {
    if let Some(disposition) = plan.settle_now
        && let Err(e) = settler.settle(info.clone(), disposition).await
    {
        return (None, Some(e));
    }
    let sent = plan.settle_now;
    let (publish, address) = match plan.publish {
        None => return (sent, None),
        Some(Publish::Copy { retry_count, delay }) if plan.settle_after_publish.is_none() => {
            context.delayed.schedule(
                message::copy(message, retry_count),
                retry_count,
                delay,
                copy_slot,
            );
            return (sent, None);
        }
        Some(Publish::Copy { retry_count, .. }) => (
            message::copy(message, retry_count),
            context.config.address.as_str(),
        ),
        Some(Publish::DeadLetter) => (
            message.clone(),
            context
                .config
                .dead_letter
                .as_deref()
                .expect("plans only dead-letter when the mount declares an address"),
        ),
    };
    let published = context.publisher.publish(address, publish).await;
    match (&published, plan.publish) {
        (Ok(()), Some(Publish::DeadLetter)) => context.metrics.dead_lettered(),
        (_, Some(Publish::Copy { .. })) => context.metrics.copy_published(published.is_ok()),
        _ => {}
    }
    let (then, publish_error) = match published {
        Ok(()) => (plan.settle_after_publish, None),
        Err(e) => (plan.on_publish_failure, Some(e.to_string())),
    };
    let Some(disposition) = then else {
        return (sent, publish_error);
    };
    match settler.settle(info, disposition).await {
        Ok(()) => (Some(disposition), publish_error),
        Err(e) => (sent, Some(publish_error.unwrap_or(e))),
    }
}

fn log_unsupported(context: &MountContext, outcome: Outcome) {
    let first = !context.unsupported_warned.swap(true, Ordering::Relaxed);
    let note =
        "AckError::Unsupported: the mount is at-most-once, the delivery was settled on receipt";
    if first {
        tracing::warn!(
            ?outcome,
            "{note} (logged once per mount; later ones at debug level)"
        );
    } else {
        tracing::debug!(?outcome, "{note}");
    }
}
